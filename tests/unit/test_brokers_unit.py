"""Broker plumbing that needs no broker: config rendering, errors, ports, the fetch script's cache."""

from __future__ import annotations

import base64
import os
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from fleetloop.daemon.brokers import (
    ApacheKafka,
    BrokerStartError,
    EmbeddedTansu,
    free_port,
    free_ports,
    make_broker,
)
from fleetloop.daemon.brokers.admin import registry_topics
from fleetloop.daemon.brokers.apache import (
    POM_PATH,
    REPO_ROOT,
    java_command,
    kafka_home,
    kafka_version,
    new_cluster_id,
    render_server_properties,
)
from fleetloop.daemon.brokers.base import tail_lines
from fleetloop.daemon.brokers.tansu import tansu_command
from fleetloop.schemas.topics import (
    DECISIONS,
    POLICY,
    POLICY_ACTIVE,
    REQUESTS,
    STATE,
    TELEMETRY,
    TICKS,
    TOPICS,
)
from fleetloop.topic_layout import layout_problems

FETCH_SCRIPT = REPO_ROOT / "scripts" / "kafka-fetch.sh"


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return dict(pairs)


def _executable(path: Path, body: str) -> Path:
    path.write_text("#!/usr/bin/env bash\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# --- server.properties ----------------------------------------------------------------------------


def test_server_properties_single_node_kraft_on_loopback(tmp_path: Path) -> None:
    props = _properties(render_server_properties(port=19092, controller_port=19093, data_dir=tmp_path))
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["log.dirs"] == str(tmp_path)


def test_server_properties_one_replica_fast_groups_no_auto_create(tmp_path: Path) -> None:
    props = _properties(render_server_properties(port=1, controller_port=2, data_dir=tmp_path))
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    ):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["auto.create.topics.enable"] == "false"


def test_server_properties_bind_and_advertise_loopback_only(tmp_path: Path) -> None:
    props = _properties(render_server_properties(port=1, controller_port=2, data_dir=tmp_path))
    addresses = [
        props["controller.quorum.voters"].split("@", 1)[1],
        *(listener.split("//", 1)[1] for listener in props["listeners"].split(",")),
        props["advertised.listeners"].split("//", 1)[1],
    ]
    assert {address.rsplit(":", 1)[0] for address in addresses} == {"127.0.0.1"}


def test_cluster_id_looks_like_kafka_uuid() -> None:
    ids = {new_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    for cluster_id in ids:
        assert len(cluster_id) == 22
        assert not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_java_command_small_heap_fetched_classpath_and_log_config(tmp_path: Path) -> None:
    argv = java_command(
        tmp_path, "kafka.Kafka", ["server.properties"], logs_dir=tmp_path / "logs", heap_mb=512
    )
    assert argv[0] == "java"
    assert "-Xmx512m" in argv
    assert argv[argv.index("-cp") + 1] == f"{tmp_path / 'lib'}/*"
    assert f"-Dlog4j2.configurationFile={tmp_path / 'config' / 'log4j2.properties'}" in argv
    assert f"-Dkafka.logs.dir={tmp_path / 'logs'}" in argv
    assert argv[-2:] == ["kafka.Kafka", "server.properties"]


def test_tansu_command_memory_storage_on_loopback() -> None:
    argv = tansu_command("/bin/tansu", 4242)
    assert argv[:2] == ["/bin/tansu", "broker"]
    assert argv[argv.index("--listener-url") + 1] == "tcp://127.0.0.1:4242"
    assert argv[argv.index("--advertised-listener-url") + 1] == "tcp://127.0.0.1:4242"
    assert argv[argv.index("--storage-engine") + 1] == "memory://tansu/"


# --- version and install location -----------------------------------------------------------------


def test_kafka_version_comes_from_the_fetch_pom(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_VERSION", raising=False)
    version = kafka_version()
    assert version.startswith("4.")
    assert f"<kafka.version>{version}</kafka.version>" in POM_PATH.read_text()
    monkeypatch.setenv("KAFKA_VERSION", "4.0.9")
    assert kafka_version() == "4.0.9"


def test_kafka_home_cache_layout_and_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FLEETLOOP_KAFKA_HOME", raising=False)
    monkeypatch.delenv("FLEETLOOP_KAFKA_CACHE", raising=False)
    assert kafka_home("4.1.1") == REPO_ROOT / ".cache" / "kafka" / "4.1.1"
    monkeypatch.setenv("FLEETLOOP_KAFKA_CACHE", str(tmp_path))
    assert kafka_home("4.1.1") == tmp_path / "4.1.1"
    monkeypatch.setenv("FLEETLOOP_KAFKA_HOME", str(tmp_path / "elsewhere"))
    assert kafka_home("4.1.1") == tmp_path / "elsewhere"


# --- errors ---------------------------------------------------------------------------------------


def test_start_error_names_the_broker_the_reason_and_quotes_the_log() -> None:
    error = BrokerStartError("kafka", "port 9092 in use", "line 1\nline 2\n")
    text = str(error)
    assert text.startswith("kafka broker failed to start: port 9092 in use")
    assert text.endswith("line 1\nline 2")
    assert (error.broker_kind, error.reason) == ("kafka", "port 9092 in use")
    assert str(BrokerStartError("tansu", "no binary")) == "tansu broker failed to start: no binary"


def test_tail_lines(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"l{i}\n" for i in range(50)))
    assert tail_lines(log, 3) == "l47\nl48\nl49"
    assert tail_lines(tmp_path / "missing.log") == ""


def test_kafka_without_jars_says_to_run_make_kafka(tmp_path: Path) -> None:
    broker = ApacheKafka(home=tmp_path)
    with pytest.raises(BrokerStartError, match=r"make kafka") as caught:
        broker.start()
    assert caught.value.broker_kind == "kafka"
    assert not broker.running


def test_tansu_that_exits_fails_with_its_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = _executable(tmp_path / "tansu", "echo 'bind: address already in use' >&2\nexit 3\n")
    monkeypatch.setenv("CALF_TANSU_BIN", str(fake))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a failed start keeps its dir: keep it here
    broker = EmbeddedTansu(start_timeout_s=10)
    with pytest.raises(BrokerStartError) as caught:
        broker.start()
    text = str(caught.value)
    assert text.startswith("tansu broker failed to start: process exited with code 3")
    assert "bind: address already in use" in text
    assert f"its files are kept in {tmp_path}" in text
    assert not broker.running


def test_tansu_that_never_answers_times_out_and_is_stopped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = _executable(tmp_path / "tansu", "echo starting\nexec sleep 60\n")
    monkeypatch.setenv("CALF_TANSU_BIN", str(fake))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    broker = EmbeddedTansu(start_timeout_s=0.5, stop_timeout_s=5)
    with pytest.raises(BrokerStartError, match=r"no Kafka metadata answer .* within 0\.5 s") as caught:
        broker.start()
    assert "starting" in caught.value.log_tail
    assert not broker.running


def test_make_broker_knows_two_kinds() -> None:
    assert isinstance(make_broker("tansu"), EmbeddedTansu)
    assert isinstance(make_broker("kafka"), ApacheKafka)
    with pytest.raises(ValueError, match="unknown broker kind 'redpanda'"):
        make_broker("redpanda")


# --- ports ----------------------------------------------------------------------------------------


def test_free_ports_are_distinct_and_bindable_on_loopback() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3
    for port in (*ports, free_port()):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


# --- topic setup (pure part) ----------------------------------------------------------------------


def test_registry_topics_follow_the_registry() -> None:
    topics = {t.name: t for t in registry_topics("p")}
    assert set(topics) == {f"p.{logical}" for logical in TOPICS}
    for logical, spec in TOPICS.items():
        topic = topics[f"p.{logical}"]
        assert topic.num_partitions == spec.partitions
        assert topic.replication_factor == 1
        assert topic.topic_configs == {"cleanup.policy": spec.cleanup}
    assert topics[f"p.{STATE}"].topic_configs["cleanup.policy"] == "compact"
    assert topics[f"p.{POLICY}"].topic_configs["cleanup.policy"] == "compact"


def test_registry_topics_partition_override() -> None:
    topics = {t.name: t for t in registry_topics("p", {TELEMETRY: 1})}
    assert topics[f"p.{TELEMETRY}"].num_partitions == 1
    with pytest.raises(KeyError, match="unknown topics"):
        registry_topics("p", {"fleet.nope": 2})


def _registry_layout(prefix: str) -> dict[str, int]:
    return {f"{prefix}.{logical}": spec.partitions for logical, spec in TOPICS.items()}


def test_the_registry_layout_has_no_problem_and_missing_or_foreign_topics_are_not_judged() -> None:
    assert layout_problems("p", _registry_layout("p")) == []
    assert layout_problems("p", {}) == []
    assert layout_problems("p", {"q.control.policy": 4, "control.policy": 4}) == []
    cleanup = {f"p.{logical}": spec.cleanup for logical, spec in TOPICS.items()}
    assert layout_problems("p", _registry_layout("p"), cleanup) == []


def test_a_topic_read_at_partition_0_must_have_exactly_its_one_partition() -> None:
    counts = {**_registry_layout("p"), f"p.{POLICY_ACTIVE}": 4, f"p.{DECISIONS}": 2}
    assert layout_problems("p", counts) == [
        f"topic p.{DECISIONS} has 2 partitions, fleetloop needs 1",
        f"topic p.{POLICY_ACTIVE} has 4 partitions, fleetloop needs 1",
    ]


def test_pool_keyed_inputs_may_have_any_count_but_the_same_one() -> None:
    more = {**_registry_layout("p"), **{f"p.{lg}": 8 for lg in (TELEMETRY, REQUESTS, TICKS)}}
    assert layout_problems("p", more) == []
    assert layout_problems("p", {f"p.{TELEMETRY}": 1, f"p.{REQUESTS}": 1}) == []
    mixed = {**_registry_layout("p"), f"p.{TICKS}": 8}
    assert layout_problems("p", mixed) == [
        f"the pool-keyed topics need one partition count, they have "
        f"p.{TICKS} 8, p.{REQUESTS} 4, p.{TELEMETRY} 4"
    ]


def test_cleanup_policy_compacted_where_the_registry_compacts_and_only_there() -> None:
    counts = _registry_layout("p")
    assert layout_problems("p", counts, {f"p.{STATE}": "delete", f"p.{DECISIONS}": "compact,delete"}) == [
        f"topic p.{DECISIONS} has cleanup.policy compact,delete, fleetloop needs delete",
        f"topic p.{STATE} has cleanup.policy delete, fleetloop needs compact",
    ]
    # Compaction plus retention keeps the latest record per key: still compacted; unset is delete.
    assert layout_problems("p", counts, {f"p.{STATE}": "compact,delete", f"p.{TELEMETRY}": ""}) == []
    assert layout_problems("p", counts, {f"p.{POLICY}": ""}) == [
        f"topic p.{POLICY} has cleanup.policy delete, fleetloop needs compact"
    ]


# --- scripts/kafka-fetch.sh -----------------------------------------------------------------------


def test_fetch_script_fetches_once_then_uses_its_cache(tmp_path: Path) -> None:
    """With a stand-in mvn: the first run fetches, the second finds the stamp and calls nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "mvn-calls"
    _executable(
        bin_dir / "mvn",
        f"""
        echo "$@" >> {calls}
        for arg in "$@"; do
            case "$arg" in
                -DoutputDirectory=*) out="${{arg#-DoutputDirectory=}}" ;;
                -Dkafka.version=*) kafka="${{arg#-Dkafka.version=}}" ;;
                -Dlog4j.version=*) log4j="${{arg#-Dlog4j.version=}}" ;;
            esac
        done
        mkdir -p "$out"
        for jar in kafka_2.13-$kafka log4j-slf4j-impl-$log4j log4j-core-$log4j log4j-api-$log4j; do
            touch "$out/$jar.jar"
        done
        """,
    )
    _executable(bin_dir / "java", "exit 0\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FLEETLOOP_KAFKA_CACHE": str(tmp_path / "cache"),
    }
    env.pop("KAFKA_VERSION", None)
    env.pop("LOG4J_VERSION", None)
    version = kafka_version()

    def run() -> str:
        done = subprocess.run(
            [str(FETCH_SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=True
        )
        return done.stdout

    assert "fetched Apache Kafka" in run()
    assert len(calls.read_text().splitlines()) == 1
    home = tmp_path / "cache" / version
    assert (home / "lib" / f"kafka_2.13-{version}.jar").is_file()
    assert (home / "config" / "log4j2.properties").read_text() == (
        REPO_ROOT / "scripts" / "kafka" / "log4j2.properties"
    ).read_text()

    assert "already cached" in run()
    assert len(calls.read_text().splitlines()) == 1, "a cached fetch must not run mvn"

    (home / ".stamp").write_text("stale\n")
    assert "fetched Apache Kafka" in run()
    assert len(calls.read_text().splitlines()) == 2


def test_fetch_script_refuses_a_non_4x_version(tmp_path: Path) -> None:
    env = {**os.environ, "KAFKA_VERSION": "3.9.0", "FLEETLOOP_KAFKA_CACHE": str(tmp_path)}
    done = subprocess.run(
        [str(FETCH_SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert "expected a 4.x.y version" in done.stderr


# --- tests/conftest.py: the leftover-task guard ---------------------------------------------------


def test_leftover_task_guard_fails_an_async_test_that_leaks(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text((REPO_ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_leak.py").write_text(
        textwrap.dedent(
            """
            import asyncio

            async def test_leaks():
                asyncio.get_running_loop().create_task(asyncio.sleep(3600))

            async def test_cleans_up():
                task = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
                task.cancel()

            def test_sync():
                pass
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto", "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "3 passed, 1 error" in done.stdout, done.stdout
    assert "ERROR at teardown of test_leaks" in done.stdout
    assert "left 1 asyncio task(s) running" in done.stdout


def test_a_missing_topic_seen_by_a_sasl_user_may_be_hidden_by_an_acl() -> None:
    """A broker lists only the topics a principal may describe: for a SASL user, "does not exist" is
    said with the other reason, since asking by name to tell them apart would create the topic."""
    from fleetloop.kafka_security import KafkaConnection, Secret
    from fleetloop.topic_layout import missing_topic

    plain = missing_topic("p.control.policy", "127.0.0.1:9092")
    assert plain.startswith("topic p.control.policy does not exist (start the daemon with --create-topics")
    assert "authoriz" not in plain
    user = KafkaConnection(
        "127.0.0.1:9093",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="intruder",
        sasl_password=Secret("pw"),
    )
    said = missing_topic("p.control.policy", user, " at 127.0.0.1:9093")
    assert said.startswith("topic p.control.policy does not exist at 127.0.0.1:9093, or user 'intruder' ")
    assert "not authorized to describe it" in said
    assert "pw" not in said
