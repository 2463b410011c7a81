"""Whether the registry topics exist with the layout fleetloop relies on, checked creating nothing.

A top-level module (aiokafka, the topic registry and Kafka security only), so the daemon's commands,
the edges (``scrape``, ``fleet``, the actuators) and the router library's publisher share one set of
rules (:func:`layout_problems`) and one check (:func:`require_topics`) without importing each other.

Nothing here names a topic in a Metadata request: aiokafka 0.14 sends
``allow_auto_topic_creation=True`` on every Metadata request that names topics (its
``MetadataRequest.build`` defaults it, and neither the clients nor ``describe_topics`` let a caller
turn it off), so a broker that auto-creates topics (Tansu always, Apache Kafka unless
``auto.create.topics.enable=false``) would create a missing one with its default partition count
(4 on Tansu). A request for *all* topics (``describe_topics()`` without names, ``list_topics()``)
creates nothing, so existence and partition counts are read from that (:func:`topic_partitions`).
A producer's first send names its topic, so whatever produces checks its topics once before that.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from fleetloop.kafka_security import Bootstrap, connect
from fleetloop.schemas.topics import POOL_KEYED_INPUTS, TOPICS, topic_name


class TopicLayoutError(RuntimeError):
    """Registry topics missing, or laid out otherwise than fleetloop relies on: ``str()`` is one line
    without the command's name (the caller adds it)."""


class TopicMissingError(TopicLayoutError):
    """A registry topic the broker does not list (:func:`missing_topic` says why, in words)."""


def layout_problems(
    prefix: str, partitions: Mapping[str, int], cleanup: Mapping[str, str] | None = None
) -> list[str]:
    """What is wrong with the existing registry topics under ``prefix`` (one phrase each; pure).

    ``partitions``: physical topic name -> partition count (topics not under ``prefix`` and
    missing ones are ignored); ``cleanup``: physical name -> ``cleanup.policy`` where known.

    - A topic the registry gives one partition must have exactly one: its readers read partition 0
      only (control.policy, control.policy.active, control.checkpoint, control.summaries,
      fleet.deadletter, and the state/decision topics the demo, the emulated fleet and replay read),
      so a record keyed onto another partition is never seen.
    - The pool-keyed inputs (fleet.telemetry, fleet.requests, control.ticks) may have any number of
      partitions (more spread pools over more daemons, docs/performance.md, "Sizing"), but the same
      number: the daemon decides a pool's tick from the shard of one partition index across the
      three, so a pool's ticks and its records must hash to the same index.
    - A topic the registry compacts must be compacted (it holds the latest record per key: a policy,
      the active policy, a checkpoint, desired state); one it does not must not be (compaction
      would drop the audit and replay history). An absent ``cleanup.policy`` is Kafka's default,
      ``delete``.
    """
    problems: list[str] = []
    have = {
        logical: partitions[name]
        for logical in sorted(TOPICS)
        if (name := topic_name(prefix, logical)) in partitions
    }
    for logical, count in have.items():
        spec = TOPICS[logical]
        if logical not in POOL_KEYED_INPUTS and count != spec.partitions:
            problems.append(
                f"topic {topic_name(prefix, logical)} has {count} partitions, "
                f"fleetloop needs {spec.partitions}"
            )
    pooled = {logical: have[logical] for logical in POOL_KEYED_INPUTS if logical in have}
    if len(set(pooled.values())) > 1:
        shown_counts = ", ".join(f"{topic_name(prefix, lg)} {n}" for lg, n in sorted(pooled.items()))
        problems.append(f"the pool-keyed topics need one partition count, they have {shown_counts}")
    for logical in have:
        name = topic_name(prefix, logical)
        if cleanup is None or name not in cleanup:
            continue
        policies = {p.strip() for p in (cleanup[name] or "delete").split(",")}
        compacted = "compact" in policies
        if compacted != (TOPICS[logical].cleanup == "compact"):
            problems.append(
                f"topic {name} has cleanup.policy {cleanup[name] or 'delete'}, fleetloop needs "
                f"{TOPICS[logical].cleanup}"
            )
    return problems


@contextlib.asynccontextmanager
async def admin_client(bootstrap_servers: Bootstrap, *, timeout_ms: int = 15_000) -> AsyncIterator[Any]:
    """A started admin client, closed on the way out."""
    admin = AIOKafkaAdminClient(**connect(bootstrap_servers), request_timeout_ms=timeout_ms)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def topic_partitions(bootstrap_servers: Bootstrap) -> dict[str, int]:
    """Every topic the broker has -> its partition count, from one all-topics Metadata request
    (which, unlike a request naming topics, auto-creates nothing)."""
    async with admin_client(bootstrap_servers) as admin:
        return await partition_counts(admin)


async def partition_counts(admin: Any) -> dict[str, int]:
    """Every topic ``admin`` lists -> its partition count (one all-topics request: creates none)."""
    described = await admin.describe_topics()  # no names: all topics, nothing auto-created
    return {str(t["topic"]): len(t["partitions"]) for t in described if t["error_code"] == 0}


async def cleanup_policies(admin: Any, topics: list[str]) -> dict[str, str]:
    """``cleanup.policy`` of each of ``topics`` (existing ones) the broker answers for; an empty
    string where it answers without one. A broker that cannot answer DescribeConfigs: nothing."""
    if not topics:
        return {}
    # All of each topic's configs: the embedded broker drops the connection when asked for named ones.
    resources = [ConfigResource(ConfigResourceType.TOPIC, t) for t in topics]
    try:
        responses = await admin.describe_configs(resources)
    except KafkaError:
        return {}
    out: dict[str, str] = {}
    for response in responses:
        for error_code, _msg, _type, name, entries in response.resources:
            if error_code == 0:
                out[str(name)] = str({e[0]: e[1] for e in entries}.get("cleanup.policy") or "")
    return out


def missing_topic(name: str, bootstrap_servers: Bootstrap, where: str = "") -> str:
    """Why ``name`` is not in the broker's topic list, in words: it does not exist, or (for a SASL
    principal) an ACL hides it. A broker lists only the topics the principal may describe, and asking
    for the topic by name to tell the two apart would create it on an auto-creating broker."""
    user = getattr(bootstrap_servers, "sasl_username", None)
    hidden = f", or user {user!r} is not authorized to describe it (check the ACLs)" if user else ""
    return (
        f"topic {name} does not exist{where}{hidden} "
        "(start the daemon with --create-topics, or check --topic-prefix)"
    )


async def require_topics(
    bootstrap_servers: Bootstrap, prefix: str, logicals: list[str], *, cleanup: bool = False, where: str = ""
) -> dict[str, int]:
    """Check, creating nothing, that the registry topics ``logicals`` exist under ``prefix`` with the
    partition counts (and, with ``cleanup``, the ``cleanup.policy``) fleetloop relies on
    (:func:`layout_problems`); their partition counts by physical name. Raises
    :class:`TopicMissingError` naming the first missing topic (in the order of ``logicals``; ``where``
    goes after its name, e.g. " at HOST:PORT"), or :class:`TopicLayoutError` naming every misfit one."""
    wanted = list(dict.fromkeys(topic_name(prefix, logical) for logical in logicals))
    async with admin_client(bootstrap_servers) as admin:
        counts = await partition_counts(admin)
        for name in wanted:  # in the caller's order: the first it would touch is named
            if name not in counts:
                raise TopicMissingError(missing_topic(name, bootstrap_servers, where))
        policies = await cleanup_policies(admin, wanted) if cleanup else None
    found = {n: counts[n] for n in wanted}
    if problems := layout_problems(prefix, found, policies):
        raise TopicLayoutError(f"{'; '.join(problems)} (see docs/operations.md, Topics)")
    return found
