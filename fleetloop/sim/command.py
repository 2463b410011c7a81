"""``fleetloop sim``: run a scenario in process, in virtual time, under a policy or a baseline.

``fleetloop sim --scenario FILE [--policy FILE | --baseline none|classic|modern|llm-d] [--seed N] [--json]
[--report DIR]``. Without ``--policy`` or ``--baseline`` it runs fleetloop's default policy.
``--json`` prints one JSON object (keys: ``fleetloop.sim.fleet.SimReport.summary``); otherwise a
table, with progress on stderr for runs that take more than a moment. A bad scenario or policy is
one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson
from rich.table import Table

from fleetloop import term
from fleetloop.policies.registry import CompiledPolicy, PolicyError, builtin_policy, load_policy
from fleetloop.sim.report import Run, calls_within_text, causes_text, write_report
from fleetloop.sim.runner import RunResult, run
from fleetloop.sim.scenario import ScenarioError, load_scenario
from fleetloop.user_input import check_seed, output_dir

BASELINES = ("none", "classic", "modern", "llm-d")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sim",
        help="simulate a fleet scenario in virtual time under a policy or baseline",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument(
        "--scenario", required=True, metavar="FILE", help="scenario YAML (see scenarios/README.md)"
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--policy", metavar="FILE", help="policy document (default: the built-in default policy)"
    )
    group.add_argument(
        "--baseline", metavar="NAME", help="a built-in baseline: none | classic | modern | llm-d"
    )
    group.add_argument(
        "--compare",
        metavar="A,B,...",
        help="run several (baseline names or policy files, comma separated; 'default' is fleetloop's) "
        "and compare them; with --report the timelines are overlaid",
    )
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--report", metavar="DIR", help="write index.html and PNG timelines to DIR")
    p.set_defaults(handler=handle)


def resolve_policy(policy: str | None, baseline: str | None) -> CompiledPolicy:
    """The policy to run; raises :class:`PolicyError` with one line."""
    if baseline is not None:
        if baseline not in BASELINES:
            raise PolicyError(f"--baseline: unknown baseline {baseline!r} (known: {', '.join(BASELINES)})")
        try:
            return builtin_policy(baseline)
        except PolicyError as exc:
            raise PolicyError(f"--baseline {baseline}: not available in this build ({exc})") from None
    if policy is not None:
        return load_policy(policy)
    return builtin_policy("default")


def _fmt(x: Any, spec: str = "", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def _print_table(result: RunResult, data: dict[str, Any]) -> None:
    console = term.console()
    t = Table(title=f"{data['scenario']} under {data['policy']} (seed {data['seed']})", show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    tasks, cost, lat, req, sim = data["tasks"], data["cost"], data["latency"], data["requests"], data["sim"]
    rows = [
        (
            "tasks started / succeeded / failed",
            f"{tasks['started']} / {tasks['succeeded']} / {tasks['failed']}",
        ),
        ("task success rate", _fmt(tasks["success_rate"], ".2%")),
        ("total cost", f"${cost['total_usd']:.2f}"),
        ("cost per successful task", "$" + _fmt(cost["per_successful_task_usd"], ".5f")),
        ("wasted (failed tasks, retried calls)", f"${cost['wasted_usd']:.2f}"),
        ("idle (provisioned, unused)", f"${cost['idle_usd']:.2f}"),
        ("TTFT p50 / p99 (ms)", f"{_fmt(lat['ttft_p50_ms'], '.0f')} / {_fmt(lat['ttft_p99_ms'], '.0f')}"),
        ("TBT p99 (ms)", _fmt(lat["tbt_p99_ms"], ".1f")),
        (
            "requests sent / retries / shed / errors / timeouts",
            f"{req['sent']} / {req['retries']} / {req['shed']} / {req['errors']} / {req['timeouts']}",
        ),
        ("orphans (ran on after a non-streaming client left)", str(req.get("orphaned", 0))),
        (
            "failed tasks by cause",
            causes_text(tasks.get("failed_by", {})),
        ),
        (
            "node-hours (peak nodes)",
            f"{data['nodes']['node_hours']:.2f} ({data['nodes']['peak_provisioned']})",
        ),
        (
            "virtual / wall time",
            f"{sim['virtual_s']:.0f} s / {sim['wall_s']:.1f} s ({_fmt(sim['speedup'], '.0f')}x)",
        ),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    bp = Table(title="by priority class", show_header=True)
    cols = ("priority", "tasks", "success", "TTFT p99 ms", "calls, first token within SLO")
    for col in (*cols, "$ / successful task", "wasted $"):
        bp.add_column(col, justify="right")
    for p, row in data["by_priority"].items():
        bp.add_row(
            p,
            str(row["tasks_started"]),
            _fmt(row["success_rate"], ".2%"),
            _fmt(row["ttft_p99_ms"], ".0f"),
            calls_within_text(row),
            _fmt(row["cost_per_successful_task_usd"], ".5f"),
            f"{row['wasted_usd']:.2f}",
        )
    console.print(bp)


def _resolve_named(name: str) -> CompiledPolicy:
    if name == "default":
        return builtin_policy("default")
    if name in BASELINES:
        return resolve_policy(None, name)
    return load_policy(name)


def compare_names(text: str) -> list[str]:
    """``--compare A,B,...``: at least one name, none empty, none twice (each is a key of the
    ``--json`` runs and a column of the table: a second ``default`` would run again and be lost)."""
    names = [n.strip() for n in text.split(",")]
    if not any(names):
        raise PolicyError(f"--compare {text!r}: name at least one baseline or policy file")
    if not all(names):
        raise PolicyError(f"--compare {text!r}: an empty name between commas")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise PolicyError(f"--compare {text!r}: {', '.join(twice)} named twice")
    return names


def handle(args: argparse.Namespace) -> int:
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        sys.stderr.write(f"fleetloop sim: {exc}\n")
        return 2
    try:
        if args.compare is not None:
            policies = [(n, _resolve_named(n)) for n in compare_names(args.compare)]
        else:
            policy = resolve_policy(args.policy, args.baseline)
    except PolicyError as exc:
        sys.stderr.write(f"fleetloop sim: {exc}\n")
        return 2
    # Everything a run needs is checked before it starts: no traceback, or unwritable report, at its end.
    check_seed(args.seed, prog="fleetloop sim")
    if args.report:
        output_dir(args.report, flag="--report", prog="fleetloop sim")
    if args.compare is not None:
        return _compare(args, scenario, policies)

    def progress(virtual_s: float, horizon_s: float) -> None:
        if sys.stderr.isatty():
            sys.stderr.write(f"\rsimulating {scenario.name}: {virtual_s:,.0f} s virtual")
            sys.stderr.flush()

    result = run(scenario, policy, seed=args.seed, progress=progress)
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    data = result.to_json(str(args.scenario))
    if args.report:
        write_report(args.report, scenario, [Run(data["policy"], result, data)])
    if args.json:
        sys.stdout.write(orjson.dumps(data).decode() + "\n")
    else:
        _print_table(result, data)
        if args.report:
            print(f"report: {args.report}/index.html")
    return 0


def _against(ms: float | None, slo_ms: float) -> str:
    """A percentile beside its SLO: a cost comparison means little between a stack that meets the
    SLO and one that is cheaper because it does not, so the miss is spelled out."""
    if ms is None:
        return "-"
    return f"{ms:.0f}" + (" over" if ms > slo_ms else "")


def _compare(args: argparse.Namespace, scenario: Any, policies: list[tuple[str, CompiledPolicy]]) -> int:
    runs = []
    for label, policy in policies:
        if sys.stderr.isatty():
            sys.stderr.write(f"\rsimulating {scenario.name} under {label} ...")
            sys.stderr.flush()
        result = run(scenario, policy, seed=args.seed)
        runs.append(Run(label, result, result.to_json(str(args.scenario))))
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    if args.report:
        write_report(args.report, scenario, runs)
    if args.json:
        payload = {"scenario": scenario.name, "runs": {r.label: r.data for r in runs}}
        sys.stdout.write(orjson.dumps(payload).decode() + "\n")
        return 0

    t = Table(title=f"{scenario.name}: {', '.join(r.label for r in runs)} (seed {runs[0].data['seed']})")
    t.add_column("metric")
    for r in runs:
        t.add_column(r.label, justify="right")
    slo = scenario.slo
    rows: list[tuple[str, Any]] = [
        ("task success", lambda d: _fmt(d["tasks"]["success_rate"], ".2%")),
        ("cost per successful task", lambda d: "$" + _fmt(d["cost"]["per_successful_task_usd"], ".5f")),
        ("wasted", lambda d: f"${d['cost']['wasted_usd']:.2f}"),
        (f"TTFT p99 ms (SLO {slo.ttft_ms})", lambda d: _against(d["latency"]["ttft_p99_ms"], slo.ttft_ms)),
        (f"TBT p99 ms (SLO {slo.tbt_ms})", lambda d: _against(d["latency"]["tbt_p99_ms"], slo.tbt_ms)),
        ("priority-0 success", lambda d: _fmt(d["by_priority"].get("0", {}).get("success_rate"), ".2%")),
        (
            "priority-0 calls, first token within SLO",
            lambda d: calls_within_text(d["by_priority"].get("0", {})),
        ),
        ("retries / shed", lambda d: f"{d['requests']['retries']} / {d['requests']['shed']}"),
        ("timeouts / orphans", lambda d: f"{d['requests']['timeouts']} / {d['requests'].get('orphaned', 0)}"),
        ("tasks failed", lambda d: str(d["tasks"]["failed"])),
    ]
    for name, f in rows:
        t.add_row(name, *(f(r.data) for r in runs))
    term.console().print(t)
    if args.report:
        print(f"report: {args.report}/index.html")
    return 0
