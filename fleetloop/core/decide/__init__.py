"""DECIDE: run the policy's algorithms on a tick and apply the safety envelope (pure)."""

from fleetloop.core.decide.engine import Engine, EngineState, TickResult, decide

__all__ = ["Engine", "EngineState", "TickResult", "decide"]
