"""``fleetloop bench stack --overhead``: what each arm's router adds to a streamed call's time to
first token, before any figure through it is compared.

Two idle emulated nodes of the scenario's pool; each distinct router of the chosen arms is started
over them as its peer arm runs it (no control plane, no load) and ``--overhead-calls`` streamed chat
calls with the ``openai`` SDK go one at a time, alternating between node 0 directly and the router,
so drift falls on both alike. The figure is the router's TTFT p50 minus the direct one. With a
HAProxy arm, HAProxy is also measured without ``option http-no-delay``
(:data:`fleetloop.edges.actuate.haproxy.logs.HAPROXY_STREAMING_DEFAULTS`): the delay it removes.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai

from fleetloop.bench.stack.arms import Arm, Haproxy, Launch, Router, Slots
from fleetloop.bench.stack.procs import Procs, start_answering, stop
from fleetloop.edges.fleet.live import LiveFleet
from fleetloop.edges.fleet.server import prompt_text
from fleetloop.sim.scenario import Scenario

PROMPT_TOKENS = 100
MAX_TOKENS = 20
WARM_S = 2.5  # a router's first health checks pass (HAProxy: rise 2 at 1 s)


def routers_of(arms: list[Arm]) -> list[tuple[str, Router]]:
    """Each distinct router of ``arms`` once, labelled; HAProxy also without http-no-delay."""
    out: list[tuple[str, Router]] = []
    for arm in arms:
        if arm.router not in [r for _, r in out]:
            out.append((arm.name.removeprefix("fleetloop-"), arm.router))
    for _, r in list(out):
        if isinstance(r, Haproxy):
            out.append((f"haproxy-{r.balance} without http-no-delay", Haproxy(r.balance, no_delay=False)))
    return out


def _argv(router: Router, urls: dict[str, str], slots: Slots, logdir: Path) -> Callable[[int], list[str]]:
    return lambda port: router.argv(Launch(port, dict(urls), slots, logdir, None))


async def _ttft(api: openai.AsyncOpenAI, model: str) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    text = prompt_text(PROMPT_TOKENS, None, 0, "hello")  # its size in its text: no header needed
    stream = await api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=MAX_TOKENS, stream=True
    )
    first: float | None = None
    async for chunk in stream:
        if first is None and chunk.choices:
            first = (loop.time() - start) * 1000.0
    assert first is not None, "a stream without a choice"
    return first


def _stats(v: list[float]) -> dict[str, float]:
    s = sorted(v)
    return {"p50_ms": round(statistics.median(s), 1), "p90_ms": round(s[int(0.9 * (len(s) - 1))], 1)}


async def overhead(scenario: Scenario, arms: list[Arm], calls: int) -> dict[str, Any]:
    pool = scenario.pools[0].model_copy(update={"nodes": 2, "min_nodes": 2, "max_nodes": 2})
    two = scenario.model_copy(update={"pools": [pool], "faults": []})
    fleet = LiveFleet(two, seed=scenario.seed)
    await fleet.start(faults=False)
    urls = fleet.urls()
    slots = Slots(pool.id, pool.model, dict(urls))
    http = openai.DefaultAsyncHttpxClient()
    rows: list[dict[str, Any]] = []
    try:
        direct_api = openai.AsyncOpenAI(
            base_url=f"{urls[f'{pool.id}/0']}/v1", api_key="x", max_retries=0, http_client=http
        )
        for label, router in routers_of(arms):
            logdir = Path(tempfile.mkdtemp(prefix="fleetloop-stack-overhead-"))
            procs: Procs = {}
            try:
                port = await start_answering(
                    "router", _argv(router, urls, slots, logdir), router.probe, logdir, procs,
                    env=router.env(Launch(0, dict(urls), slots, logdir, None)),
                )  # fmt: skip
                await asyncio.sleep(WARM_S)
                api = openai.AsyncOpenAI(
                    base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, http_client=http
                )
                direct: list[float] = []
                routed: list[float] = []
                for _ in range(calls):
                    direct.append(await _ttft(direct_api, pool.model))
                    routed.append(await _ttft(api, pool.model))
            finally:
                for p in procs.values():
                    await stop(p)
            d, r = _stats(direct), _stats(routed)
            rows.append(
                {
                    "router": label,
                    "direct": d,
                    "routed": r,
                    "added_p50_ms": round(r["p50_ms"] - d["p50_ms"], 1),
                }
            )
    finally:
        await http.aclose()
        await fleet.stop()
    return {"scenario": scenario.name, "calls": calls, "prompt_tokens": PROMPT_TOKENS, "routers": rows}


def overhead_markdown(doc: dict[str, Any]) -> str:
    rows = "".join(
        f"| {r['router']} | {r['direct']['p50_ms']} | {r['routed']['p50_ms']} | {r['routed']['p90_ms']} "
        f"| {r['added_p50_ms']:+.1f} |\n"
        for r in doc["routers"]
    )
    return (
        f"## bench stack --overhead — {doc['scenario']}: TTFT added by each router's data path\n\n"
        f"{doc['calls']} streamed calls ({doc['prompt_tokens']}-token prompts) through each router to two "
        "idle nodes, alternating with the same calls straight to a node.\n\n"
        "| router | direct TTFT p50 ms | through the router p50 ms | p90 ms | added p50 ms |\n"
        "|---|---|---|---|---|\n" + rows + f"\nCommand: `{doc['command']}`, commit {doc['commit']}, "
        f"run {doc['date_utc']}, load average {doc['load']}.\n"
    )
