"""Real brokers for integration tests: every test here runs once per broker, ``test_x[tansu]`` and
``test_x[kafka]`` (docs/decisions/kafka-spine.md: every integration test runs against both).

- ``broker``: session-scoped; each broker starts once per session (pytest groups the tests by
  broker, so only one runs at a time) and stops at the end. A broker that cannot start makes every
  test that uses it error out with the BrokerStartError message: never a silent skip.
- ``kafka_env``: per test, a fresh topic prefix with every registry topic created, so tests never
  see each other's records; a session pool per broker creates them ahead of the tests
  (tests/support/prefixes.py: on Apache Kafka a new topic takes about a second to serve).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fleetloop.daemon.brokers import (
    BROKER_KINDS,
    BrokerCapabilities,
    BrokerKind,
    BrokerStartError,
    ProcessBroker,
    delete_topics,
    make_broker,
)
from fleetloop.schemas.topics import topic_name
from tests.support.prefixes import PrefixPool

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Everything under tests/integration is marked ``integration``; under pytest-xdist
    (``--dist loadgroup``, as the Makefile runs it) every test on one broker kind goes to one worker,
    so each broker starts once per run instead of once per worker."""
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.integration)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("broker") in BROKER_KINDS:
            item.add_marker(pytest.mark.xdist_group(f"broker-{callspec.params['broker']}"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A broker that did not start: report its BrokerStartError (reason, log tail), not a traceback."""
    report: pytest.TestReport = yield
    if call.excinfo is not None and call.excinfo.errisinstance(BrokerStartError):
        report.longrepr = str(call.excinfo.value)
    return report


@pytest.fixture(scope="session", params=BROKER_KINDS)
def broker(request: pytest.FixtureRequest) -> Iterator[ProcessBroker]:
    """A started broker of each kind, once per session. Start-up failures raise BrokerStartError."""
    started = make_broker(request.param)
    started.start()
    try:
        yield started
    finally:
        started.stop()


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """What a test may know about the broker (not the handle: tests must not stop it)."""

    kind: BrokerKind
    capabilities: BrokerCapabilities


@dataclass(frozen=True, slots=True)
class KafkaEnv:
    """One test's private namespace on a running broker: all registry topics under ``prefix``."""

    bootstrap_servers: str
    prefix: str
    broker: BrokerInfo

    def topic(self, logical: str) -> str:
        """The physical name of a registry topic (``KeyError`` for names not in the registry)."""
        return topic_name(self.prefix, logical)

    def group(self, name: str) -> str:
        """A consumer group id private to this test."""
        return f"{self.prefix}.{name}"


@pytest.fixture(scope="session")
def prefix_pool(broker: ProcessBroker) -> Iterator[PrefixPool]:
    """Fresh prefixes with their topics, made ahead on this broker; stopped before the broker is."""
    pool = PrefixPool(broker.bootstrap_servers)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
async def kafka_env(broker: ProcessBroker, prefix_pool: PrefixPool) -> AsyncIterator[KafkaEnv]:
    """Every registry topic under a fresh prefix; deleted again after the test (keeps the broker lean)."""
    prefix = await asyncio.to_thread(prefix_pool.take)
    yield KafkaEnv(
        bootstrap_servers=broker.bootstrap_servers,
        prefix=prefix,
        broker=BrokerInfo(kind=broker.kind, capabilities=broker.capabilities),
    )
    await delete_topics(broker.bootstrap_servers, prefix)
