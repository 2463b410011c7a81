"""``fleetloop demo --wire``: the loop over the wire, every part its own process.

The broker (embedded Tansu unless ``--bootstrap-servers``), then four processes of the
``fleetloop`` command itself:

- ``fleetloop run``: the daemon;
- ``fleetloop fleet``: the demo scenario's four L40S nodes as HTTP servers (OpenAI API, vLLM
  ``/metrics``), its agents calling them with the openai SDK, its worker manager following
  ``control.state``; one GPU degrades a third of the way in;
- ``fleetloop scrape --runtime vllm``: the nodes' ``/metrics`` into ``fleet.telemetry``, as for a
  real vLLM fleet;
- this command, which reads ``control.state`` to print the breaker timeline.

With ``telemetry_only`` (``--wire-telemetry-only``) the agents publish no request outcomes: the
daemon sees nothing but scraped vLLM metrics, so a breaker that opens opened from them alone.
Children's logs go to files in a temp dir (named at the end), so no pipe can fill and stall them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition
from rich.console import Console
from rich.table import Table

from fleetloop import clock, term
from fleetloop.daemon.brokers import ensure_topics
from fleetloop.daemon.children import stop_child
from fleetloop.daemon.cli_common import UsageError
from fleetloop.kafka_security import error_text
from fleetloop.perf.catalog import GPU_MEMORY_UTIL, node_spec
from fleetloop.schemas import Decision
from fleetloop.schemas.topics import STATE, topic_name
from fleetloop.sim.scenario import Scenario

POOL = "chat-l40s"
STOP_GRACE_S = 30.0


def _child(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetloop.cli.main", *args]


async def _spawn(argv: list[str], logdir: Path, name: str) -> asyncio.subprocess.Process:
    out = (logdir / f"{name}.out").open("wb")
    err = (logdir / f"{name}.log").open("wb")
    try:
        return await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=err, start_new_session=True)
    finally:
        out.close()
        err.close()


async def _stop(proc: asyncio.subprocess.Process) -> None:
    await stop_child(proc, STOP_GRACE_S)


async def run_wire(
    scenario: Scenario,
    *,
    bootstrap: str,
    degraded_node: str,
    telemetry_only: bool,
    err: Console,
) -> dict[str, Any]:
    prefix = f"wire-{uuid.uuid4().hex[:8]}"
    try:
        await ensure_topics(bootstrap, prefix)
    except Exception as exc:
        raise UsageError(f"fleetloop demo: cannot use Kafka at {bootstrap}: {error_text(exc)}") from None
    logdir = Path(tempfile.mkdtemp(prefix="fleetloop-wire-"))
    scen_path = logdir / "scenario.yaml"
    scen_path.write_text(yaml.safe_dump(scenario.model_dump(mode="json", exclude_none=True), sort_keys=False))
    nodes_file = logdir / "nodes.json"
    pool = next(p for p in scenario.pools if p.id == POOL)
    spec = node_spec(pool.model, pool.gpu, pool.gpus_per_node)
    kv_gib = (spec.hbm_bytes * GPU_MEMORY_UTIL - spec.model.weight_bytes) / 2**30
    common = ["--bootstrap-servers", bootstrap, "--topic-prefix", prefix]
    err.print(f"wire demo: topics under [cyan]{prefix}[/cyan], logs in {logdir}")
    procs: dict[str, asyncio.subprocess.Process] = {}
    opened: list[dict[str, Any]] = []
    state_task: asyncio.Task[None] | None = None
    started_mono = clock.monotonic_s()
    try:
        procs["daemon"] = await _spawn(
            _child("run", *common, "--group-id", f"{prefix}-fleetloop"), logdir, "daemon"
        )
        fleet_args = ["fleet", "--scenario", str(scen_path), *common, "--nodes-file", str(nodes_file)]
        fleet_args += ["--json", "--drain-s", "20"]
        if telemetry_only:
            fleet_args.append("--no-outcomes")
        procs["fleet"] = await _spawn(_child(*fleet_args), logdir, "fleet")
        async with asyncio.timeout(60):
            while not nodes_file.exists():
                if procs["fleet"].returncode is not None:
                    raise UsageError(f"fleetloop demo: the fleet process exited; see {logdir / 'fleet.log'}")
                await asyncio.sleep(0.1)
        urls: dict[str, str] = json.loads(nodes_file.read_text())
        targets = ",".join(f"{nid}={url}" for nid, url in sorted(urls.items()))
        err.print(f"fleet up: {len(urls)} HTTP nodes ({', '.join(sorted(urls.values()))})")
        scrape_args = ["scrape", "--runtime", "vllm", "--pool", POOL, "--target", targets, *common]
        scrape_args += [
            "--gpu-type",
            pool.gpu,
            "--gpu-count",
            str(spec.gpus),
            "--usd-per-h",
            f"{spec.usd_per_h:.4f}",
        ]
        # The emulated nodes speak vLLM's /metrics whatever the scenario's engine: say which it is.
        scrape_args += ["--kv-gib", f"{kv_gib:.3f}", "--interval-s", "1", "--engine", pool.engine, "--json"]
        procs["scrape"] = await _spawn(_child(*scrape_args), logdir, "scrape")
        state_task = asyncio.create_task(_watch_state(bootstrap, prefix, opened, err, started_mono))
        fleet_rc = await procs["fleet"].wait()
        if fleet_rc != 0:
            raise UsageError(
                f"fleetloop demo: the fleet process failed ({fleet_rc}); see {logdir / 'fleet.log'}"
            )
        await asyncio.sleep(2.0)  # the last scrapes and ticks
    finally:
        if state_task is not None:
            state_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await state_task
        for name in ("scrape", "daemon", "fleet"):
            if name in procs:
                await _stop(procs[name])
    fleet = json.loads((logdir / "fleet.out").read_text() or "{}")
    scrape = json.loads((logdir / "scrape.out").read_text() or "{}")
    start_ms = fleet.get("start_wall_ms", 0)
    degrade_t = next((f["t_s"] for f in fleet.get("faults", []) if degraded_node in f["nodes"]), None)
    for o in opened:
        o["t_s"] = round((o["ts_ms"] - start_ms) / 1000.0, 1)
        o["after_degrade_s"] = round(o["t_s"] - degrade_t, 1) if degrade_t is not None else None
    return {
        "scenario": scenario.name,
        "topic_prefix": prefix,
        "logs": str(logdir),
        "telemetry_only": telemetry_only,
        "degraded_node": degraded_node,
        "degrade_at_s": degrade_t,
        "breaker_opens": opened,
        "fleet": {
            k: fleet.get(k) for k in ("tasks", "requests", "latency", "realtime_lag", "decisions_applied")
        },
        "scrape": scrape.get("targets", []),
    }


class BreakerOpens:
    """Each node's first enforced breaker open, read from ``control.state`` in order, with the reason
    the breaker opened it: the rule of the node's first open record. The engine may hold an ejection
    back (``latency-outlier:capacity-cap``, not enforced) and let it out a tick or more later, when
    the breaker's reason already reads ``latency-ejected``; ``held_back_by`` names the cap."""

    def __init__(self) -> None:
        self._first: dict[str, tuple[str, str | None]] = {}
        self._seen: set[str] = set()

    def feed(self, d: Decision) -> dict[str, Any] | None:
        b = d.body
        if b.kind != "breaker" or b.state != "open" or b.node_id in self._seen:
            return None
        rule, _, cap = b.reason.partition(":")
        first = self._first.setdefault(b.node_id, (rule, cap or None))
        if not b.enforced:
            return None
        self._seen.add(b.node_id)
        return {
            "node_id": b.node_id,
            "ts_ms": d.ts_ms,
            "reason": first[0],
            "held_back_by": first[1],
            "inputs": dict(b.inputs),
        }


async def _watch_state(
    bootstrap: str, prefix: str, opened: list[dict[str, Any]], err: Console, started: float
) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic_name(prefix, STATE), 0)])
        await consumer.seek_to_beginning()
        opens = BreakerOpens()
        while True:
            batch = await consumer.getmany(timeout_ms=500)
            for rs in batch.values():
                for r in rs:
                    if not r.value:
                        continue
                    d = Decision.model_validate_json(r.value)
                    o = opens.feed(d)
                    if o is not None:
                        opened.append(o)
                        why = ", ".join(
                            f"{k.replace('_', ' ')} {v:g}" for k, v in sorted(o["inputs"].items())
                        )
                        err.print(
                            f"[red]breaker OPEN[/red] {o['node_id']} {clock.monotonic_s() - started:.0f}s in "
                            f"({d.body.reason}: {why})",
                            soft_wrap=True,
                        )
    finally:
        await consumer.stop()


def print_wire(r: dict[str, Any]) -> None:
    out = term.console()
    t = Table(title=f"fleetloop demo --wire — {r['scenario']}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    f = r["fleet"]
    tasks, lat, lag = (
        f.get("tasks") or {},
        f.get("latency") or {},
        (f.get("realtime_lag") or {}).get("node_events", {}),
    )
    rows: list[tuple[str, Any]] = [
        ("processes", "tansu/kafka, fleetloop run, fleetloop fleet, fleetloop scrape"),
        (
            "daemon input",
            "scraped vLLM metrics only" if r["telemetry_only"] else "scraped vLLM metrics + outcomes",
        ),
        (
            "tasks started / succeeded / failed",
            f"{tasks.get('started')} / {tasks.get('succeeded')} / {tasks.get('failed')}",
        ),
        ("TTFT p50 / p99 (client side)", f"{lat.get('ttft_p50_ms')} / {lat.get('ttft_p99_ms')} ms"),
        (f"{r['degraded_node']} degraded at", f"{r['degrade_at_s']} s"),
    ]
    rows.extend(
        (
            f"breaker OPEN {o['node_id']}",
            f"{o['t_s']} s ({o['after_degrade_s']} s after; {o['reason']}"
            + (f", held back by {o['held_back_by']} first" if o.get("held_back_by") else "")
            + ")",
        )
        for o in r["breaker_opens"]
    )
    if not r["breaker_opens"]:
        rows.append(("breaker openings", "none"))
    rows.append(("fleet real-time lag p99 / max", f"{lag.get('p99_ms')} / {lag.get('max_ms')} ms"))
    rows.append(("scrapes published", sum(t.get("published", 0) for t in r["scrape"])))
    rows.append(("logs", r["logs"]))
    for k, v in rows:
        t.add_row(k, str(v))
    out.print(t)
