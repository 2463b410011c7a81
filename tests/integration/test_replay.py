"""``fleetloop replay`` over a real decision log: exact replay is byte-identical; a what-if differs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fleetloop import clock
from fleetloop.cli.main import main
from fleetloop.daemon.observe.decode import Door
from fleetloop.policies.registry import load_policy
from fleetloop.schemas import Tick
from fleetloop.schemas.topics import DECISIONS, REQUESTS, TELEMETRY, TICKS
from tests.support.kafka import producer, read_all, running_daemon, send, wait_decided
from tests.support.policies import FOUNDATION_YAML
from tests.support.records import outcome, telemetry, tick

NODES = ("p/0", "p/1", "p/2")


async def _record_an_incident(env: Any) -> int:
    """Run the daemon over a small incident (p/2 starts failing); return how many decisions it made."""
    async with running_daemon(env) as daemon, producer(env) as p:
        for k in range(1, 7):
            await send(
                p,
                env,
                TELEMETRY,
                [telemetry(n, ts_ms=k * 1000, queue_depth=k % 3 + i) for i, n in enumerate(NODES)],
            )
            ok = [outcome(n, "ok", ts_ms=k * 1000 + 100 + i, n=k * 100 + i) for i, n in enumerate(NODES[:2])]
            bad = (
                [outcome("p/2", "error", ts_ms=k * 1000 + 200 + i, n=k * 100 + 10 + i) for i in range(2)]
                if k >= 3
                else []
            )
            await send(p, env, REQUESTS, ok + bad)
            await send(p, env, TICKS, [tick(k)])
            await wait_decided(daemon, k * 1000)
    return daemon.stats.decisions_published  # read once the daemon has stopped: every publish acked


async def test_exact_replay_is_byte_identical_and_a_what_if_shows_the_difference(
    kafka_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    published = await _record_an_incident(kafka_env)
    await read_all(kafka_env, DECISIONS, until=lambda rs: len(rs) >= published)
    capsys.readouterr()  # drop the daemon's log lines
    # The daemon ran without the event-time window (synthetic epoch times): so does the replay.
    args = [
        "replay",
        "--bootstrap-servers",
        kafka_env.bootstrap_servers,
        "--topic-prefix",
        kafka_env.prefix,
        "--event-time-window",
        "off",
    ]

    # The pinned test policy is not built in: name it; its hash matches, so this is exact.
    code = await _in_thread(main, [*args, "--json", "--policy", str(FOUNDATION_YAML)])
    out, err = capsys.readouterr()
    assert out.strip(), err
    exact = json.loads(out)
    assert code == 0, json.dumps(exact)[:3000]
    assert exact["mode"] == "exact"
    assert exact["exact"] is True
    assert exact["ticks_compared"] == 6
    assert exact["identical"] == exact["decisions_compared"] == published
    assert exact["breaker_opens"]["recorded"] == exact["breaker_opens"]["replayed"] == 1

    lenient = FOUNDATION_YAML.read_text().replace("threshold: 5", "threshold: 50")
    what_if = tmp_path / "lenient.yaml"
    what_if.write_text(lenient)
    code = await _in_thread(main, [*args, "--json", "--policy", str(what_if)])
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["mode"] == "what-if"
    assert result["breaker_opens"] == {"recorded": 1, "replayed": 0}
    assert result["changed_by_kind"]["breaker"] >= 1
    assert result["changed_by_kind"]["routing"] >= 1


async def _in_thread(fn: Any, argv: list[str]) -> int:
    """The CLI runs its own event loop (asyncio.run); call it off this test's loop."""
    import asyncio

    return int(await asyncio.to_thread(fn, argv))


async def test_windows_by_offsets_and_by_a_group_and_the_daemons_door_applied_in_replay(
    kafka_env: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real event times and the production door: a telemetry record stamped two minutes ahead of
    its broker timestamp (a new node, p/9) is dead-lettered by the daemon; replay applies the same
    door and is exact, and with the door off it folds p/9 and differs (so the check can fail)."""
    t0 = (clock.wall_ms() // 1000 - 20) * 1000
    group = "door"
    async with running_daemon(kafka_env, group=group, door=Door()) as daemon, producer(kafka_env) as p:
        for k in range(1, 11):
            ts = t0 + k * 1000
            await send(
                p,
                kafka_env,
                TELEMETRY,
                [telemetry(n, ts_ms=ts - 500, queue_depth=k % 3 + i) for i, n in enumerate(NODES)],
            )
            if k == 4:
                await send(p, kafka_env, TELEMETRY, [telemetry("p/9", ts_ms=clock.wall_ms() + 120_000)])
            await send(
                p,
                kafka_env,
                REQUESTS,
                [outcome(n, "ok", ts_ms=ts - 400 + i, n=k * 100 + i) for i, n in enumerate(NODES)],
            )
            await send(p, kafka_env, TICKS, [Tick(ts_ms=ts, tick_id=ts // 1000, pool_id="p")])
            await wait_decided(daemon, ts)
        assert daemon.stats.dead_by_reason.get("event-time-too-new") == 1, daemon.stats.dead_by_reason
        published = daemon.stats.decisions_published
    decided = await read_all(kafka_env, DECISIONS, until=lambda rs: len(rs) >= published)
    capsys.readouterr()
    args = ["replay", "--bootstrap-servers", kafka_env.bootstrap_servers, "--topic-prefix", kafka_env.prefix]
    args += ["--policy", str(FOUNDATION_YAML), "--json"]

    async def replay(*extra: str) -> tuple[int, dict[str, Any]]:
        code = await _in_thread(main, [*args, *extra])
        out, err = capsys.readouterr()
        assert err == "", err  # --json: no progress lines
        return code, json.loads(out)

    code, whole = await replay()
    assert code == 0, json.dumps(whole)[:3000]
    assert whole["exact"] is True
    assert whole["ticks_compared"] == 10
    code, doorless = await replay("--event-time-window", "off")
    assert code == 1, doorless
    assert doorless["exact"] is False
    assert doorless["changed_by_kind"].get("routing", 0) >= 1, doorless

    # By input offsets: the ticks that folded request records 12..20 (3 per tick: ticks 5..7).
    pool_part = next(k for k in json.loads(decided[0].value)["input_offsets"] if k.startswith(REQUESTS))
    part_n = pool_part.rsplit(":", 1)[1]
    code, part = await replay(
        "--from", f"fleet.requests:{part_n}:12", "--to", f"{kafka_env.prefix}.fleet.requests:{part_n}:20"
    )
    assert code == 0, part
    assert part["exact"] is True
    assert part["ticks_compared"] == 3, part
    # Up to what the daemon's group committed: everything it decided.
    code, upto = await replay("--to", f"group:{kafka_env.group(group)}")
    assert code == 0, upto
    assert upto["ticks_compared"] == 10, upto
    # By the decision log's own offsets: the ticks whose first decision lies in [0, 8].
    per_tick = published // 10
    code, logged = await replay("--to", f"control.decisions:0:{per_tick - 1}")
    assert code == 0, logged
    assert logged["ticks_compared"] == 1, logged
    assert len(decided) == published
    code = await _in_thread(main, [*args, "--to", "group:no-such-group"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "group:no-such-group has no committed offsets" in err


async def _three_runs(env: Any, v1: Any, v2: Any, t0: int) -> int:
    """Ticks 1-5 under v1; a restart with v2 (newer: activated from the next boundary), ticks 6-10;
    a restart with v1 again (older: v2 is resumed), ticks 11-12. Returns decisions published."""
    published = 0
    for policy, ks in ((v1, range(1, 6)), (v2, range(6, 11)), (v1, range(11, 13))):
        async with running_daemon(env, policy=policy) as daemon, producer(env) as p:
            for k in ks:
                ts = t0 + k * 1000
                await send(
                    p,
                    env,
                    TELEMETRY,
                    [telemetry(n, ts_ms=ts - 500, queue_depth=k % 3 + i) for i, n in enumerate(NODES)],
                )
                bad = [outcome("p/2", "error", ts_ms=ts - 300 + i, n=k * 100 + 10 + i) for i in range(2)]
                ok = [outcome(n, "ok", ts_ms=ts - 400 + i, n=k * 100 + i) for i, n in enumerate(NODES[:2])]
                await send(p, env, REQUESTS, ok + (bad if k >= 3 else []))
                await send(p, env, TICKS, [Tick(ts_ms=ts, tick_id=ts // 1000, pool_id="p")])
                await wait_decided(daemon, ts)
        published += daemon.stats.decisions_published
    return published


async def test_the_recorded_policy_file_is_judged_stretch_by_stretch_across_a_policy_change(
    kafka_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``replay --policy FILE`` over a window recorded under another version of the same content
    is a what-if in which nothing changes, not an exact replay that differs on every decision;
    over the file's own stretch it is exact, whatever the log's first tick ran; across the change
    each stretch is judged on its own, and the header names each stretch's policy."""
    v2_path = tmp_path / "v2.yaml"
    v2_path.write_text(FOUNDATION_YAML.read_text().replace("version: 1", "version: 2"))
    v1, v2 = load_policy(FOUNDATION_YAML), load_policy(v2_path)
    # Ticks ahead of the wall clock: a restart activates a newer policy from the boundary after
    # the last tick decided, so the change lands exactly between ticks 5 and 6.
    t0 = (clock.wall_ms() // 1000 + 120) * 1000
    published = await _three_runs(kafka_env, v1, v2, t0)
    await read_all(kafka_env, DECISIONS, until=lambda rs: len(rs) >= published)
    capsys.readouterr()
    args = ["replay", "--bootstrap-servers", kafka_env.bootstrap_servers, "--topic-prefix", kafka_env.prefix]
    args += ["--event-time-window", "off"]
    first, change, last = (t0 + 1000) // 1000, (t0 + 6000) // 1000, (t0 + 12_000) // 1000

    async def replay(*extra: str) -> tuple[int, dict[str, Any]]:
        code = await _in_thread(main, [*args, "--json", *extra])
        out, err = capsys.readouterr()
        assert out.strip(), err
        return code, json.loads(out)

    def stretches(result: dict[str, Any]) -> list[tuple[int, int, int, str, str]]:
        return [
            (s["policy"]["version"], s["from_tick"], s["to_tick"], s["mode"], s["verdict"])
            for s in result["stretches"]
        ]

    after = ["--from", str(t0 + 6000)]
    code, v1_over_v2 = await replay("--policy", str(FOUNDATION_YAML), *after)
    assert code == 0, v1_over_v2
    assert v1_over_v2["mode"] == "what-if", v1_over_v2
    assert stretches(v1_over_v2) == [(2, change, last, "what-if", "0 decisions would change")]
    code, v2_over_v2 = await replay("--policy", str(v2_path), *after)
    assert code == 0, v2_over_v2
    assert v2_over_v2["mode"] == "exact", v2_over_v2
    assert v2_over_v2["reproduced"] is True
    assert stretches(v2_over_v2) == [(2, change, last, "exact", "byte-identical")]
    code, across = await replay("--policy", str(FOUNDATION_YAML))
    assert code == 0, across
    assert across["mode"] == "mixed"
    assert stretches(across) == [
        (1, first, change - 1, "exact", "byte-identical"),
        (2, change, last, "what-if", "0 decisions would change"),
    ]
    assert across["identical"] == across["decisions_compared"] == published

    # The table names each stretch's policy, not the last tick's.
    code = await _in_thread(main, args)
    out = capsys.readouterr().out
    assert code == 0, out
    for lo, hi, policy, n in ((first, change - 1, v1, 5), (change, last, v2, 7)):
        line = f"ticks {lo}-{hi}: foundation v{policy.stamp.version} ({policy.stamp.hash}), {n} ticks"
        assert f"{line}, exact: byte-identical" in out, out
