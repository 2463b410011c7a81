"""The topic registry: every topic fleetloop uses, in one place (docs/operations.md, "Topics")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from fleetloop.schemas.control import ActivePolicy, Tick
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.policy import PolicyDocument
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.summary import ShardSummary
from fleetloop.schemas.telemetry import NodeTelemetry

Cleanup = Literal["delete", "compact"]


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic: logical name, what its key is, the model of its value, cleanup and partitions."""

    logical: str
    key: str
    value: type[BaseModel] | None
    cleanup: Cleanup
    partitions: int
    producer: str
    consumer: str


TELEMETRY = "fleet.telemetry"
REQUESTS = "fleet.requests"
TICKS = "control.ticks"
POLICY = "control.policy"
DECISIONS = "control.decisions"
STATE = "control.state"
DEADLETTER = "fleet.deadletter"
CHECKPOINT = "control.checkpoint"
POLICY_ACTIVE = "control.policy.active"
SUMMARIES = "control.summaries"
SHADOW = "control.shadow"

TOPICS: dict[str, TopicSpec] = {
    spec.logical: spec
    for spec in (
        TopicSpec(TELEMETRY, "pool id", NodeTelemetry, "delete", 4, "serving nodes", "fleetloop"),
        TopicSpec(REQUESTS, "pool id", RequestOutcome, "delete", 4, "routers", "fleetloop"),
        TopicSpec(TICKS, "pool id", Tick, "delete", 4, "fleetloop ticker", "fleetloop"),
        TopicSpec(POLICY, "policy name", PolicyDocument, "compact", 1, "fleetloop policy apply", "fleetloop"),
        TopicSpec(DECISIONS, "entity", Decision, "delete", 1, "fleetloop", "audit, replay"),
        TopicSpec(STATE, "entity", Decision, "compact", 1, "fleetloop", "routers, GPU workers"),
        TopicSpec(SHADOW, "entity", Decision, "delete", 1, "fleetloop", "fleetloop policy compare"),
        TopicSpec(DEADLETTER, "original key", None, "delete", 1, "fleetloop", "operators"),
        TopicSpec(
            POLICY_ACTIVE, "consumer group", ActivePolicy, "compact", 1, "fleetloop", "fleetloop policy"
        ),
        TopicSpec(
            CHECKPOINT, "group/partition/slot/chunk", None, "compact", 1, "fleetloop", "fleetloop (restore)"
        ),
        TopicSpec(SUMMARIES, "group/partition", ShardSummary, "delete", 1, "fleetloop", "fleetloop rollup"),
    )
}

# The topics the daemon's observe stage consumes, partitioned by pool: one instance owns whole pools.
POOL_KEYED_INPUTS: tuple[str, ...] = (TELEMETRY, REQUESTS, TICKS)


def topic_name(prefix: str, logical: str) -> str:
    """The physical topic name: ``<prefix>.<logical>`` (or just ``logical`` without a prefix)."""
    if logical not in TOPICS:
        raise KeyError(f"unknown topic {logical!r}; known: {', '.join(sorted(TOPICS))}")
    return f"{prefix}.{logical}" if prefix else logical
