"""One share of a bench stack run's agents, in a process of its own.

The ``openai`` SDK's clients cost far more CPU than the emulated nodes serving them, so a run splits
its agents over a few processes and keeps the fleet (nodes, faults, worker manager) in the bench's
own: neither event loop then lags behind the fleet it emulates. Each process runs
:class:`fleetloop.edges.fleet.agents.Agents` against the arm's router URL at ``rate_scale`` of the
scenario's arrival rates (Poisson arrivals split over processes add back to the scenario's), with a
seed of its own, on the fleet's clock (:meth:`LiveFleet.start_clock`: fleet time is the same in
every process) and with the scenario's load spikes.

Protocol, one JSON object a line on standard output: ``{"type": "ready"}`` once imported; then it
reads ``{"start_t": T}`` (fleet time the load begins) on standard input; ``progress`` lines every
few seconds; one ``result`` at the end: the agents' counts, per-second samples (cumulative tasks
succeeded and calls failed, the TTFTs of calls that completed in that second) and its event loop's
lag.

    python -m fleetloop.bench.stack.agents_proc SPEC.json
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

from fleetloop.edges.fleet.agents import Agents
from fleetloop.edges.fleet.live import LiveFleet, _Lag, probe_loop_lag
from fleetloop.sim.scenario import parse_scenario

PROGRESS_EVERY_S = 5.0
SAMPLE_S = 1.0
AGENT_FAULTS = ("load_spike",)  # the faults that act on the agents; the fleet's process has the rest


def _say(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


async def _run(spec: dict[str, Any]) -> dict[str, Any]:
    scenario = parse_scenario(spec["scenario"], "<bench stack>")
    fleet = LiveFleet(scenario, seed=int(spec["seed"]))
    fleet.start_clock(float(spec["t0"]))
    agents = Agents(fleet, router_url=str(spec["router_url"]), rate_scale=float(spec["rate_scale"]))
    _say({"type": "ready"})
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    start_t = float(json.loads(line)["start_t"])
    await asyncio.sleep(max(0.0, start_t - fleet.t()))
    fleet.schedule_faults(at=start_t, kinds=AGENT_FAULTS)
    stop = asyncio.Event()
    lag = _Lag()
    ok: list[int] = []
    failed: list[int] = []
    ttft: list[list[float]] = []

    def sample() -> None:
        s = agents.stats
        seen = sum(len(x) for x in ttft)
        ok.append(s.tasks_succeeded)
        failed.append(s.errors + s.timeouts + s.shed)
        ttft.append([round(v, 1) for v in s.ttft_ms[seen:]])

    async def sampler() -> None:
        k = 1
        last_progress = 0.0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, start_t + k * SAMPLE_S - fleet.t()))
            if stop.is_set():
                return
            sample()
            k += 1
            if fleet.t() - last_progress >= PROGRESS_EVERY_S:
                last_progress = fleet.t()
                s = agents.stats
                _say({
                    "type": "progress", "ok": s.tasks_succeeded, "failed": s.tasks_failed,
                    "in_flight": agents.in_flight, "lag_p99_ms": lag.report()["p99_ms"],
                })  # fmt: skip

    bg = [asyncio.create_task(probe_loop_lag(lag, stop)), asyncio.create_task(sampler())]
    try:
        await agents.run(start_t + float(spec["seconds"]), float(spec["drain_s"]))
    finally:
        stop.set()
        await asyncio.gather(*bg, return_exceptions=True)
    sample()  # the tail since the last whole second
    return {
        "type": "result",
        "stats": dataclasses.asdict(agents.stats),
        "ok_tasks": ok,
        "failed_calls": failed,
        "ttft": ttft,
        "loop_lag": lag.report(),
        "end_t": fleet.t(),
    }


def main(argv: list[str]) -> int:
    # A client that gives up mid-answer is counted as a timeout; its library noise is not printed.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    spec = json.loads(Path(argv[0]).read_text())
    _say(asyncio.run(_run(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
