"""REPLAY: run the same MODEL and DECIDE over recorded topics and compare with what was published."""

from fleetloop.daemon.replay.replay import RecordedTick, ReplayReport, replay_ticks

__all__ = ["RecordedTick", "ReplayReport", "replay_ticks"]
