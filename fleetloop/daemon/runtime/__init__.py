"""The daemon's runtime: the control loop over Kafka, as parts wired together by :class:`Daemon`.

What each part does, and the rules it keeps, is its module's docstring:

- :mod:`.daemon`: the loop, and the wiring of the parts (the only module that knows them all);
- :mod:`.partition`: one record per owned partition (its shard and what is kept about it);
- :mod:`.assignment`: assignment and restore, the emptied-broker check;
- :mod:`.intake`: reading a batch into the shards;
- :mod:`.decider`: deciding the ticks that are ready;
- :mod:`.ticker`: the ticker, its catch-up and overload rules;
- :mod:`.follower`: the policy and shadow follower;
- :mod:`.checkpoints`: checkpointing and commits;
- :mod:`.deadletters`: dead letters, published once;
- :mod:`.summaries`: the shard summaries for the fleet-wide stage;
- :mod:`.telemetry`: stats, loop times and the trip trace;
- :mod:`.config`: the settings; :mod:`.link`: retries and the broker's health;
- :mod:`.port`: the broker, clock and offload ports; :mod:`.kafka`: the broker port's adapter.

Why it is built so: ``docs/decisions/runtime.md``.
"""

from fleetloop.daemon.runtime.config import CUT_HEADER, SKIPPED_FROM_HEADER, SKIPPED_HEADER, DaemonConfig
from fleetloop.daemon.runtime.daemon import Daemon, OnDecisions
from fleetloop.daemon.runtime.kafka import read_active
from fleetloop.daemon.runtime.telemetry import (
    LOOP_REPORT_S,
    TRACE_BOUNDARIES,
    DaemonStats,
    LoopTimes,
    TripTrace,
    tune_gc,
)
from fleetloop.daemon.runtime.ticker import overload_step

__all__ = [
    "CUT_HEADER",
    "LOOP_REPORT_S",
    "SKIPPED_FROM_HEADER",
    "SKIPPED_HEADER",
    "TRACE_BOUNDARIES",
    "Daemon",
    "DaemonConfig",
    "DaemonStats",
    "LoopTimes",
    "OnDecisions",
    "TripTrace",
    "overload_step",
    "read_active",
    "tune_gc",
]
