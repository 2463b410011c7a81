"""The wire contract: every record fleetloop reads or writes, and the topics they travel on.

Pydantic v2 models, frozen, ``extra="forbid"``, units in field names, event time (``ts_ms``, epoch
milliseconds stamped by the producer) in every record. JSON on the wire; the JSON Schema of each
model is exported to ``schemas/json/`` by :mod:`fleetloop.schemas.export`.
"""

from fleetloop.schemas.control import Tick
from fleetloop.schemas.decisions import (
    AdmissionDecision,
    AutoscaleDecision,
    BatchingDecision,
    BreakerDecision,
    Decision,
    DecisionBody,
    PolicyStamp,
    RetryBudgetDecision,
    RoutingDecision,
)
from fleetloop.schemas.policy import PolicyDocument
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.telemetry import NodeTelemetry
from fleetloop.schemas.topics import TOPICS, TopicSpec, topic_name

__all__ = [
    "TOPICS",
    "AdmissionDecision",
    "AutoscaleDecision",
    "BatchingDecision",
    "BreakerDecision",
    "Decision",
    "DecisionBody",
    "NodeTelemetry",
    "PolicyDocument",
    "PolicyStamp",
    "RequestOutcome",
    "RetryBudgetDecision",
    "RoutingDecision",
    "Tick",
    "TopicSpec",
    "topic_name",
]
