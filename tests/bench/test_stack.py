"""``fleetloop bench stack`` smoke runs: real emulated fleet, real vllm-router, real HAProxy, a real
daemon and scraper on the embedded broker, the openai SDK in agent processes, short. Checks the
table is written with sane figures, and that an arm in which no task succeeds fails the command
(exit 1) instead of printing a table that looks like a result."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fleetloop import clock
from fleetloop.bench.stack.arms import haproxy_config
from tests.support.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "stack" / "degraded-gpu-small.yaml"
VLLM_ROUTER = Path(sys.executable).parent / "vllm-router"

pytestmark = [
    pytest.mark.skipif(not VLLM_ROUTER.exists(), reason="vllm-router (the dev extra)"),
]


def _bench(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetloop.cli.main", "bench", "stack", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


def _short_run(arms: str, out: Path) -> tuple[dict[str, Any], str]:
    """A 15 s run of ``arms`` on the small degraded-GPU fleet, one run each: its JSON and its stderr
    (exit 0 asserted)."""
    r = _bench(
        "--scenario", str(SCENARIO), "--seconds", "15", "--drain-s", "10", "--runs", "1",
        "--arms", arms, "--out", str(out), "--json", "--max-lag-ms", "1000",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout), r.stderr


@pytest.mark.system  # a benchmark run
def test_two_arms_write_a_table_with_sane_figures(tmp_path: Path) -> None:
    require_tool("haproxy")
    doc, stderr = _short_run("vllm-p2c,fleetloop-haproxy", tmp_path)
    stem = tmp_path / "stack-degraded-gpu-small"
    assert json.loads(Path(f"{stem}.json").read_text())["runs_raw"] == doc["runs_raw"]
    md = Path(f"{stem}.md").read_text()
    assert Path(f"{stem}.png").stat().st_size > 10_000
    assert Path(f"{stem}-arms.png").stat().st_size > 10_000  # medians and ranges against the targets
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", doc["made_by"]["commit"])
    assert doc["made_by"]["command"] == doc["command"]
    assert set(doc["made_by"]["load"]) == {"start", "end"}
    assert f"Command: `fleetloop bench stack --scenario {SCENARIO} --seconds 15" in md  # what made it
    assert re.search(r"`, commit [0-9a-f]{12}(-dirty)?, run 20\d\d-\d\d-\d\d \d\d:\d\d UTC", md), (
        md
    )  # and when
    assert [a["arm"] for a in doc["runs_raw"]] == ["vllm-p2c", "fleetloop-haproxy"]
    assert "tasks ok" in stderr  # progress lines
    # a 25 s run is shorter than the peers' 300 s scale-down stabilization: said before and in the file
    assert doc["peer_scale_in_hold_s"] == 300.0
    assert "peers cannot scale in within it" in stderr
    assert "peers cannot scale in within it" in md
    assert "[1/2] about" in stderr  # where the bench is, and what is left
    assert "[2/2] about" in stderr
    assert "| 1 | vllm-p2c | 1 |" in md  # every run, in the order it ran
    assert "| 2 | fleetloop-haproxy | 1 |" in md
    for arm in doc["runs_raw"]:
        assert f"| {arm['arm']} | 1 |" in md
        t = arm["tasks"]
        assert t["succeeded"] > 0
        assert 0 < t["success_rate"] <= 1
        assert t["p0_succeeded"] + t["p0_failed"] > 0
        assert arm["requests"]["sent"] >= t["succeeded"]
        assert 1.0 < arm["latency"]["ttft_p50_ms"] <= arm["latency"]["ttft_p99_ms"] < 60_000
        assert 0 < arm["cost_per_successful_task_usd"] < 1.0
        assert arm["realtime_lag"]["node_events"]["n"] > 0
        assert arm["realtime_lag"]["agents_loop_p99_ms"] is not None
        assert arm["timeline"]["ok_tasks"][-1] == t["succeeded"]
        assert arm["timeline"]["nodes_provisioned"][0] == 4
        # why the node count moved: the accepted autoscale targets, on change (both arms run a daemon)
        assert arm["autoscale"], arm["arm"]
        assert all(e["desired"] >= 0 and isinstance(e["reason"], str) for e in arm["autoscale"])
    assert doc["targets"]["headline"]["ours"] == "fleetloop-haproxy"
    # every process of the run is gone
    for arm in doc["runs_raw"]:
        pids = subprocess.run(["pgrep", "-f", arm["logs"]], capture_output=True, text=True, check=False)
        assert not pids.stdout.strip(), pids.stdout


OUTCOMES_LINE = re.compile(
    r"outcomes: (\d+) translated .*; published (\d+), dropped (\d+), failed (\d+); not published: "
    r"(\d+) calls of unmapped workers, (\d+) of unknown outcome labels, (\d+) capped, (\d+) in gaps; "
    r"(\d+) counter resets, (\d+) hostile values"
)


@pytest.mark.system  # a benchmark run
def test_fleetloop_driving_vllm_router_and_sglang_router_sees_their_calls(tmp_path: Path) -> None:
    """The arms where fleetloop drives vllm-router and SGLang's router, end to end through the bench:
    each router proxies the agents' calls, its actuator reads the router's outcome counters and
    publishes one RequestOutcome per call it counted (every counted call on a mapped worker, none
    hostile or dropped), and the daemon's autoscale targets reach the fleet. Without the actuator's
    ``--metrics-url`` the daemon would see no call at all from these routers."""
    doc, _ = _short_run("fleetloop-vllm,fleetloop-sglang", tmp_path)
    assert [a["arm"] for a in doc["runs_raw"]] == ["fleetloop-vllm", "fleetloop-sglang"]
    for arm in doc["runs_raw"]:
        name, t, req = arm["arm"], arm["tasks"], arm["requests"]
        assert t["succeeded"] > 0, name
        assert arm["autoscale"], name  # the fleet's worker manager heard the daemon
        log = (Path(arm["logs"]) / "actuate.log").read_text(errors="replace")
        lines = OUTCOMES_LINE.findall(log)
        assert lines, (name, log[-2000:])
        translated, published, dropped, failed, unmapped, unread, capped, gaps, resets, hostile = map(
            int, lines[-1]
        )
        assert published == translated, (name, lines[-1])
        lost = (dropped, failed, unmapped, unread, capped, gaps, resets, hostile)
        assert lost == (0,) * 8, (name, lines[-1])
        # one outcome per call the router proxied: no more than the agents sent, about what came back
        assert 0.9 * req["ok"] <= published <= req["sent"], (name, published, req)


@pytest.mark.system  # a benchmark run
def test_an_arm_with_no_successful_task_fails_the_run(tmp_path: Path) -> None:
    """Every node crashes as load begins: HAProxy has nothing to send to, no task can succeed."""
    require_tool("haproxy")
    doc = SCENARIO.read_text().split("faults:")[0]
    doc += "faults:\n  - {at_s: 0, kind: crash, pool: chat-l40s, count: 4}\n"
    scen = tmp_path / "dead.yaml"
    scen.write_text(doc)
    r = _bench("--scenario", str(scen), "--seconds", "6", "--drain-s", "5", "--arms", "haproxy-leastconn",
               "--runs", "1", "--out", str(tmp_path / "out"), "--json", "--max-lag-ms", "1000")  # fmt: skip
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "no successful task under haproxy-leastconn" in r.stderr
    arm = json.loads(r.stdout)["runs_raw"][0]
    assert arm["tasks"]["succeeded"] == 0
    assert arm["tasks"]["failed"] > 0


def test_haproxy_config_has_health_checks_and_leastconn(tmp_path: Path) -> None:
    cfg = haproxy_config(tmp_path, 8000, None, [("s0", "127.0.0.1:9000"), ("s1", "127.0.0.1:9001")])
    assert "balance leastconn" in cfg
    assert "\n    option http-no-delay\n" in cfg  # a streamed token is not held ~200 ms for more
    assert "option httpchk GET /health" in cfg
    assert cfg.count("check inter 1s fall 2 rise 2") == 2
    assert "log 127.0.0.1" not in cfg  # classic: no log for a control plane
    assert "log 127.0.0.1:5140" in haproxy_config(tmp_path, 8000, 5140, [("s0", "127.0.0.1:9000")])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", str(SCENARIO), "--arms", "nginx"], "unknown arm"),
        (["--scenario", str(ROOT / "scenarios" / "steady-chat.yaml")], "one pool"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetloop.cli.main import main

    assert main(["bench", "stack", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fleetloop bench stack: ")
    assert message in err
    assert "\n" not in err  # one line, no traceback


def test_the_stack_scenarios_load_with_one_pool_and_one_model() -> None:
    from fleetloop.sim.scenario import load_scenario

    for f in sorted((ROOT / "scenarios" / "stack").glob("*.yaml")):
        s = load_scenario(f)
        assert len(s.pools) == 1, f
        assert len({m for w in s.workload for m in w.models}) == 1, f


@pytest.mark.parametrize("arm", ["vllm-p2c", "haproxy-leastconn"])
def test_a_router_port_taken_before_the_router_binds_it_is_retried_on_a_fresh_one(
    arm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first port handed out is held by another socket (as an outgoing connection of the fleet or
    the broker can take a picked port before the router binds it): the start is retried on fresh
    ports, and the failed attempt's log is kept."""
    if arm.startswith("haproxy"):
        require_tool("haproxy")
    from aiohttp import web
    from fleetloop.bench.stack import procs as procs_mod
    from fleetloop.bench.stack.arms import BY_NAME, Launch, Slots
    from tests.support.http import nodes

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = int(held.getsockname()[1])
    real, handed = procs_mod.free_port, iter([taken])
    monkeypatch.setattr(procs_mod, "free_port", lambda kind=socket.SOCK_STREAM: next(handed, 0) or real(kind))
    router = BY_NAME[arm].router

    def answer(node: str) -> Any:
        async def reply(_: web.Request) -> web.Response:
            return web.json_response({"data": [], "node": node})

        return reply

    async def start() -> int:
        async with nodes(2, answer) as ports:  # vllm-router's power of two needs two workers
            urls = {f"p/{i}": f"http://127.0.0.1:{p}" for i, p in enumerate(ports)}
            slots = Slots("p", "m", urls)
            procs: dict[str, asyncio.subprocess.Process] = {}
            try:
                port = await procs_mod.start_answering(
                    "router", lambda port: router.argv(Launch(port, urls, slots, tmp_path, None)),
                    router.probe, tmp_path, procs,
                )  # fmt: skip
            finally:
                for p in procs.values():
                    await procs_mod.stop(p)
            return port

    try:
        port = asyncio.run(start())
    finally:
        held.close()
    assert port != taken
    first = (tmp_path / "router-attempt1.log").read_text(errors="replace")
    assert any(m in first for m in procs_mod.BIND_FAILED), first[-1000:]


def test_through_sglang_router_the_nodes_see_each_prompts_size_and_prefix(tmp_path: Path) -> None:
    """SGLang's router forwards none of the client's headers, so the agents' prompts go as text of
    their real size with the shared prefix in it: behind it, the node is sent prompts of the
    scenario's size (thousands of tokens, not the few of a short message) and their prefixes."""
    from fleetloop.bench.stack.arms import BY_NAME, Launch, Slots
    from fleetloop.bench.stack.procs import start_answering, stop
    from fleetloop.edges.fleet.agents import Agents
    from fleetloop.edges.fleet.live import LiveFleet
    from fleetloop.sim.scenario import load_scenario

    s = load_scenario(ROOT / "scenarios" / "stack" / "prefix-small.yaml")
    s = s.model_copy(
        update={"pools": [s.pools[0].model_copy(update={"nodes": 1, "min_nodes": 1, "max_nodes": 1})]}
    )
    router = BY_NAME["sglang-cache-aware"].router

    async def go() -> list[tuple[int, str | None, int]]:
        fleet = LiveFleet(s, seed=5)
        await fleet.start()
        seen: list[tuple[int, str | None, int]] = []
        real = fleet.submit
        fleet.submit = lambda ln, req: (
            seen.append((req.prompt, req.prefix_digest, req.prefix_tokens)),
            real(ln, req),
        )[1]  # type: ignore[method-assign]
        urls = fleet.urls()
        slots = Slots(s.pools[0].id, s.pools[0].model, dict(urls))
        procs: dict[str, asyncio.subprocess.Process] = {}
        try:
            port = await start_answering(
                "router", lambda p: router.argv(Launch(p, dict(urls), slots, tmp_path, None)),
                router.probe, tmp_path, procs,
            )  # fmt: skip
            agents = Agents(fleet, router_url=f"http://127.0.0.1:{port}", rate_scale=10.0)
            await agents.run(fleet.t() + 3.0, 0.0)
        finally:
            for p in procs.values():
                await stop(p)
            await fleet.stop()
        return seen

    seen = asyncio.run(go())
    assert seen
    assert min(p for p, _, _ in seen) > 500  # the scenario's prompts: median 7,000, never a few tokens
    assert all(d is not None and 0 < k < p for p, d, k in seen)


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now (from /proc: each process's parent)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    below: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - below
        below |= frontier
    return below


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.system  # a benchmark run, stopped mid-run
def test_sigterm_mid_run_stops_the_broker_and_every_process_of_the_run(tmp_path: Path) -> None:
    """A supervisor's SIGTERM stops the bench as Ctrl-C does: the embedded broker, the daemon, the
    scraper, the router and the agents all go with it (Python's default exit left the broker and the
    router running, holding their ports and a core between them)."""
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetloop.cli.main", "bench", "stack", "--scenario", str(SCENARIO),
         "--seconds", "60", "--drain-s", "10", "--runs", "1", "--arms", "vllm-p2c", "--out", str(tmp_path),
         "--max-lag-ms", "1000"],
        cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    lines = []
    kids: set[int] = set()
    try:
        for line in proc.stderr:  # until the load runs: broker, daemon, scraper, router, agents up
            lines.append(line)
            if "tasks ok" in line:
                kids = _descendants(proc.pid)
                break
        assert len(kids) >= 4, "".join(lines)[-2000:]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = clock.monotonic_s() + 10
    while clock.monotonic_s() < deadline and any(_alive(p) for p in kids):
        time.sleep(0.2)
    assert not [p for p in kids if _alive(p)], "".join(lines)[-2000:]
