"""The daemon's runtime (split into parts; see each module's docstring)."""

from fleetloop.daemon.runtime.config import CUT_HEADER, SKIPPED_FROM_HEADER, SKIPPED_HEADER, DaemonConfig
from fleetloop.daemon.runtime.daemon import Daemon, OnDecisions, overload_step
from fleetloop.daemon.runtime.kafka import read_active
from fleetloop.daemon.runtime.telemetry import (
    LOOP_REPORT_S,
    TRACE_BOUNDARIES,
    DaemonStats,
    LoopTimes,
    TripTrace,
    tune_gc,
)

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
