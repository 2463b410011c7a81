"""``fleetloop bench stack``: the CLI. Runs every arm ``--runs`` times, interleaved (run 1 of every
arm, then run 2, ...), so the machine's drift falls on every arm alike; a run whose lag p99 (the
emulator's node events or an agents process's event loop) exceeds ``--max-lag-ms`` is marked void
and repeated, up to ``--void-retries`` times."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from fleetloop import clock, term
from fleetloop.bench.common import sigterm_as_ctrl_c
from fleetloop.bench.stack import overhead, report
from fleetloop.bench.stack.arms import ARMS, BY_NAME, missing_binaries, peer_scale_in_hold_s
from fleetloop.bench.stack.run import RunSpec, run_arm
from fleetloop.daemon.brokers import start_broker
from fleetloop.daemon.cli_common import UsageError
from fleetloop.sim.scenario import Scenario, ScenarioError, load_scenario

DEFAULT_OUT = Path("bench/results/stack")
ROOT = Path(__file__).resolve().parents[3]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "stack",
        help="one emulated fleet + agents behind the routers people run, alone and driven by fleetloop",
    )
    p.add_argument("--scenario", required=True, metavar="FILE", help="scenario file with ONE pool")
    p.add_argument("--seconds", type=float, default=120.0, help="seconds of load per run (default 120)")
    p.add_argument(
        "--drain-s",
        type=float,
        help="wait this long for tasks in flight after the load (default: the scenario's longest task "
        "deadline, so every task started ends inside the run)",
    )
    p.add_argument(
        "--arms", default=",".join(a.name for a in ARMS), help="comma-separated arms (default: all)"
    )
    p.add_argument("--runs", type=int, default=3, help="runs per arm, interleaved (default 3)")
    p.add_argument(
        "--agent-procs", type=int, default=2, help="processes the agents are split over (default 2)"
    )
    p.add_argument("--max-lag-ms", type=float, default=20.0, help="a run with a larger lag p99 is void (20)")
    p.add_argument("--void-retries", type=int, default=2, help="repeats of a void run (default 2)")
    p.add_argument(
        "--overhead",
        action="store_true",
        help="instead: measure the TTFT each arm's router adds over two idle nodes (no control plane)",
    )
    p.add_argument("--overhead-calls", type=int, default=30, help="calls per router with --overhead (30)")
    p.add_argument("--out", default=str(DEFAULT_OUT), metavar="DIR", help="where the table and plot go")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.set_defaults(handler=cmd_stack)


def _check(args: argparse.Namespace) -> tuple[Scenario, list[str]]:
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        raise UsageError(f"fleetloop bench stack: {exc}") from None
    if len(scenario.pools) != 1 or len({m for w in scenario.workload for m in w.models}) != 1:
        raise UsageError(
            "fleetloop bench stack: the scenario must have one pool and one model (one router URL)"
        )
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in BY_NAME]
    if bad or not arms:
        raise UsageError(
            f"fleetloop bench stack: unknown arm(s) {bad or args.arms!r}; choose from {','.join(BY_NAME)}"
        )
    if len(set(arms)) != len(arms):
        raise UsageError(f"fleetloop bench stack: an arm is named twice in --arms {args.arms}")
    if not 5 <= args.seconds <= 3600:
        raise UsageError(f"fleetloop bench stack: --seconds must be in [5, 3600], got {args.seconds}")
    if args.drain_s is None:
        args.drain_s = float(max(w.deadline_s for w in scenario.workload))
    if not 0 <= args.drain_s <= 3600:
        raise UsageError(f"fleetloop bench stack: --drain-s must be in [0, 3600], got {args.drain_s}")
    if not 1 <= args.runs <= 20:
        raise UsageError(f"fleetloop bench stack: --runs must be in [1, 20], got {args.runs}")
    if not 1 <= args.agent_procs <= 16:
        raise UsageError(f"fleetloop bench stack: --agent-procs must be in [1, 16], got {args.agent_procs}")
    if not 0 <= args.void_retries <= 10:
        raise UsageError(f"fleetloop bench stack: --void-retries must be in [0, 10], got {args.void_retries}")
    if not 5 <= args.overhead_calls <= 1000:
        raise UsageError(
            f"fleetloop bench stack: --overhead-calls must be in [5, 1000], got {args.overhead_calls}"
        )
    if not args.max_lag_ms > 0:
        raise UsageError(f"fleetloop bench stack: --max-lag-ms must be above 0, got {args.max_lag_ms}")
    missing = missing_binaries([BY_NAME[a] for a in arms])
    if missing:
        raise UsageError(f"fleetloop bench stack: not installed: {', '.join(missing)}")
    return scenario, arms


def schedule(arms: list[str], runs: int) -> list[tuple[int, str]]:
    """(run, arm) in the order they run: run 1 of every arm, then run 2, ..."""
    return [(n, arm) for n in range(1, runs + 1) for arm in arms]


# Per run, besides its load and drain: the daemon, scraper, router and agents starting, the daemon's
# first routing (fleetloop arms), the settle before load, and every process stopping.
SETUP_S = 45.0


def estimate_s(runs: int, seconds: float, drain_s: float) -> float:
    """At most how long ``runs`` runs take when none is void: each its load, its whole drain and setup
    (a drain ends early when the last task ends, so a run is often shorter)."""
    return runs * (seconds + drain_s + SETUP_S)


@dataclass(slots=True)
class Pace:
    """How far a bench is: runs done of ``total`` (void repeats add to it), and their walls for an ETA."""

    total: int
    walls: list[float] = field(default_factory=list)

    def eta_s(self, fallback_s: float) -> float:
        left = self.total - len(self.walls)
        per = statistics.fmean(self.walls) if self.walls else fallback_s
        return max(0, left) * per

    def line(self, fallback_s: float) -> str:
        return f"[{len(self.walls) + 1}/{self.total}] about {_hm(self.eta_s(fallback_s))} left"


def _hm(seconds: float) -> str:
    m = round(seconds / 60)
    return f"{m // 60} h {m % 60:02d} min" if m >= 60 else f"{m} min"


def _commit(full: bool = False) -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", *([] if full else ["--short=12"]), "HEAD"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def _load() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())


def cmd_stack(args: argparse.Namespace) -> int:
    scenario, arms = _check(args)
    # A client that gives up mid-answer makes aiohttp log a traceback per call ("Cannot write to
    # closing transport"); those calls are counted as timeouts in the table, not printed. SGLang's
    # router opens with an HTTP/2 preface the nodes refuse before it speaks HTTP/1.1: not printed.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    if args.overhead:
        return _overhead(scenario, arms, args)
    err = term.console(stderr=True)
    started = clock.wall_ms()
    load_start = _load()
    runs: list[dict[str, Any]] = []
    voids: list[dict[str, Any]] = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / f"{scenario.name}.partial.json"
    plan = schedule(arms, args.runs)
    pace = Pace(len(plan))
    err.print(
        f"bench stack {scenario.name}: {len(plan)} runs ({len(arms)} arms x {args.runs}, interleaved), "
        f"each {args.seconds:g} s of load, up to {args.drain_s:g} s of drain and its setup: at most about "
        f"{_hm(estimate_s(len(plan), args.seconds, args.drain_s))} if no run is void; "
        f"load average {load_start}"
    )
    hold_s = peer_scale_in_hold_s([BY_NAME[a] for a in arms])
    if hold_s is not None and args.seconds + args.drain_s < hold_s:
        err.print(f"bench stack: {report.hold_note(hold_s, args.seconds + args.drain_s)}")
    err.print("bench stack: starting the embedded broker (Tansu) on loopback ...")
    # SIGTERM (a timeout, a supervisor, kill) stops the bench as Ctrl-C does: the run's processes and
    # the broker are stopped on the way out (Python's default left the broker and the routers running).
    with sigterm_as_ctrl_c():
        broker = start_broker("tansu")
        try:
            for n, name in plan:
                boot = broker.bootstrap_servers
                runs.append(_one(scenario, name, n, args, bootstrap=boot, voids=voids, err=err, pace=pace))
                # a long bench that stops (the machine, a signal) keeps what it measured
                partial.write_text(
                    json.dumps({"command": _command(), "runs_raw": runs, "void": voids}) + "\n"
                )
        finally:
            broker.stop()
    measured = [r for r in runs if "error" not in r]
    summary = report.summarize(measured, arms)
    load_end = _load()
    doc = {
        "scenario": scenario.name,
        "scenario_file": str(args.scenario),
        "seconds": args.seconds,
        "drain_s": args.drain_s,
        "peer_scale_in_hold_s": hold_s,
        "runs": args.runs,
        "max_lag_ms": args.max_lag_ms,
        "arms": arms,
        "made_by": {
            "command": _command(),
            "commit": _commit(full=True),
            "date": datetime.fromtimestamp(started / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "load": {"start": load_start, "end": load_end},
        },
        "command": _command(),
        "commit": _commit(),
        "date_utc": _utc(started),
        "wall_s": round((clock.wall_ms() - started) / 1000),
        "machine": {"cpus": os.cpu_count(), "load_start": load_start, "load_end": load_end},
        "faults": measured[0]["faults"] if measured else [],
        "summary": summary,
        "targets": report.targets(measured, summary, arms),
        "void": voids,
        "failed_runs": [r for r in runs if "error" in r],
        "runs_raw": measured,
    }
    stem = out / scenario.name
    partial.unlink(missing_ok=True)
    Path(f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    md = report.table_markdown(doc)
    Path(f"{stem}.md").write_text(md)
    report.plot_timelines(doc, Path(f"{stem}.png"))
    report.plot_summary(doc, Path(f"{stem}-arms.png"))
    if args.json:
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        con = term.console()
        con.print(report.terminal_table(doc))
        for line in report.verdicts(doc):
            con.print(f"- {line}")
        con.print(
            f"{len(measured)} runs in {_hm(doc['wall_s'])}, load average {load_start} at start, "
            f"{load_end} at end; written: {stem}.md, {stem}.json, {stem}.png, {stem}-arms.png"
        )
    dead = [a for a in arms if not any(r["tasks"]["succeeded"] for r in measured if r["arm"] == a)]
    if dead:
        err.print(f"[red]bench stack: no successful task under {', '.join(dead)}[/red]")
        return 1
    return 0


def _command() -> str:
    return "fleetloop bench stack " + " ".join(sys.argv[3:]) if len(sys.argv) > 3 else ""


def _overhead(scenario: Scenario, arms: list[str], args: argparse.Namespace) -> int:
    started = clock.wall_ms()
    doc = asyncio.run(overhead.overhead(scenario, [BY_NAME[a] for a in arms], args.overhead_calls))
    doc.update(command=_command(), commit=_commit(), date_utc=_utc(started), load=_load())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / "router-overhead"
    Path(f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    md = overhead.overhead_markdown(doc)
    Path(f"{stem}.md").write_text(md)
    sys.stdout.write(json.dumps(doc) + "\n" if args.json else md + f"\nwritten: {stem}.md, {stem}.json\n")
    return 0


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _one(
    scenario: Scenario,
    name: str,
    n: int,
    args: argparse.Namespace,
    *,
    bootstrap: str,
    voids: list[dict[str, Any]],
    err: Console,
    pace: Pace | None = None,
) -> dict[str, Any]:
    """Run ``n`` of arm ``name``; a void run is repeated, the last attempt kept (marked void if it is)."""
    spec = RunSpec(
        scenario=scenario, arm=BY_NAME[name], run=n, seed=scenario.seed + n - 1, seconds=args.seconds,
        drain_s=args.drain_s, bootstrap=bootstrap, agent_procs=args.agent_procs,
    )  # fmt: skip
    pace = pace or Pace(1)
    fallback = args.seconds + args.drain_s + SETUP_S
    for attempt in range(args.void_retries + 1):
        if attempt:
            pace.total += 1  # the repeat is one more run
        err.print(
            f"[bold]bench stack[/bold] {pace.line(fallback)} {scenario.name}: run {n}/{args.runs}, "
            f"arm [cyan]{name}[/cyan]"
            + (f" (repeat {attempt} of a void run)" if attempt else "")
            + f", {args.seconds:g} s of load, load average {_load()}"
        )
        began = clock.monotonic_s()
        try:
            r = asyncio.run(run_arm(spec, err))
        except UsageError as exc:  # a router or process that would not start: this run only
            pace.walls.append(clock.monotonic_s() - began)
            err.print(f"[red]  {name} r{n}: failed: {exc}[/red]")
            return {"arm": name, "run": n, "error": str(exc)}
        pace.walls.append(clock.monotonic_s() - began)
        lag = report.lag_p99(r)
        t = r["tasks"]
        err.print(
            f"  {name} r{n}: tasks ok {t['succeeded']}/{t['started']}, "
            f"$ / task {r['cost_per_successful_task_usd']}, TTFT p50 {r['latency']['ttft_p50_ms']} ms, "
            f"peak nodes {r['nodes']['peak_billed']}, lag p99 {lag:.1f} ms; "
            f"{pace.walls[-1]:.0f} s with setup"
        )
        if lag <= args.max_lag_ms:
            return r
        voids.append({"arm": name, "run": n, "attempt": attempt, "lag_p99_ms": lag})
        err.print(f"[yellow]  {name} r{n}: void (lag p99 {lag:.1f} ms > {args.max_lag_ms:g} ms)[/yellow]")
    r["void"] = True
    return r
