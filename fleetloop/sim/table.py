"""The side-by-side table: every shipped scenario under every available policy.

``python -m fleetloop.sim.table [--scenarios DIR] [--out DIR] [--json] [--workers N] [--ablation]``
runs each scenario under ``--baseline none``, ``--baseline classic``, ``--baseline modern`` (when
this build ships them) and ``--policy policies/default.yaml`` (two worker processes by default),
prints the table (scenario x policy: task success rate, cost per successful task, wasted dollars,
TTFT p99, priority-0 success) and writes it to ``OUT/sim-table.md`` and ``OUT/sim-table.json``
(``bench/results`` by default). Every run is deterministic (scenario seed), so the table changes
only when the code does; the wall times and speed-ups are the only figures that vary between
machines.

Below the table it checks its targets (cost per successful task against classic, success and
priority-0 success, the prefix-heavy TTFT against none) and reports default against ``modern`` (the
engine-signal autoscaler a careful operator runs today; reported, not a pass/fail target).
``--ablation`` also runs the default policy with each lever turned off in turn (its section swapped
for the no-control algorithm: round-robin, never, max-pending, unlimited, fixed, static-batching)
and writes ``sim-ablation.md``: what each lever contributes.

``--suite stress|shipped|all|fleet [--seeds N] [--only A,B]`` runs a suite over seeds instead
(classic and default, ``N`` seeds per scenario, 5 by default; ``--policies`` may add ``modern``,
reported against default per run) and checks the suite's per-seed targets; see
:mod:`fleetloop.sim.suite`. It writes ``sim-<suite>.md`` and ``.json`` beside the table, or, with
``--ablation``, ``sim-<suite>-ablation.md`` and ``.json`` (so an ablation over fewer seeds never
replaces the suite's own table).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from fleetloop.policies.registry import (
    CompiledPolicy,
    PolicyError,
    builtin_policy,
    compile_policy,
    load_policy,
)
from fleetloop.sim.runner import run
from fleetloop.sim.scenario import ScenarioError, load_scenario
from fleetloop.sim.suite import (
    BASELINES,
    SUITES,
    Job,
    latency_summary,
    progress_line,
    reuse_rows,
    run_jobs,
    scenario_sha,
    suite_ablation_markdown,
    suite_files,
    suite_jobs,
    suite_markdown,
    suite_targets,
)

DEFAULT_POLICY = Path(__file__).resolve().parent.parent / "policies" / "default.yaml"


def available_policies() -> list[tuple[str, str]]:
    """(label, spec) pairs: ``baseline:NAME`` or a policy file path."""
    out = [("none", "baseline:none")]
    for name in ("classic", "modern"):
        try:
            builtin_policy(name)
            out.append((name, f"baseline:{name}"))
        except PolicyError:
            pass
    out.append(("default", str(DEFAULT_POLICY)))
    return out


# The no-control algorithm of each section: what "this lever off" means in the ablation.
LEVER_OFF: dict[str, dict[str, Any]] = {
    "routing": {"type": "round-robin"},
    "breaker": {"type": "never"},
    "admission": {"type": "max-pending", "params": {"limit": 1024}},
    "retry_budget": {"type": "unlimited"},
    "autoscale": {"type": "fixed"},
    "batching": {"type": "static-batching"},
}


def ablated(section: str) -> CompiledPolicy:
    """The default policy with ``section`` swapped for its no-control algorithm."""
    doc = load_policy(DEFAULT_POLICY).document
    data = doc.model_dump(mode="json")
    data["spec"][section] = LEVER_OFF[section]
    data["metadata"]["name"] = f"default-without-{section.replace('_', '-')}"
    return compile_policy(type(doc).model_validate(data))


def resolve(spec: str) -> CompiledPolicy:
    if spec.startswith("baseline:"):
        return builtin_policy(spec.split(":", 1)[1])
    if spec.startswith("ablate:"):
        return ablated(spec.split(":", 1)[1])
    return load_policy(spec)


def run_one(job: tuple[str, str, str] | tuple[str, str, str, int]) -> dict[str, Any]:
    """One run: ``(scenario file, label, policy spec)``, optionally with a seed that overrides the
    scenario's own."""
    scenario_path, label, spec = job[0], job[1], job[2]
    seed = job[3] if len(job) > 3 else None
    scenario = load_scenario(scenario_path)
    policy = resolve(spec)
    result = run(scenario, policy, seed=seed)
    data = result.to_json(scenario_path)
    p0 = data["by_priority"].get("0")
    return {
        "scenario": data["scenario"],
        "scenario_sha": scenario_sha(scenario_path),
        "policy": label,
        "seed": data["seed"],
        "tasks_succeeded": data["tasks"]["succeeded"],
        "p0_tasks_started": p0["tasks_started"] if p0 else 0,
        "p0_tasks_succeeded": p0["tasks_succeeded"] if p0 else 0,
        "success_rate": data["tasks"]["success_rate"],
        "tasks_started": data["tasks"]["started"],
        "per_successful_task_usd": data["cost"]["per_successful_task_usd"],
        "total_usd": data["cost"]["total_usd"],
        "wasted_usd": data["cost"]["wasted_usd"],
        "ttft_p99_ms": data["latency"]["ttft_p99_ms"],
        "p0_ttft_p99_ms": p0["ttft_p99_ms"] if p0 else None,
        "p0_calls": p0["calls"] if p0 else 0,
        "p0_calls_ttft_within_slo": p0["calls_ttft_within_slo"] if p0 else None,
        "tbt_p99_ms": data["latency"]["tbt_p99_ms"],
        "slo_ttft_ms": scenario.slo.ttft_ms,
        "slo_tbt_ms": scenario.slo.tbt_ms,
        "p0_success_rate": p0["success_rate"] if p0 else None,
        "tasks_failed": data["tasks"]["failed"],
        "failed_by": data["tasks"].get("failed_by", {}),
        "retries": data["requests"]["retries"],
        "timeouts": data["requests"]["timeouts"],
        "orphaned": data["requests"].get("orphaned", 0),
        "virtual_s": data["sim"]["virtual_s"],
        "wall_s": data["sim"]["wall_s"],
        "speedup": data["sim"]["speedup"],
    }


def _f(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "# fleetloop sim: scenario x policy",
        "",
        "Generated by `python -m fleetloop.sim.table`. Deterministic per scenario seed; wall time and",
        "speed-up depend on the machine (one core per run).",
        "",
        "| scenario | policy | task success | $ / successful task | wasted $ | TTFT p99 ms | p0 success "
        "| wall s | speed-up |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines.extend(
        (
            f"| {r['scenario']} | {r['policy']} | {_f(r['success_rate'], '.2%')} "
            f"| {_f(r['per_successful_task_usd'], '.5f')} | {_f(r['wasted_usd'], '.2f')} "
            f"| {_f(r['ttft_p99_ms'], '.0f')} | {_f(r['p0_success_rate'], '.2%')} "
            f"| {_f(r['wall_s'], '.1f')} | {_f(r['speedup'], '.0f')}x |"
        )
        for r in rows
    )
    return "\n".join(lines) + "\n"


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _by(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["scenario"], r["policy"]): r for r in rows}


def targets(rows: list[dict[str, Any]]) -> tuple[str, bool]:
    """The table's targets, checked on its rows: (markdown, all met)."""
    t = _by(rows)
    scenarios = sorted({r["scenario"] for r in rows})
    if not all((s, "classic") in t and (s, "default") in t for s in scenarios):
        return "", False
    ratios: dict[str, float] = {}
    lines = [
        "",
        "## Targets",
        "",
        "| scenario | $/success vs classic | success vs classic | p0 vs classic |",
    ]
    lines.append("|---|---:|---:|---:|")
    ok = True
    for s in scenarios:
        d, c = t[(s, "default")], t[(s, "classic")]
        ratio = (d["per_successful_task_usd"] or math.inf) / (c["per_successful_task_usd"] or math.inf)
        ratios[s] = ratio
        ds, cs = d["success_rate"] or 0.0, c["success_rate"] or 0.0
        dp, cp = d["p0_success_rate"], c["p0_success_rate"]
        s_ok = ds >= cs - 1e-9
        p_ok = dp is None or cp is None or dp >= cp - 1e-9
        ok = ok and ratio <= 1.02 and s_ok and p_ok
        lines.append(
            f"| {s} | {ratio:.3f}{'' if ratio <= 1.02 else ' (over 1.02)'} "
            f"| {ds - cs:+.2%}{'' if s_ok else ' (below)'} "
            f"| {'-' if dp is None or cp is None else f'{dp - cp:+.2%}'}{'' if p_ok else ' (below)'} |"
        )
    g = _geomean(list(ratios.values()))
    g_ok = g is not None and g <= 0.75
    ok = ok and g_ok
    lines.append("")
    verdict = "met" if g_ok else "NOT met"
    lines.append(f"- geometric mean of $/success vs classic: **{_f(g, '.3f')}** (target <= 0.75: {verdict})")
    prefix = [s for s in scenarios if "prefix" in s]
    for s in prefix:
        d, n = t[(s, "default")], t.get((s, "none"))
        if n and d["ttft_p99_ms"] and n["ttft_p99_ms"]:
            x = n["ttft_p99_ms"] / d["ttft_p99_ms"]
            ok = ok and x >= 3
            verdict = "met" if x >= 3 else "NOT met"
            lines.append(f"- {s}: TTFT p99 none / default = **{x:.2f}x** (target >= 3x: {verdict})")
    for s in [s for s in scenarios if "cascade" in s]:
        line, met = _storm(t, s)
        ok = ok and met
        lines.append(line)
    lines.append(f"- every target met: **{'yes' if ok else 'no'}**")
    return "\n".join(lines) + "\n", ok


def against_modern(rows: list[dict[str, Any]]) -> str:
    """Default against the ``modern`` baseline, per scenario (reported; no target is set)."""
    t = _by(rows)
    scenarios = sorted({r["scenario"] for r in rows})
    if not all((s, "modern") in t and (s, "default") in t for s in scenarios):
        return ""
    lines = [
        "",
        "## Against modern (least-request + outlier detection + KEDA/HPA on queue and KV)",
        "",
        "| scenario | $/success vs modern | success vs modern | p0 vs modern | TTFT p99 modern / default "
        "| TBT p99 modern / default ms (SLO) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    ratios = []
    pairs = []
    for s in scenarios:
        d, m = t[(s, "default")], t[(s, "modern")]
        ratio = (d["per_successful_task_usd"] or math.inf) / (m["per_successful_task_usd"] or math.inf)
        ratios.append(ratio)
        pairs.append((d, m))
        dp, mp = d["p0_success_rate"], m["p0_success_rate"]
        ttft = f"{m['ttft_p99_ms'] / d['ttft_p99_ms']:.2f}x" if m["ttft_p99_ms"] and d["ttft_p99_ms"] else "-"
        lines.append(
            f"| {s} | {ratio:.3f} | {(d['success_rate'] or 0.0) - (m['success_rate'] or 0.0):+.2%} "
            f"| {'-' if dp is None or mp is None else f'{dp - mp:+.2%}'} | {ttft} | {_tbt_pair(d, m)} |"
        )
    lines.append("")
    lines.append(f"- geometric mean of $/success vs modern: **{_f(_geomean(ratios), '.3f')}**")
    lines.append(_dearer_within_slo(pairs))
    return "\n".join(lines) + "\n"


def _tbt_within(row: dict[str, Any]) -> bool | None:
    tbt, slo = row.get("tbt_p99_ms"), row.get("slo_tbt_ms")
    return None if tbt is None or slo is None else tbt <= slo


def _tbt_pair(d: dict[str, Any], m: dict[str, Any]) -> str:
    """Modern's and default's TBT p99 with the scenario's SLO, a miss marked: a cheaper stack that
    misses the SLO is not the same service for less."""

    def one(r: dict[str, Any]) -> str:
        return _f(r.get("tbt_p99_ms"), ".0f") + ("*" if _tbt_within(r) is False else "")

    return f"{one(m)} / {one(d)} ({_f(d.get('slo_tbt_ms'), '.0f')})"


def _dearer_within_slo(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """Where default costs more per successful task than modern: on how many of those is default's
    TBT p99 within the SLO and modern's over it (what the difference buys)."""
    dearer = [
        (d, m)
        for d, m in pairs
        if (d["per_successful_task_usd"] or math.inf) > (m["per_successful_task_usd"] or math.inf)
    ]
    bought = sum(1 for d, m in dearer if _tbt_within(d) is True and _tbt_within(m) is False)
    d_in = sum(1 for d, _ in pairs if _tbt_within(d) is True)
    m_in = sum(1 for _, m in pairs if _tbt_within(m) is True)
    return (
        f"- TBT p99 within the SLO (* marks a miss): default on **{d_in}** of {len(pairs)}, modern on"
        f" **{m_in}**; where default costs more per successful task than modern ({len(dearer)} of"
        f" {len(pairs)}), default's is within it and modern's over it on **{bought}**"
    )


def timed_out(row: dict[str, Any]) -> int:
    """Tasks lost to the storm: failed with a timed-out call (past its retries or its deadline)."""
    return sum(n for cause, n in row.get("failed_by", {}).items() if cause.endswith(":timeout"))


def _storm(t: dict[tuple[str, str], dict[str, Any]], s: str) -> tuple[str, bool]:
    """The cascade target: classic loses tasks to the timeout-and-retry storm, fleetloop does not.
    Met when classic loses at least 1% of its tasks to timed-out calls and default at most a tenth
    of classic's count and at most 0.1% of its tasks."""
    c, d = t.get((s, "classic")), t.get((s, "default"))
    if c is None or d is None:
        return f"- {s}: classic or default missing", False
    lc, ld = timed_out(c), timed_out(d)
    sc, sd = max(1, c["tasks_started"]), max(1, d["tasks_started"])
    met = lc >= 0.01 * sc and ld <= 0.1 * lc and ld <= 0.001 * sd
    return (
        f"- {s}: tasks lost to timed-out calls, classic **{lc}** ({lc / sc:.2%}; {c['retries']} retries, "
        f"{c['timeouts']} timeouts, {c['orphaned']} orphans) vs default **{ld}** ({ld / sd:.2%}; "
        f"{d['retries']} retries, {d['timeouts']} timeouts, {d['orphaned']} orphans) "
        f"(target: classic >= 1%, default <= a tenth of classic and <= 0.1%: {'met' if met else 'NOT met'})",
        met,
    )


def ablation_markdown(rows: list[dict[str, Any]]) -> str:
    t = _by(rows)
    scenarios = sorted({r["scenario"] for r in rows})
    lines = [
        "# What each lever contributes",
        "",
        "The default policy with one lever turned off (its section swapped for the no-control algorithm).",
        "Ratios are cost per successful task against the full default policy (> 1: the lever saves money);",
        "success is the change in task success when the lever is off.",
        "",
        "| lever off | geomean $/success ratio | " + " | ".join(scenarios) + " |",
        "|---|---:|" + "---:|" * len(scenarios),
    ]
    for section in LEVER_OFF:
        label = f"no-{section}"
        cells, ratios = [], []
        for s in scenarios:
            a, d = t.get((s, label)), t.get((s, "default"))
            if a is None or d is None or not a["per_successful_task_usd"] or not d["per_successful_task_usd"]:
                cells.append("-")
                continue
            r = a["per_successful_task_usd"] / d["per_successful_task_usd"]
            ratios.append(r)
            cells.append(f"{r:.2f} ({(a['success_rate'] or 0) - (d['success_rate'] or 0):+.1%})")
        lines.append(f"| {section} | {_f(_geomean(ratios), '.3f')} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m fleetloop.sim.table", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--scenarios", default="scenarios", help="directory of scenario files (default: scenarios)"
    )
    ap.add_argument("--out", default="bench/results", help="where to write sim-table.md/.json")
    ap.add_argument("--json", action="store_true", help="print the rows as one JSON object")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ablation", action="store_true", help="also run default with each lever off")
    ap.add_argument(
        "--suite",
        choices=sorted(SUITES),
        help="run a suite over seeds against the suite's targets (writes sim-SUITE.md/.json)",
    )
    ap.add_argument("--seeds", type=int, default=5, help="seeds per scenario with --suite (default 5)")
    ap.add_argument(
        "--only", default="", help="with --suite: comma-separated scenario file stems to keep (development)"
    )
    ap.add_argument(
        "--levers",
        default=",".join(LEVER_OFF),
        help="with --suite --ablation: which levers to turn off one at a time (default: all six)",
    )
    ap.add_argument(
        "--policies",
        default="classic,modern,default",
        help="with --suite: which of none,classic,modern,llm-d,default to run (targets need classic and "
        "default; modern and llm-d are reported against default)",
    )
    ap.add_argument(
        "--reuse",
        default="",
        help="comma-separated earlier sim-*.json files whose classic/modern rows (same scenario file, "
        "seed) are taken instead of run again; the table says so, naming the files the repository "
        "holds (a scratch file is named only as not in the repository)",
    )
    ap.add_argument(
        "--reuse-policies",
        default="classic,modern",
        help="with --reuse: whose rows may be reused (default: the baselines, which do not read the "
        "default policy); add default only for rows of the same commit",
    )
    return ap


def _csv(value: str) -> list[str]:
    """A comma-separated flag's items, blanks dropped."""
    return [x.strip() for x in value.split(",") if x.strip()]


NOT_KEPT = "<a file not in the repository>"


def kept_path(source: str) -> str:
    """A ``--reuse`` file as the results name it: its path in the git repository around the working
    directory when the file is in it (tracked), else :data:`NOT_KEPT`: a scratch file would not be
    there for the results' reader (its rows are reused all the same)."""
    argv = ["git", "--literal-pathspecs", "ls-files", "-z", "--full-name", "--", source]
    try:
        out = subprocess.run(argv, capture_output=True, check=False)
    except OSError:  # no git
        return NOT_KEPT
    names = [n for n in out.stdout.decode(errors="replace").split("\0") if n]
    return names[0] if out.returncode == 0 and len(names) == 1 else NOT_KEPT


def _reuse(args: argparse.Namespace, jobs: list[Job]) -> tuple[list[Job], list[dict[str, Any]], list[str]]:
    """``--reuse``: (jobs still to run, rows taken from the earlier files, those files as the results
    name them: :func:`kept_path`). OSError or ValueError for a file that cannot be read or is not a
    suite or table JSON."""
    sources = _csv(args.reuse)
    if not sources:
        return jobs, [], sources
    jobs, reused = reuse_rows(jobs, [Path(x) for x in sources], _csv(args.reuse_policies))
    return jobs, reused, [kept_path(x) for x in sources]


def main(argv: list[str] | None = None) -> int:
    """The side-by-side table (``--suite``: :func:`main_suite`): plan the runs, take what ``--reuse``
    offers, run the rest, write and print the table."""
    args = _parser().parse_args(argv)
    if args.suite:
        return main_suite(args)
    files = sorted(Path(args.scenarios).glob("*.yaml"))
    if not files:
        sys.stderr.write(f"no scenario files in {args.scenarios}\n")
        return 2
    policies = available_policies()
    try:
        seeds = {str(f): load_scenario(f).seed for f in files}
    except ScenarioError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    jobs: list[Job] = [(str(f), label, spec, seeds[str(f)]) for f in files for label, spec in policies]
    if args.ablation:
        jobs += [
            (str(f), f"no-{section}", f"ablate:{section}", seeds[str(f)])
            for f in files
            for section in LEVER_OFF
        ]
    # Rows of the scenario's own seed from earlier suite or table runs of this commit.
    try:
        jobs, reused, sources = _reuse(args, jobs)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"--reuse: {exc}\n")
        return 2
    if sources:
        sys.stderr.write(f"reused {len(reused)} rows; {len(jobs)} runs to go\n")
    # One line per finished run on stderr (the table with --ablation is ~80 runs, minutes long).
    all_rows = reused + run_jobs(jobs, args.workers, run_one, None if args.json else progress_line)
    labels = [label for label, _ in policies]
    order = labels + [f"no-{section}" for section in LEVER_OFF]
    all_rows.sort(key=lambda r: (r["scenario"], order.index(r["policy"])))
    md, payload = _write_table(
        Path(args.out), labels, all_rows, ablation=args.ablation, reused=len(reused), sources=sources
    )
    if args.json:
        sys.stdout.write(orjson.dumps(payload).decode() + "\n")
    else:
        sys.stdout.write(md)
    return 0


def _write_table(
    out: Path,
    labels: list[str],
    all_rows: list[dict[str, Any]],
    *,
    ablation: bool,
    reused: int,
    sources: list[str],
) -> tuple[str, dict[str, Any]]:
    """Write ``sim-table.md`` and ``.json`` to ``out`` (and ``sim-ablation.md`` with ``--ablation``):
    the table of the ``labels`` policies' rows, its targets, default against modern, and whether
    ``reused`` of the rows came from the ``--reuse`` files ``sources``. (The markdown, the JSON.)"""
    shown = set(labels)
    rows = [r for r in all_rows if r["policy"] in shown]
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(rows) + targets(rows)[0] + against_modern(rows)
    if ablation:
        ab = ablation_markdown(all_rows)
        (out / "sim-ablation.md").write_text(ab)
        md += "\n" + ab
    if reused:
        md += (
            f"\n{reused} rows were reused from earlier runs of the same code "
            f"(`--reuse {','.join(sources)}`: same scenario files, each scenario's own seed).\n"
        )
    (out / "sim-table.md").write_text(md)
    payload = {
        "policies": labels,
        "rows": all_rows,
        "targets_met": targets(rows)[1],
        "reused_from": sources if reused else [],
    }
    (out / "sim-table.json").write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2) + b"\n")
    return md, payload


def suite_against_modern(rows: list[dict[str, Any]]) -> str:
    """Default against ``modern`` per (scenario, seed), when the suite ran both (reported, no target)."""
    t = {(r["scenario"], r["seed"], r["policy"]): r for r in rows}
    pairs = sorted({(s, seed) for s, seed, p in t if p == "modern" and (s, seed, "default") in t})
    if not pairs:
        return ""
    lines = [
        "",
        "## Against modern, seed by seed (reported, not a target)",
        "",
        "| scenario | seed | $/success default / modern | success default - modern | p0 default - modern "
        "| TTFT p99 modern / default ms | TBT p99 modern / default ms (SLO) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    both = []
    for s, seed in pairs:
        d, m = t[(s, seed, "default")], t[(s, seed, "modern")]
        both.append((d, m))
        ratio = (d["per_successful_task_usd"] or math.inf) / (m["per_successful_task_usd"] or math.inf)
        dp, mp = d["p0_success_rate"], m["p0_success_rate"]
        lines.append(
            f"| {s} | {seed} | {ratio:.3f} | {(d['success_rate'] or 0.0) - (m['success_rate'] or 0.0):+.2%} "
            f"| {'-' if dp is None or mp is None else f'{dp - mp:+.2%}'} "
            f"| {_f(m['ttft_p99_ms'], '.0f')} / {_f(d['ttft_p99_ms'], '.0f')} | {_tbt_pair(d, m)} |"
        )
    lines.append("")
    lines.append(_dearer_within_slo(both))
    return "\n".join(lines) + "\n"


def main_suite(args: argparse.Namespace) -> int:
    """``--suite``: every scenario of the suite under classic and default over ``--seeds`` seeds."""
    if args.seeds < 1:
        sys.stderr.write("--seeds must be at least 1\n")
        return 2
    files = suite_files(args.suite)
    if args.only:
        keep = set(_csv(args.only))
        files = [f for f in files if f.stem in keep]
    if not files:
        sys.stderr.write(f"no scenario files in suite {args.suite!r}\n")
        return 2
    wanted = set(_csv(args.policies))
    known = ("none", *BASELINES, "default")
    if not wanted <= set(known):
        sys.stderr.write(f"--policies: unknown {sorted(wanted - set(known))} (known: {', '.join(known)})\n")
        return 2
    policies = [
        (label, spec)
        for label, spec in (
            *((b, f"baseline:{b}") for b in ("none", *BASELINES)),
            ("default", str(DEFAULT_POLICY)),
        )
        if label in wanted
    ]
    levers = _csv(args.levers)
    if not set(levers) <= set(LEVER_OFF):
        sys.stderr.write(
            f"--levers: unknown {sorted(set(levers) - set(LEVER_OFF))} (known: {', '.join(LEVER_OFF)})\n"
        )
        return 2
    if args.ablation:
        policies += [(f"no-{section}", f"ablate:{section}") for section in levers]
    try:
        jobs = suite_jobs(files, args.seeds, policies)
    except ScenarioError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    try:
        jobs, reused, sources = _reuse(args, jobs)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"--reuse: {exc}\n")
        return 2
    if sources and not args.json:
        sys.stderr.write(f"reused {len(reused)} rows; {len(jobs)} runs to go\n")
    ran = run_jobs(jobs, args.workers, run_one, None if args.json else progress_line)
    order = {(r["scenario"], int(r["seed"]), r["policy"]): r for r in (*reused, *ran)}
    rows = [order[k] for k in sorted(order)]
    md = suite_markdown(args.suite, rows, args.seeds, reused_from=sources if reused else None)
    md += suite_against_modern(rows)
    if args.ablation:
        md += "\n" + suite_ablation_markdown(rows, levers)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # An ablation runs fewer seeds or levers than the suite table: its own files, never the suite's.
    stem = f"sim-{args.suite}-ablation" if args.ablation else f"sim-{args.suite}"
    (out / f"{stem}.md").write_text(md)
    checks, met = suite_targets(rows)
    payload = {
        "suite": args.suite,
        "seeds": args.seeds,
        "rows": rows,
        "checks": checks,
        "targets_met": met,
        "latency": latency_summary(rows),
        "reused_from": sources if reused else [],
    }
    (out / f"{stem}.json").write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.write(orjson.dumps(payload).decode() + "\n" if args.json else md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
