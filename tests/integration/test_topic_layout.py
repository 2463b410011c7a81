"""Topics are created by ``fleetloop run --create-topics`` only, and only as fleetloop reads them.

aiokafka names a topic in a Metadata request with ``allow_auto_topic_creation=True`` (always), so a
command that merely read a missing topic used to make the embedded broker create it with its own
default of 4 partitions; a daemon started later with ``--create-topics`` accepted it, read its
partition 0 only and never saw the records keyed onto the others (``policy status`` then said "no
active policy" while the daemon ran one). Here, on each real broker and a prefix of its own:

- every read-only command (and ``policy apply``, which writes) on a fresh prefix exits 2 with one
  line naming the missing topic, and the broker has no topic of that prefix afterwards;
- ``run --create-topics`` (and ``run`` without it) refuses an existing topic with the wrong
  partition count or cleanup policy, naming it, before creating anything;
- a missing pool-keyed input is created co-partitioned with the existing ones.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from fleetloop.cli.main import main
from fleetloop.daemon.brokers import ProcessBroker, TopicLayoutError, delete_topics, ensure_topics, free_port
from fleetloop.daemon.brokers.admin import create_topics, registry_topics
from fleetloop.router.publish import OutcomePublisher
from fleetloop.schemas.topics import (
    DECISIONS,
    POLICY_ACTIVE,
    REQUESTS,
    STATE,
    TELEMETRY,
    TICKS,
    TOPICS,
    topic_name,
)
from fleetloop.topic_layout import topic_partitions

REPO = Path(__file__).resolve().parents[2]
CLASSIC = str(REPO / "fleetloop/policies/baselines/classic.yaml")


@pytest.fixture
async def prefix(broker: ProcessBroker) -> AsyncIterator[str]:
    """A prefix with no topic at all (unlike ``kafka_env``); its registry topics deleted after."""
    name = f"tl-{uuid.uuid4().hex[:10]}"
    yield name
    await delete_topics(broker.bootstrap_servers, name)


async def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = int(await asyncio.to_thread(main, list(argv)))
    out, err = capsys.readouterr()
    return code, out, err


async def _under(bootstrap: str, prefix: str) -> dict[str, int]:
    return {t: n for t, n in (await topic_partitions(bootstrap)).items() if t.startswith(f"{prefix}.")}


async def _create(bootstrap: str, topics: list[NewTopic]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await create_topics(admin, topics)
    finally:
        await admin.close()


READ_ONLY = {
    "policy status": (["policy", "status"], POLICY_ACTIVE),
    "policy apply": (["policy", "apply", CLASSIC, "--wait-s", "1"], POLICY_ACTIVE),
    "policy rollback": (["policy", "rollback", "--wait-s", "1"], POLICY_ACTIVE),
    "policy remove-shadow": (["policy", "remove-shadow", "--wait-s", "1"], POLICY_ACTIVE),
    "replay": (["replay"], DECISIONS),
    "policy compare": (["policy", "compare"], DECISIONS),
    "whatif": (["whatif", "--from", "beginning", "--to", "end", "--policy", CLASSIC], REQUESTS),
}


@pytest.mark.parametrize("command", sorted(READ_ONLY))
async def test_a_command_on_a_fresh_prefix_creates_no_topic_and_says_which_is_missing(
    broker: ProcessBroker, prefix: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, missing = READ_ONLY[command]
    bs = broker.bootstrap_servers
    code, out, err = await _cli(capsys, *argv, "--bootstrap-servers", bs, "--topic-prefix", prefix)
    assert code == 2, (out, err)
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert err.startswith(f"fleetloop {command}: topic {topic_name(prefix, missing)} does not exist"), err
    assert err.rstrip().endswith("(start the daemon with --create-topics, or check --topic-prefix)"), err
    assert await _under(bs, prefix) == {}


@pytest.mark.parametrize("create", [True, False], ids=["create-topics", "no-create-topics"])
async def test_run_refuses_a_topic_with_the_wrong_partition_count_naming_it(
    broker: ProcessBroker, prefix: str, create: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a read-only command used to leave behind: control.policy.active with 4 partitions."""
    bs = broker.bootstrap_servers
    active = topic_name(prefix, POLICY_ACTIVE)
    await _create(bs, [NewTopic(active, 4, 1, topic_configs={"cleanup.policy": "compact"})])
    if not create:  # every other topic as the registry has it: only the count is wrong
        await _create(bs, [t for t in registry_topics(prefix) if t.name != active])
    before = await _under(bs, prefix)
    flags = ["--create-topics"] if create else []
    code, out, err = await _cli(
        capsys, "run", "--bootstrap-servers", bs, "--topic-prefix", prefix, "--idempotence", "off", *flags
    )
    assert code == 2, (out, err)
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert err.startswith(f"fleetloop run: topic {active} has 4 partitions, fleetloop needs 1"), err
    assert await _under(bs, prefix) == before  # refused before creating anything


async def test_run_refuses_a_topic_with_the_wrong_cleanup_policy(
    broker: ProcessBroker, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bs = broker.bootstrap_servers
    state = topic_name(prefix, STATE)
    await _create(bs, [NewTopic(state, 1, 1, topic_configs={"cleanup.policy": "delete"})])
    code, _, err = await _cli(
        capsys, "run", "--bootstrap-servers", bs, "--topic-prefix", prefix, "--create-topics"
    )
    assert code == 2
    assert err.startswith(f"fleetloop run: topic {state} has cleanup.policy delete, fleetloop needs compact")
    assert await _under(bs, prefix) == {state: 1}


async def test_pool_keyed_inputs_may_have_more_partitions_but_stay_co_partitioned(
    broker: ProcessBroker, prefix: str
) -> None:
    bs = broker.bootstrap_servers
    telemetry = topic_name(prefix, TELEMETRY)
    await _create(bs, [NewTopic(telemetry, 2, 1, topic_configs={"cleanup.policy": "delete"})])
    await ensure_topics(bs, prefix)  # the missing inputs follow telemetry's 2, the rest the registry
    counts = await _under(bs, prefix)
    assert counts == {
        topic_name(prefix, lg): 2 if lg in (TELEMETRY, REQUESTS, TICKS) else spec.partitions
        for lg, spec in TOPICS.items()
    }
    await ensure_topics(bs, prefix)  # existing and right: nothing to do, nothing refused
    other = f"tl-{uuid.uuid4().hex[:10]}"
    try:
        await _create(
            bs,
            [
                NewTopic(topic_name(other, TELEMETRY), 2, 1),
                NewTopic(topic_name(other, TICKS), 3, 1),
            ],
        )
        with pytest.raises(TopicLayoutError, match="pool-keyed topics need one partition count"):
            await ensure_topics(bs, other)
    finally:
        await delete_topics(bs, other)


async def _serve_vllm() -> tuple[web.AppRunner, int]:
    """A vLLM engine's /metrics page (a checked-in fixture): a scrape of it publishes a record."""
    page = (REPO / "tests/edges/fixtures/vllm-0.33.0.1.prom").read_text()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def _scrape(capsys: pytest.CaptureFixture[str], bs: str, prefix: str) -> tuple[int, str, str]:
    runner, port = await _serve_vllm()
    try:
        return await _cli(
            capsys, "scrape", "--runtime", "vllm", "--pool", "chat", "--target",
            f"chat/a=http://127.0.0.1:{port}", "--interval-s", "0.2", "--duration-s", "2",
            "--bootstrap-servers", bs, "--topic-prefix", prefix,
        )  # fmt: skip
    finally:
        await runner.cleanup()


def _fleet_argv(bs: str, prefix: str) -> list[str]:
    return [
        "fleet", "--scenario", str(REPO / "scenarios/steady-chat.yaml"), "--seconds", "2",
        "--drain-s", "0", "--bootstrap-servers", bs, "--topic-prefix", prefix,
    ]  # fmt: skip


def _one_line(code: int, out: str, err: str) -> str:
    assert code == 2, (out, err)
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


async def test_scrape_on_a_fresh_prefix_creates_no_topic_and_says_which_is_missing(
    broker: ProcessBroker, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to scrape and publish, and its first send created fleet.telemetry (4 partitions on
    Tansu): refused once at start-up instead, before any send."""
    bs = broker.bootstrap_servers
    err = _one_line(*await _scrape(capsys, bs, prefix))
    assert err.startswith(f"fleetloop scrape: topic {topic_name(prefix, TELEMETRY)} does not exist"), err
    assert err.rstrip().endswith("(start the daemon with --create-topics, or check --topic-prefix)"), err
    assert await _under(bs, prefix) == {}


async def test_scrape_refuses_a_telemetry_topic_laid_out_otherwise(
    broker: ProcessBroker, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bs = broker.bootstrap_servers
    telemetry = topic_name(prefix, TELEMETRY)
    await _create(bs, [NewTopic(telemetry, 4, 1, topic_configs={"cleanup.policy": "compact"})])
    err = _one_line(*await _scrape(capsys, bs, prefix))
    assert err.startswith(
        f"fleetloop scrape: topic {telemetry} has cleanup.policy compact, fleetloop needs delete"
    ), err


async def test_fleet_on_a_fresh_prefix_creates_no_topic_and_says_which_is_missing(
    broker: ProcessBroker, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to follow control.state and send outcomes, creating both (4 partitions on Tansu)."""
    bs = broker.bootstrap_servers
    err = _one_line(*await _cli(capsys, *_fleet_argv(bs, prefix)))
    assert err.startswith(f"fleetloop fleet: topic {topic_name(prefix, STATE)} does not exist"), err
    assert err.rstrip().endswith("(start the daemon with --create-topics, or check --topic-prefix)"), err
    assert await _under(bs, prefix) == {}
    # control.state there, fleet.requests not: the outcomes' topic is named (and not created)
    await _create(bs, [t for t in registry_topics(prefix) if t.name == topic_name(prefix, STATE)])
    err = _one_line(*await _cli(capsys, *_fleet_argv(bs, prefix)))
    assert err.startswith(f"fleetloop fleet: topic {topic_name(prefix, REQUESTS)} does not exist"), err
    assert await _under(bs, prefix) == {topic_name(prefix, STATE): 1}
    code, out, err = await _cli(capsys, *_fleet_argv(bs, prefix), "--no-outcomes")  # writes none
    assert code == 0, (out, err)
    assert await _under(bs, prefix) == {topic_name(prefix, STATE): 1}


async def test_fleet_refuses_a_state_topic_with_the_wrong_partition_count(
    broker: ProcessBroker, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """What an auto-created control.state looked like: 4 partitions, of which a reader sees one."""
    bs = broker.bootstrap_servers
    state = topic_name(prefix, STATE)
    await _create(bs, [t for t in registry_topics(prefix) if t.name != state])
    await _create(bs, [NewTopic(state, 4, 1, topic_configs={"cleanup.policy": "compact"})])
    err = _one_line(*await _cli(capsys, *_fleet_argv(bs, prefix)))
    assert err.startswith(f"fleetloop fleet: topic {state} has 4 partitions, fleetloop needs 1"), err


async def test_the_router_publisher_refuses_a_missing_or_misfit_requests_topic(
    broker: ProcessBroker, prefix: str
) -> None:
    """The library raises at start() (no per-publish cost), naming the topic; it creates nothing."""
    bs = broker.bootstrap_servers
    requests = topic_name(prefix, REQUESTS)
    pub = OutcomePublisher(bs, topic_prefix=prefix)
    with pytest.raises(TopicLayoutError, match=f"^topic {re.escape(requests)} does not exist"):
        await pub.start()
    await pub.stop()
    assert await _under(bs, prefix) == {}
    await _create(bs, [NewTopic(requests, 2, 1, topic_configs={"cleanup.policy": "compact"})])
    pub = OutcomePublisher(bs, topic_prefix=prefix)
    with pytest.raises(TopicLayoutError, match=f"^topic {re.escape(requests)} has cleanup.policy compact"):
        await pub.start()
    await pub.stop()


@pytest.mark.parametrize("command", sorted(READ_ONLY))
async def test_a_read_only_command_refuses_a_topic_with_the_wrong_partition_count_naming_it(
    broker: ProcessBroker, prefix: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first one-partition topic each reads, with 4 (what a reader's first fetch used to leave
    behind): replay, policy compare and whatif read it whole, records fleetloop never wrote included."""
    argv, first = READ_ONLY[command]
    misfit = topic_name(prefix, DECISIONS if first in (TELEMETRY, REQUESTS, TICKS) else first)
    spec = next(t for t in registry_topics(prefix) if t.name == misfit)
    bs = broker.bootstrap_servers
    await _create(bs, [t for t in registry_topics(prefix) if t.name != misfit])
    await _create(bs, [NewTopic(misfit, 4, 1, topic_configs=spec.topic_configs)])
    err = _one_line(*await _cli(capsys, *argv, "--bootstrap-servers", bs, "--topic-prefix", prefix))
    assert err.startswith(f"fleetloop {command}: topic {misfit} has 4 partitions, fleetloop needs 1"), err
