"""``fleetloop run``'s flags for the checkpoint's CPU share and stretch and the group's session
timeout: parsed, refused out of range (exit 2, one line), read from FLEETLOOP_* too, and passed on
to the daemon (its consumer's session and heartbeat)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from fleetloop.cli import commands
from fleetloop.cli import main as cli
from fleetloop.daemon.cli_common import policy_from
from fleetloop.daemon.observe.decode import Door
from fleetloop.daemon.runtime import DaemonConfig


class _Captured(Exception):
    pass


def _config(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str] | None = None
) -> DaemonConfig:
    from fleetloop.daemon import runtime

    seen: list[DaemonConfig] = []

    class Daemon:
        def __init__(self, config: DaemonConfig, on_decisions: Any = None) -> None:
            seen.append(config)
            raise _Captured

    async def no_wait(*args: Any) -> None:
        return None

    monkeypatch.setattr(runtime, "Daemon", Daemon)
    monkeypatch.setattr(commands, "_wait_for_topics", no_wait)
    args = cli.build_parser(env or {}).parse_args(
        ["run", "--bootstrap-servers", "127.0.0.1:9", "--idempotence", "off", *argv]
    )
    args.door = Door()
    with pytest.raises(_Captured):
        asyncio.run(commands._run_daemon(args, policy_from(None), "127.0.0.1:9", []))
    return seen[0]


def test_the_flags_reach_the_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    default = _config(monkeypatch, [])
    defaults = {f.name: f.default for f in dataclasses.fields(DaemonConfig)}
    for name in ("checkpoint_cpu_share", "checkpoint_max_stretch", "session_timeout_s"):
        assert getattr(default, name) == defaults[name]
    given = _config(
        monkeypatch,
        ["--checkpoint-cpu-share", "0", "--checkpoint-max-stretch", "2.5", "--session-timeout-s", "30"],
    )
    assert (given.checkpoint_cpu_share, given.checkpoint_max_stretch, given.session_timeout_s) == (
        0.0,
        2.5,
        30.0,
    )
    env = _config(
        monkeypatch, [], {"FLEETLOOP_SESSION_TIMEOUT_S": "20", "FLEETLOOP_CHECKPOINT_CPU_SHARE": "0.1"}
    )
    assert (env.session_timeout_s, env.checkpoint_cpu_share) == (20.0, 0.1)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--checkpoint-cpu-share", "-0.1"),
        ("--checkpoint-cpu-share", "1.5"),
        ("--checkpoint-cpu-share", "nan"),
        ("--checkpoint-max-stretch", "0.5"),
        ("--checkpoint-max-stretch", "inf"),
        ("--session-timeout-s", "0.5"),
        ("--session-timeout-s", "1e308"),
    ],
)
def test_a_value_out_of_range_is_refused_in_one_line(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", "--bootstrap-servers", "127.0.0.1:9", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert flag in err


@pytest.mark.parametrize(("session_s", "heartbeat_ms"), [(6.0, 1000), (30.0, 1000), (3.0, 500)])
def test_the_consumer_takes_the_session_timeout(
    monkeypatch: pytest.MonkeyPatch, session_s: float, heartbeat_ms: int
) -> None:
    """The group consumer the daemon starts: this session timeout, heartbeats a sixth of it (at most 1 s)."""
    from fleetloop.daemon import runtime
    from fleetloop.daemon.runtime import kafka
    from fleetloop.policies.registry import builtin_policy

    made: list[dict[str, Any]] = []

    class Stop(Exception):
        pass

    class Consumer:
        def __init__(self, *topics: Any, **kwargs: Any) -> None:
            if "group_id" in kwargs:
                made.append(kwargs)
                raise Stop

    class Producer:
        def __init__(self, **kwargs: Any) -> None:
            pass

        async def start(self) -> None:
            pass

        async def stop(self) -> None:
            pass

    monkeypatch.setattr(kafka, "AIOKafkaConsumer", Consumer)
    monkeypatch.setattr(kafka, "AIOKafkaProducer", Producer)
    daemon = runtime.Daemon(
        DaemonConfig(
            bootstrap_servers="127.0.0.1:9",
            policy=builtin_policy("default"),
            session_timeout_s=session_s,
            gc_gen0_threshold=0,
        )
    )
    with pytest.raises(Stop):
        asyncio.run(daemon.run(asyncio.Event()))
    assert made[0]["session_timeout_ms"] == int(session_s * 1000)
    assert made[0]["heartbeat_interval_ms"] == heartbeat_ms
