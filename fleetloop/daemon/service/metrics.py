"""The daemon's metrics, as OpenTelemetry instruments (served as Prometheus text on ``/metrics``).

Counters and the tick histogram are recorded where things happen; gauges (consumer lag, model
sizes, policy in force, broker connection, readiness) are observed at collection time from every
live :class:`MetricSource` (normally the one daemon of the process). Label values are bounded:
topics are logical names, dead-letter reasons are the error kind (the text before the first
colon), decision reasons are the policies' kebab-case codes. No label ever carries a setting,
a bootstrap address or a credential.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Protocol

from opentelemetry.metrics import CallbackOptions, Observation

from fleetloop.daemon.observability import logs_dropped, logs_suppressed, meter


class MetricSource(Protocol):
    def lag(self) -> dict[tuple[str, int], int]:
        """Records behind the partition's end, per (logical topic, partition) owned."""
        ...

    def model_sizes(self) -> dict[str, int]:
        """``pools``, ``nodes``, ``open_workflows``."""
        ...

    def policy_in_force(self) -> tuple[str, int, str]:
        """(name, version, hash)."""
        ...

    def broker_connected(self) -> bool: ...

    def is_ready(self) -> bool: ...

    def stability(self) -> dict[str, float]:
        """``loop_stall_max_ms``, ``gc_pause_max_ms``, ``assignments`` (since the start)."""
        ...


_sources: weakref.WeakSet[MetricSource] = weakref.WeakSet()


def register(source: MetricSource) -> None:
    _sources.add(source)


def unregister(source: MetricSource) -> None:
    _sources.discard(source)


def reason_kind(reason: str) -> str:
    """A dead letter's reason as a bounded label: the error kind before the first colon."""
    head = reason.split(":", 1)[0].strip()
    return head[:48] if head and " " not in head else "other"


events_consumed = meter.create_counter(
    "fleetloop.events_consumed", unit="1", description="records consumed, per logical topic"
)
dead_letters = meter.create_counter(
    "fleetloop.dead_letters", unit="1", description="records sent to the dead-letter topic, per reason kind"
)
decisions = meter.create_counter(
    "fleetloop.decisions", unit="1", description="decisions published, per kind and reason code"
)
ticks = meter.create_counter(
    "fleetloop.ticks",
    unit="1",
    description="ticks by outcome: decided, forced (held past max_tick_hold_s), skipped (no data or "
    "warm-up history), missed (the ticker could not publish a tick boundary)",
)
tick_duration = meter.create_histogram(
    "fleetloop.tick.duration",
    unit="s",
    description="time to decide one tick (snapshot + policies)",
    explicit_bucket_boundaries_advisory=[
        0.0005,
        0.001,
        0.0025,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1.0,
        2.5,
        5.0,
    ],
)
broker_errors = meter.create_counter(
    "fleetloop.broker_errors",
    unit="1",
    description="Kafka operations that failed and were retried, per operation",
)


def _lag(_: CallbackOptions) -> Iterable[Observation]:
    for src in list(_sources):
        for (topic, partition), lag in sorted(src.lag().items()):
            yield Observation(lag, {"topic": topic, "partition": str(partition)})


def _sizes(what: str):  # type: ignore[no-untyped-def]
    def cb(_: CallbackOptions) -> Iterable[Observation]:
        for src in list(_sources):
            yield Observation(src.model_sizes().get(what, 0))

    return cb


def _policy(_: CallbackOptions) -> Iterable[Observation]:
    for src in list(_sources):
        name, version, digest = src.policy_in_force()
        yield Observation(1, {"name": name, "version": str(version), "hash": digest})


def _connected(_: CallbackOptions) -> Iterable[Observation]:
    for src in list(_sources):
        yield Observation(1 if src.broker_connected() else 0)


def _ready(_: CallbackOptions) -> Iterable[Observation]:
    for src in list(_sources):
        yield Observation(1 if src.is_ready() else 0)


def _stability(what: str):  # type: ignore[no-untyped-def]
    def cb(_: CallbackOptions) -> Iterable[Observation]:
        for src in list(_sources):
            yield Observation(src.stability().get(what, 0))

    return cb


def _dropped(_: CallbackOptions) -> Iterable[Observation]:
    yield Observation(logs_dropped())


def _suppressed(_: CallbackOptions) -> Iterable[Observation]:
    yield Observation(logs_suppressed())


meter.create_observable_gauge(
    "fleetloop.consumer.lag", [_lag], unit="1", description="records behind the end, per owned partition"
)
meter.create_observable_gauge(
    "fleetloop.model.pools", [_sizes("pools")], unit="1", description="pools in the model"
)
meter.create_observable_gauge(
    "fleetloop.model.nodes", [_sizes("nodes")], unit="1", description="nodes in the model"
)
meter.create_observable_gauge(
    "fleetloop.model.open_workflows",
    [_sizes("open_workflows")],
    unit="1",
    description="agent workflows open in the ledger",
)
meter.create_observable_gauge(
    "fleetloop.policy.info",
    [_policy],
    unit="1",
    description="the policy in force (1, labelled name/version/hash)",
)
meter.create_observable_gauge(
    "fleetloop.broker.connected", [_connected], unit="1", description="1 when the broker answers metadata"
)
meter.create_observable_gauge("fleetloop.ready", [_ready], unit="1", description="1 when /readyz answers 200")
meter.create_observable_gauge(
    "fleetloop.loop.stall_max",
    [_stability("loop_stall_max_ms")],
    unit="ms",
    description="the longest the event loop went without running a callback it had due, since the start",
)
meter.create_observable_gauge(
    "fleetloop.gc.pause_max",
    [_stability("gc_pause_max_ms")],
    unit="ms",
    description="the longest cyclic garbage-collector pause, since the start",
)
meter.create_observable_counter(
    "fleetloop.group.assignments",
    [_stability("assignments")],
    unit="1",
    description="partition assignments from the consumer group: the first, then one per rebalance",
)
meter.create_observable_counter(
    "fleetloop.log.lines_dropped", [_dropped], unit="1", description="log lines dropped (slow stderr reader)"
)
meter.create_observable_counter(
    "fleetloop.log.lines_suppressed",
    [_suppressed],
    unit="1",
    description="repeated log lines folded into counts",
)
