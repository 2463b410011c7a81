"""The README's operator journey ("An operator's first day, end to end") on Apache Kafka, every line
run as written there, as its own process, in order: ``make kafka-up``, the daemon, the emulated
fleet and its scraper, policy status / apply / rollback, a shadow and its compare, replay by time
(with the recorded policy file, across two policy changes), by offsets and by consumer group,
whatif, HAProxy with the actuator through a quiet period without telemetry, SIGTERM, and
``make kafka-down``.

The lines are read from the README, so a line that stops working fails here. Ports and paths
differ from the README's (free ports, a temp dir): the substitutions are listed in ``Journey.sub``
and nothing else of a line changes. The test starts its own broker with ``make kafka-up`` (that is
the step under test) and does not use the session's brokers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fleetloop import clock
from fleetloop.daemon.brokers import local
from fleetloop.daemon.replay.command import read_topic
from fleetloop.edges.actuate.haproxy.mapping import parse_servers_state
from fleetloop.edges.actuate.haproxy.runtime_api import RuntimeApi
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.topics import DECISIONS, SHADOW
from tests.support.journey import REPO, readme_lines
from tests.support.tools import require_tool
from tests.support.wait import wait_until_sync

BIN = Path(sys.executable).parent
README_PORTS = {"kafka": 9092, "http": 8080, "fleet": 8100, "haproxy": 8000, "log": 5514}
README_SOCKET = "/tmp/fleetloop-haproxy.sock"
V3_TICKS = 4  # ticks decided under v3 before v4 is applied (the replay compares all but the first)


def _free_tcp(count: int = 1) -> int:
    """The first of ``count`` consecutive loopback TCP ports free right now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + count > 65000:
            continue
        ok = True
        for p in range(base, base + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range")


def _free_udp() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Journey:
    tmp: Path
    ports: dict[str, int]
    env: dict[str, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=readme_lines)
    used: list[str] = field(default_factory=list)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def sub(self, text: str) -> str:
        """The README line with this run's ports and paths: the broker port, the daemon's HTTP port,
        the fleet's base port (and the next two), HAProxy's frontend, log port and socket, and the
        files that ``make`` and HAProxy are given."""
        p, r = self.ports, README_PORTS
        pairs = [
            (f"127.0.0.1:{r['http']}", f"127.0.0.1:{p['http']}"),
            (f"--http-port {r['http']}", f"--http-port {p['http']}"),
            (f"--base-port {r['fleet']}", f"--base-port {p['fleet']}"),
            *((f"127.0.0.1:{r['fleet'] + i}", f"127.0.0.1:{p['fleet'] + i}") for i in range(3)),
            (f"127.0.0.1:{r['haproxy']}", f"127.0.0.1:{p['haproxy']}"),
            (f"127.0.0.1:{r['log']}", f"127.0.0.1:{p['log']}"),
            (README_SOCKET, str(self.tmp / "admin.sock")),
            ("-f examples/operator/haproxy.cfg", "-f haproxy.cfg"),
        ]
        for old, new in pairs:
            text = text.replace(old, new)
        if text == "make kafka-up" or text == "make kafka-down":
            target = text.split()[1]
            text = (
                f"make -s -C {REPO} -o .venv/.installed {target} BIN={BIN} "
                f"KAFKA_PORT={p['kafka']} KAFKA_DIR={self.tmp / 'kafka'}"
            )
        return text

    def line(self, prefix: str) -> str:
        found = [ln for ln in self.lines if ln.startswith(prefix)]
        assert len(found) == 1, f"README: {len(found)} lines start with {prefix!r}: {found}"
        self.used.append(found[0])
        return found[0]

    def _bash(self, text: str) -> list[str]:
        return ["bash", "-c", text]

    def run(self, prefix: str, *, extra: str = "", timeout: float = 120) -> subprocess.CompletedProcess[str]:
        text = self.sub(self.line(prefix)) + extra
        return subprocess.run(
            self._bash(text),
            cwd=self.tmp,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self, prefix: str, name: str) -> subprocess.Popen[bytes]:
        """A line that ends in ``&``: the shell execs the command (its redirections applied), so the
        process is the command itself and SIGTERM reaches it."""
        text = self.sub(self.line(prefix))
        assert text.endswith("&"), text
        cmd = text[:-1].strip()
        out = (self.tmp / f"{name}.stdout").open("wb")
        proc = subprocess.Popen(
            self._bash(f"exec {cmd}"),
            cwd=self.tmp,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        self.procs[name] = proc
        return proc

    def alive(self, *names: str) -> None:
        for n in names:
            code = self.procs[n].poll()
            assert code is None, f"{n} exited with {code}: {self.log(n)}"

    def log(self, name: str) -> str:
        text = ""
        for path in (self.tmp / f"{name}.stdout", self.tmp / f"{name}.log"):
            if path.exists():
                text += path.read_text(errors="replace")[-3000:]
        return text


def _ok(done: subprocess.CompletedProcess[str], what: str) -> str:
    assert done.returncode == 0, (
        f"{what}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def _decisions(bs: str, logical: str) -> list[Decision]:
    parts = asyncio.run(read_topic(bs, "", logical))
    return [Decision.model_validate_json(r.value) for rs in parts.values() for r in rs if r.value]


def _tick_of(out: str) -> int:
    m = re.search(r"active from tick (\d+)", out)
    assert m, out
    return int(m.group(1))


@contextlib.contextmanager
def _cleanup(j: Journey) -> Iterator[None]:
    """Whatever happens, every process this test started is stopped (by its pid) and so is its
    broker (``kafka-down`` on its directory)."""
    try:
        yield
    finally:
        for proc in j.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        with contextlib.suppress(Exception):
            local.down(j.tmp / "kafka", 20.0)


async def _traffic(url: str, seconds: float) -> tuple[int, int]:
    """Calls through HAProxy for ``seconds``, two at a time: (answered 200, sent)."""
    ok = sent = 0
    body = {"model": "llama-8b", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    headers = {"x-fleetloop-tenant": "free"}
    deadline = clock.monotonic_s() + seconds
    async with httpx.AsyncClient(timeout=10.0) as client:

        async def one() -> None:
            nonlocal ok, sent
            while clock.monotonic_s() < deadline:
                sent += 1
                with contextlib.suppress(httpx.HTTPError):
                    r = await client.post(url, json=body, headers=headers)
                    ok += r.status_code == 200
                await asyncio.sleep(0.1)

        await asyncio.gather(one(), one())
    return ok, sent


async def _watch_slots(
    api: RuntimeApi, backend: str, stop: asyncio.Event, seen: list[dict[str, str]]
) -> None:
    while not stop.is_set():
        with contextlib.suppress(Exception):
            state = parse_servers_state(await api.show_servers_state())
            seen.append({s: o.admin for (b, s), o in sorted(state.items()) if b == backend})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


async def _haproxy_phases(fe: int, sock: Path) -> dict[str, Any]:
    """Traffic for 6 s (the pool's only input: HAProxy's log), a quiet period of 12 s (no traffic, no
    telemetry: past the stale-telemetry bound, 5 s, and the figures' window, 10 s), traffic for 5 s;
    the servers' admin states sampled throughout."""
    api = RuntimeApi(f"unix:{sock}")
    url = f"http://127.0.0.1:{fe}/v1/chat/completions"
    seen: list[dict[str, str]] = []
    stop = asyncio.Event()
    watch = asyncio.create_task(_watch_slots(api, "edge", stop, seen))
    try:
        first = await _traffic(url, 6.0)
        await asyncio.sleep(12.0)  # the quiet period itself: nothing is sent, nothing is reported
        after = await _traffic(url, 5.0)
    finally:
        stop.set()
        await watch
    emptied = [s for s in seen if s and all(a == "maint" for a in s.values())]
    return {"first": first, "after_quiet": after, "samples": len(seen), "all_maint_samples": len(emptied)}


@pytest.mark.system  # the whole journey, its own broker, minutes
@pytest.mark.timeout(600)
def test_the_operator_journey_in_the_readme_runs_on_apache_kafka(tmp_path: Path) -> None:
    require_tool("haproxy")
    ports = {
        "kafka": _free_tcp(2),
        "http": _free_tcp(),
        "fleet": _free_tcp(3),
        "haproxy": _free_tcp(),
        "log": _free_udp(),
    }
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("FLEETLOOP_") or k == "FLEETLOOP_KAFKA_HOME"
    }
    bs = f"127.0.0.1:{ports['kafka']}"
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", BS=bs)
    for name in ("examples", "policies"):
        (tmp_path / name).symlink_to(REPO / name)
    j = Journey(tmp_path, ports, env)
    cfg = (REPO / "examples/operator/haproxy.cfg").read_text()
    (tmp_path / "haproxy.cfg").write_text("\n".join(j.sub(ln) for ln in cfg.splitlines()) + "\n")
    default = builtin_policy("default").stamp
    assert default.version == 3, "the README's walk-through starts on the built-in default v3"
    started = clock.monotonic_s()

    with _cleanup(j):
        # Kafka, the daemon, a fleet.
        out = _ok(j.run("make kafka-up", timeout=180), "make kafka-up")
        assert f"is up on {bs}" in out, out
        assert "already runs" in _ok(j.run("make kafka-up"), "make kafka-up again")
        assert j.line("export BS=127.0.0.1:9092")
        j.start("fleetloop run ", "daemon")
        _ok(j.run("until curl -fsS 127.0.0.1:8080/healthz", timeout=120), "the daemon up (/healthz 200)")
        j.start("fleetloop fleet ", "fleet")
        j.start("fleetloop scrape ", "scrape")

        def ready() -> bool:
            j.alive("daemon", "fleet", "scrape")
            return j.run("curl -fsS 127.0.0.1:8080/readyz").returncode == 0

        wait_until_sync(ready, 120, "the daemon ready (/readyz 200)", interval_s=0.5)
        j.alive("daemon", "fleet", "scrape")
        # Readiness needs no decision, so v4 could go in before v3 decided a tick; the replay below
        # compares from the tick after the first decided one, and would then find no v3 stretch.
        wait_until_sync(
            lambda: len({d.tick_id for d in _decisions(bs, DECISIONS)}) >= V3_TICKS,
            60,
            f"{V3_TICKS} ticks decided under v3",
            interval_s=0.5,
        )

        # Policy: status, apply, rollback.
        out = _ok(j.run("fleetloop policy status"), "policy status")
        assert f"default v3  hash {default.hash}" in out, out
        _ok(j.run("sed -e 's/version: 3/version: 4/'"), "sed v4")
        out = _ok(j.run("fleetloop policy apply default-v4.yaml"), "policy apply")
        assert "default v4" in out, out
        t4 = _tick_of(out)
        first_tick = min(d.tick_id for d in _decisions(bs, DECISIONS))

        def decided_through(tick: int, logical: str = DECISIONS) -> Callable[[], bool]:
            return lambda: max((d.tick_id for d in _decisions(bs, logical)), default=0) >= tick

        wait_until_sync(decided_through(t4 + 3), 30, f"ticks decided past v4's tick {t4}", interval_s=0.5)
        out = _ok(j.run("fleetloop policy rollback"), "policy rollback")
        assert "rolled back" in out, out
        assert "default v5" in out, out
        t5 = _tick_of(out)
        wait_until_sync(decided_through(t5 + 3), 30, f"ticks decided past v5's tick {t5}", interval_s=0.5)

        # A shadow and its compare.
        _ok(j.run("sed -e 's/version: 3/version: 6/'"), "sed shadow")
        out = _ok(j.run("fleetloop policy apply shadow-v6.yaml"), "shadow apply")
        assert "shadow default v6" in out, out
        t6 = _tick_of(out)
        wait_until_sync(decided_through(t6 + 8, SHADOW), 40, "eight ticks of the shadow", interval_s=0.5)
        compare_line = "fleetloop policy compare"
        cmp = json.loads(_ok(j.run(compare_line, extra=" --json"), "compare --json"))
        text = _ok(j.run(compare_line), "compare")
        j.used.pop()  # the same README line twice
        v5_hash = next(d.policy.hash for d in _decisions(bs, DECISIONS) if d.policy.version == 5)
        assert [(s["version"], s["hash"]) for s in cmp["enforced_stretches"]] == [(5, v5_hash)], cmp
        assert [s["version"] for s in cmp["shadow_stretches"]] == [6], cmp
        assert cmp["by_kind"]["breaker"]["differ"] == 0, cmp["by_kind"]["breaker"]
        assert cmp["by_kind"]["breaker"]["compared"] > 0, cmp["by_kind"]["breaker"]
        assert re.search(rf"enforced +ticks \d+-\d+: default v5 \({v5_hash}\)", text), text
        assert "default v3" not in text, text
        assert "default v4" not in text, text
        out = _ok(j.run("fleetloop policy remove-shadow"), "remove-shadow")
        assert "removed shadow default v6" in out, out

        # Replay by time, with the recorded policy file, across v3 -> v4 -> v5.
        j.env.update(FROM=str(max(first_tick + 1, t4 - 10) * 1000), TO=str((t5 + 3) * 1000))
        by_time = "fleetloop replay --bootstrap-servers $BS --from $FROM"
        text = _ok(j.run(by_time), "replay by time")
        result = json.loads(_ok(j.run(by_time, extra=" --json"), "replay by time --json"))
        j.used.pop()
        since = int(j.env["FROM"]) // 1000  # a tick id is its boundary in epoch seconds (1 s ticks)
        v3 = {d.tick_id for d in _decisions(bs, DECISIONS) if d.policy.version == 3}
        assert max(v3) >= since, "no v3 tick in the replayed window: the journey applied v4 too early"
        assert result["mode"] == "mixed", result
        assert result["reproduced"] is True, result
        stretches = [(s["policy"]["version"], s["mode"]) for s in result["stretches"]]
        assert stretches == [(3, "exact"), (4, "what-if"), (5, "what-if")], result["stretches"]
        assert result["stretches"][0]["verdict"] == "byte-identical"
        assert result["stretches"][1]["from_tick"] == t4, result["stretches"]
        assert result["stretches"][2]["from_tick"] == t5, result["stretches"]
        assert re.search(
            rf"ticks \d+-{t4 - 1}: default v3 \({default.hash}\), \d+ ticks, exact: byte-identical", text
        ), text
        assert re.search(rf"ticks {t4}-{t5 - 1}: default v4 \(\w+\), \d+ ticks, what-if: ", text), text
        assert re.search(rf"ticks {t5}-\d+: default v5 \({v5_hash}\), \d+ ticks, what-if: ", text), text

        # By input offsets: the ticks of chat-l40s's partition from v4's tick to v5's.
        logged = _decisions(bs, DECISIONS)
        at = {d.tick_id: d for d in logged if getattr(d.body, "pool_id", "") == "chat-l40s"}
        (key,) = [k for k in at[t4].input_offsets if k.startswith("fleet.requests:")]
        lo, hi = at[t4].input_offsets[key], at[t5].input_offsets[key]
        assert hi > lo, (lo, hi)
        j.env.update(P=key.rsplit(":", 1)[1], LO=str(lo), HI=str(hi - 1))
        text = _ok(
            j.run("fleetloop replay --bootstrap-servers $BS --from fleet.requests"), "replay by offsets"
        )
        assert "fleetloop replay (exact): byte-identical" in text, text
        # Up to what the daemon's group has committed.
        text = _ok(j.run("fleetloop replay --bootstrap-servers $BS --to group:fleetloop"), "replay by group")
        assert "fleetloop replay (exact): byte-identical" in text, text
        # The candidate simulated over the window.
        whatif = json.loads(_ok(j.run("fleetloop whatif ", extra=" --json", timeout=240), "whatif"))
        assert whatif["candidate_policy"]["version"] == 4, whatif["candidate_policy"]

        # HAProxy in front of the same nodes, as pool `edge` (no telemetry ever), and the actuator.
        j.start("haproxy -f ", "haproxy")
        j.start("fleetloop actuate haproxy ", "actuate")
        wait_until_sync((tmp_path / "admin.sock").exists, 30, "HAProxy's runtime API", interval_s=0.5)
        wait_until_sync(
            lambda: j.run("curl -fsS 127.0.0.1:8000/v1/chat/completions").returncode == 0,
            30,
            "a first call through HAProxy",
            interval_s=0.5,
        )
        haproxy = asyncio.run(_haproxy_phases(ports["haproxy"], tmp_path / "admin.sock"))
        j.alive("daemon", "fleet", "scrape", "haproxy", "actuate")

        # SIGTERM: each process ends cleanly; the daemon says so.
        assert j.line("kill -TERM %1 %2 %3 %4 %5")
        for name in ("actuate", "haproxy", "scrape", "fleet", "daemon"):
            j.procs[name].send_signal(signal.SIGTERM)
        codes = {name: j.procs[name].wait(60) for name in ("actuate", "scrape", "fleet", "daemon")}
        j.procs["haproxy"].wait(30)
        assert codes == dict.fromkeys(codes, 0), (codes, {n: j.log(n)[-1500:] for n in codes})
        lines = [
            json.loads(x) for x in (tmp_path / "daemon.log").read_text().splitlines() if x.startswith("{")
        ]
        assert [x["event"] for x in lines if x["event"] in ("daemon started", "daemon stopped")] == [
            "daemon started",
            "daemon stopped",
        ]
        assert json.loads((tmp_path / "fleet.json").read_text())["tasks"]["started"] > 0
        stopped = [x for x in lines if x["event"] == "daemon stopped"]
        assert stopped[0]["checkpoints_written"] >= 1, stopped
        out = _ok(j.run("make kafka-down"), "make kafka-down")
        assert "stopped" in out, out
        # The data stays for the next kafka-up: the group's active policy is still v5.
        _ok(j.run("make kafka-up", timeout=180), "make kafka-up after kafka-down")
        out = _ok(j.run("fleetloop policy status"), "policy status after a broker restart")
        assert "group fleetloop: default v5" in out, out
        _ok(j.run("make kafka-down"), "make kafka-down")

    print(f"\noperator journey: {clock.monotonic_s() - started:.0f} s; HAProxy phases: {haproxy}")
    assert sorted(set(j.used)) == sorted(set(readme_lines())), "a README line the journey did not run"
    # Through HAProxy, with no telemetry for its pool, before and after a quiet period: the pool
    # keeps serving (it never has every slot in maint while the nodes answer).
    ok, sent = haproxy["first"]
    assert ok >= 0.9 * sent, haproxy
    ok, sent = haproxy["after_quiet"]
    assert ok >= 0.9 * sent, haproxy
    assert haproxy["all_maint_samples"] == 0, haproxy
