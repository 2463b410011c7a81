"""Suites over seeds: ``python -m fleetloop.sim.table --suite stress|shipped|all|fleet [--seeds N]``.

A suite runs every scenario of its directory (``scenarios/`` for ``shipped``,
``scenarios/stress/`` for ``stress``, both for ``all``, ``scenarios/fleet/`` for ``fleet``: 1,024
nodes in 32 pools, ~2 CPU-minutes per run, so ``all`` leaves it out and it runs on its own, usually
with ``--seeds 1 --policies classic,modern,default``) under ``classic`` and the default policy
for ``N`` seeds each (5 by default: the scenario's own seed and the next four), and checks these
targets on every (scenario, seed) pair:

- task success at least classic's, within one task: ``default succeeded >= classic succeeded - 1``
  counted over the same arrivals (same scenario and seed, so the same tasks start);
- priority-0 success likewise (``p0 succeeded >= classic's - 1``);
- cost per successful task at most 1.02x classic's;
- and, over every pair, the geometric mean of that cost ratio at most 0.7.

Pairs are compared on task counts rather than rates so that "within one task" means one task at
any scale. ``--ablation`` also runs the default policy with each lever off (see
:data:`fleetloop.sim.table.LEVER_OFF`) over the same seeds and reports, per lever and scenario,
the geometric-mean cost ratio against the full policy and the tasks gained or lost.

Latency is reported beside the targets, not held to one: per policy, the (scenario, seed) pairs
whose priority-0 TTFT p99 is within the scenario's ``slo.ttft_ms`` (priority 0 is the interactive
class the scenario's SLO states; the default policy's looser best-effort class keeps its ratio to
it), and whose TBT p99 over every call is within ``slo.tbt_ms`` (under continuous batching every
call on a node sees the same step time, so a pool meets its strictest class or none:
:mod:`fleetloop.policies.slo`). The simulator measures TBT per node iteration, not per class, so
a pool serving only best-effort calls is held here to the interactive TBT too: strict for default,
whose best-effort SLO is looser.

Those TTFT percentiles are over the attempts that succeeded, so a policy that fails its slowest
calls looks faster there (under a pool-wide slowdown classic times out thousands of calls, and
they leave its percentile). The latency section therefore also counts first tokens as callers see
them (:mod:`fleetloop.sim.accounting`): every priority-0 call once, timed from its first attempt
to the first token of the attempt that completed it, with a call whose task failed during it
counted as a miss. A pair meets that SLI when at least 99% of its priority-0 calls got their first
token within ``slo.ttft_ms`` (the p99 a caller sees is within the SLO); the table gives those pairs
and the share of calls within the SLO over every seed.

``modern`` (the engine-signal autoscaler baseline) runs beside them and is reported against
default (geometric-mean cost ratio, tasks and priority-0 tasks won), not held to a target; so is
``llm-d`` (llm-d's endpoint picker and KEDA autoscaling) when ``--policies`` names it.

``--reuse FILE,...`` takes the ``classic`` and ``modern`` rows (``--reuse-policies`` names others,
e.g. to assemble one table from runs split over processes of the same commit) of earlier runs (their
``sim-<suite>.json``) instead of running them again, when the scenario file's SHA-256 and the seed
match: the baselines do not read the default policy, and every run is deterministic in (scenario,
seed, policy, code), so a row from the same code is the row a new run would give. The table says
which rows were reused and from where (a file the repository does not hold, a scratch file, as
``<a file not in the repository>``: its path would mean nothing to the table's reader); reuse rows
only from a run of the same commit's simulator.

The table goes to ``OUT/sim-<suite>.md`` and ``OUT/sim-<suite>.json``; ``--json`` prints the rows.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import orjson

from fleetloop.sim.scenario import load_scenario

SUITES: dict[str, tuple[str, ...]] = {
    "shipped": ("scenarios",),
    "stress": ("scenarios/stress",),
    "all": ("scenarios", "scenarios/stress"),
    "fleet": ("scenarios/fleet",),  # fleet scale: minutes of CPU per run, not part of "all"
}
BASELINES = ("classic", "modern", "llm-d")  # reported against default; only classic is a target
COST_RATIO_MAX = 1.02
GEOMEAN_MAX = 0.7
TASK_SLACK = 1  # "within one task"

# Every field a suite row must carry; ``--reuse`` takes no row that lacks one (an older run's row is
# run again rather than leave a column of the table empty).
ROW_FIELDS = (
    "scenario",
    "scenario_sha",
    "policy",
    "seed",
    "tasks_succeeded",
    "p0_tasks_succeeded",
    "per_successful_task_usd",
    "ttft_p99_ms",
    "p0_ttft_p99_ms",
    "p0_calls",
    "p0_calls_ttft_within_slo",
    "tbt_p99_ms",
    "slo_ttft_ms",
    "slo_tbt_ms",
)

Job = tuple[str, str, str, int]
Key = tuple[str, int]


def suite_files(suite: str, root: Path = Path()) -> list[Path]:
    files: list[Path] = []
    for d in SUITES[suite]:
        files.extend(sorted((root / d).glob("*.yaml")))
    return files


def suite_jobs(
    files: Iterable[Path], seeds: int, policies: list[tuple[str, str]], first_seed: int | None = None
) -> list[Job]:
    """(file, label, spec, seed) for every file, seed and policy: seeds are the scenario's own
    seed (or ``first_seed``) and the ``seeds - 1`` that follow it."""
    jobs: list[Job] = []
    for f in files:
        base = load_scenario(f).seed if first_seed is None else first_seed
        for k in range(seeds):
            jobs.extend((str(f), label, spec, base + k) for label, spec in policies)
    return jobs


def scenario_sha(path: str | Path) -> str:
    """SHA-256 of a scenario file's bytes: a reused row must come from the same file."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def reuse_rows(
    jobs: list[Job], sources: Iterable[Path], policies: Iterable[str] = BASELINES
) -> tuple[list[Job], list[dict[str, Any]]]:
    """(jobs still to run, rows taken from ``sources``): a job of one of ``policies`` (the
    baselines by default) whose (scenario file SHA, seed, policy) has a row in one of the earlier
    suite JSON files is not run again. A row missing one of :data:`ROW_FIELDS` (written by an
    older version of the table) is not reused."""
    reusable = set(policies)
    have: dict[tuple[str, int, str], dict[str, Any]] = {}
    for src in sources:
        data = orjson.loads(src.read_bytes())
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise ValueError(f"{src}: not a suite JSON (no rows)")
        for r in data["rows"]:
            if r.get("policy") in reusable and r.get("scenario_sha") and all(f in r for f in ROW_FIELDS):
                have[(r["scenario_sha"], int(r["seed"]), r["policy"])] = r
    todo: list[Job] = []
    taken: list[dict[str, Any]] = []
    shas: dict[str, str] = {}
    for job in jobs:
        path, label, _, seed = job
        sha = shas.get(path) or shas.setdefault(path, scenario_sha(path))
        row = have.get((sha, seed, label)) if label in reusable else None
        if row is None:
            todo.append(job)
        else:
            taken.append(row)
    return todo, taken


def run_jobs(
    jobs: list[Job],
    workers: int,
    run_one: Callable[[Job], dict[str, Any]],
    progress: Callable[[int, int, dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every job on ``workers`` processes; rows come back in job order."""
    rows: list[dict[str, Any] | None] = [None] * len(jobs)
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(run_one, job): i for i, job in enumerate(jobs)}
        for done, fut in enumerate(as_completed(futures), start=1):
            row = fut.result()
            rows[futures[fut]] = row
            if progress is not None:
                progress(done, len(jobs), row)
    return [r for r in rows if r is not None]


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _index(rows: list[dict[str, Any]]) -> dict[tuple[str, int, str], dict[str, Any]]:
    return {(r["scenario"], int(r["seed"]), r["policy"]): r for r in rows}


def cost_ratio(d: dict[str, Any], c: dict[str, Any]) -> float:
    du, cu = d["per_successful_task_usd"], c["per_successful_task_usd"]
    if du is None:
        return math.inf
    if cu is None:  # classic succeeded at nothing: anything that succeeds is cheaper
        return 0.0
    return float(du) / float(cu)


def check_pair(d: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """The suite's per-pair targets for one (scenario, seed): default row ``d`` vs classic ``c``."""
    ratio = cost_ratio(d, c)
    tasks = int(d["tasks_succeeded"]) - int(c["tasks_succeeded"])
    p0 = int(d["p0_tasks_succeeded"]) - int(c["p0_tasks_succeeded"])
    return {
        "scenario": d["scenario"],
        "seed": int(d["seed"]),
        "cost_ratio": ratio,
        "tasks_delta": tasks,
        "p0_tasks_delta": p0,
        "cost_ok": ratio <= COST_RATIO_MAX,
        "tasks_ok": tasks >= -TASK_SLACK,
        "p0_ok": p0 >= -TASK_SLACK,
    }


def suite_targets(rows: list[dict[str, Any]], policy: str = "default") -> tuple[list[dict[str, Any]], bool]:
    """Every (scenario, seed) pair of ``policy`` against classic, and whether all targets are met
    (including the geometric mean). A pair missing either row fails."""
    t = _index(rows)
    pairs = sorted({(s, seed) for s, seed, _ in t})
    checks: list[dict[str, Any]] = []
    ok = bool(pairs)
    for s, seed in pairs:
        d, c = t.get((s, seed, policy)), t.get((s, seed, "classic"))
        if d is None or c is None:
            ok = False
            continue
        chk = check_pair(d, c)
        checks.append(chk)
        ok = ok and chk["cost_ok"] and chk["tasks_ok"] and chk["p0_ok"]
    g = _geomean([c["cost_ratio"] for c in checks])
    return checks, ok and g is not None and g <= GEOMEAN_MAX


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.2%}"


def suite_markdown(
    suite: str, rows: list[dict[str, Any]], seeds: int, reused_from: list[str] | None = None
) -> str:
    checks, ok = suite_targets(rows)
    t = _index(rows)
    lines = [
        f"# fleetloop sim: the {suite} suite over {seeds} seed{'s' if seeds != 1 else ''}",
        "",
        f"Generated by `python -m fleetloop.sim.table --suite {suite} --seeds {seeds}`. One row per",
        "(scenario, seed): default against classic on the same arrivals. Targets: tasks and",
        f"priority-0 tasks succeeded at least classic's minus {TASK_SLACK}, cost per successful task at most",
        f"{COST_RATIO_MAX}x classic's, geometric mean of that ratio at most {GEOMEAN_MAX}.",
        "",
    ]
    if reused_from:
        lines += [
            "Rows were reused from earlier runs of the same code "
            f"(`--reuse {','.join(reused_from)}`; same scenario files and seeds, see the module docstring).",
            "",
        ]
    lines += [
        "| scenario | seed | success classic | success default | tasks +/- | p0 classic | p0 default "
        "| p0 tasks +/- | $/success ratio | TTFT p99 classic / default ms | met |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for chk in checks:
        s, seed = chk["scenario"], chk["seed"]
        d, c = t[(s, seed, "default")], t[(s, seed, "classic")]
        met = chk["cost_ok"] and chk["tasks_ok"] and chk["p0_ok"]
        why = [
            w
            for w, good in (("cost", chk["cost_ok"]), ("tasks", chk["tasks_ok"]), ("p0", chk["p0_ok"]))
            if not good
        ]
        lines.append(
            f"| {s} | {seed} | {_pct(c['success_rate'])} | {_pct(d['success_rate'])} "
            f"| {chk['tasks_delta']:+d} "
            f"| {_pct(c['p0_success_rate'])} | {_pct(d['p0_success_rate'])} | {chk['p0_tasks_delta']:+d} "
            f"| {chk['cost_ratio']:.3f} | {c['ttft_p99_ms'] or 0:.0f} / {d['ttft_p99_ms'] or 0:.0f} "
            f"| {'yes' if met else 'NO: ' + ', '.join(why)} |"
        )
    lines.append("")
    lines.append(
        "| scenario | geomean $/success ratio | worst ratio | worst tasks +/- | worst p0 +/- | seeds met |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|")
    for s in sorted({c["scenario"] for c in checks}):
        cs = [c for c in checks if c["scenario"] == s]
        g = _geomean([c["cost_ratio"] for c in cs])
        met = sum(1 for c in cs if c["cost_ok"] and c["tasks_ok"] and c["p0_ok"])
        lines.append(
            f"| {s} | {'-' if g is None else f'{g:.3f}'} | {max(c['cost_ratio'] for c in cs):.3f} "
            f"| {min(c['tasks_delta'] for c in cs):+d} | {min(c['p0_tasks_delta'] for c in cs):+d} "
            f"| {met}/{len(cs)} |"
        )
    g = _geomean([c["cost_ratio"] for c in checks])
    lines.append("")
    g_ok = g is not None and g <= GEOMEAN_MAX
    lines.append(
        f"- geometric mean of $/success vs classic over {len(checks)} runs: "
        f"**{'-' if g is None else f'{g:.3f}'}**"
        f" (target <= {GEOMEAN_MAX}: {'met' if g_ok else 'NOT met'})"
    )
    missed = [c for c in checks if not (c["cost_ok"] and c["tasks_ok"] and c["p0_ok"])]
    lines.append(f"- (scenario, seed) pairs missing a target: **{len(missed)}** of {len(checks)}")
    lines.append(f"- every target met: **{'yes' if ok else 'no'}**")
    lines += latency_lines(rows)
    lines += against_peer_lines(rows, "modern")
    lines += against_peer_lines(rows, "llm-d")
    return "\n".join(lines) + "\n"


def within_slo(row: dict[str, Any]) -> tuple[bool | None, bool | None]:
    """(priority-0 TTFT p99 within the scenario's TTFT SLO, TBT p99 within its TBT SLO) for one
    row; ``None`` where the row has no figure (no priority-0 call got a first token, or an older
    row without the field)."""
    ttft, tbt = row.get("p0_ttft_p99_ms"), row.get("tbt_p99_ms")
    slo_ttft, slo_tbt = row.get("slo_ttft_ms"), row.get("slo_tbt_ms")
    return (
        None if ttft is None or slo_ttft is None else float(ttft) <= float(slo_ttft),
        None if tbt is None or slo_tbt is None else float(tbt) <= float(slo_tbt),
    )


def latency_counts(rows: list[dict[str, Any]], policy: str) -> tuple[int, int, int, int]:
    """(pairs whose priority-0 TTFT p99 is within SLO, pairs with that figure, pairs whose TBT p99
    is within SLO, pairs with that figure) over ``policy``'s rows."""
    ttft_ok = ttft_n = tbt_ok = tbt_n = 0
    for r in rows:
        if r["policy"] != policy:
            continue
        a, b = within_slo(r)
        ttft_n += a is not None
        ttft_ok += a is True
        tbt_n += b is not None
        tbt_ok += b is True
    return ttft_ok, ttft_n, tbt_ok, tbt_n


CALLER_SLI_TARGET = 0.99  # the share of calls within the SLO that makes a p99 within it


def caller_ttft_ok(row: dict[str, Any]) -> bool | None:
    """Whether at least 99% of the row's priority-0 calls got their first token within the
    scenario's TTFT SLO as their callers saw it (from the call's first attempt; a call that never
    completed is a miss); ``None`` for a row without priority-0 calls or without the fields."""
    calls, within = row.get("p0_calls"), row.get("p0_calls_ttft_within_slo")
    if not calls or within is None:
        return None
    return int(within) >= CALLER_SLI_TARGET * int(calls)


def caller_ttft_counts(rows: list[dict[str, Any]], policy: str) -> tuple[int, int, int, int]:
    """(pairs meeting :func:`caller_ttft_ok`, pairs with the figures, priority-0 calls within the
    SLO over those pairs, priority-0 calls over them) for ``policy``'s rows."""
    ok = n = within = calls = 0
    for r in rows:
        if r["policy"] != policy:
            continue
        got = caller_ttft_ok(r)
        if got is None:
            continue
        n += 1
        ok += got
        within += int(r["p0_calls_ttft_within_slo"])
        calls += int(r["p0_calls"])
    return ok, n, within, calls


LATENCY_POLICIES = ("classic", "modern", "llm-d", "default")


def latency_summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """:func:`latency_counts` by name, for each of :data:`LATENCY_POLICIES` that has rows (the
    suite JSON's ``latency`` and the markdown's closing lines)."""
    keys = ("p0_ttft_within_slo", "p0_ttft_pairs", "tbt_within_slo", "tbt_pairs")
    caller = ("p0_caller_ttft_pairs_met", "p0_caller_ttft_pairs", "p0_calls_ttft_within_slo", "p0_calls")
    present = {r["policy"] for r in rows}
    return {
        p: dict(zip(keys, latency_counts(rows, p), strict=True))
        | dict(zip(caller, caller_ttft_counts(rows, p), strict=True))
        for p in LATENCY_POLICIES
        if p in present
    }


def latency_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Latency against each scenario's SLO (reported, not a target): per scenario and policy, the
    seeds whose priority-0 TTFT p99 and whose TBT p99 are within it, and the median over seeds of
    the priority-0 TTFT p99."""
    summary = latency_summary(rows)
    policies = list(summary)
    if not any(r.get("slo_ttft_ms") is not None for r in rows) or not policies:
        return []
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for key, r in sorted(_index(rows).items()):  # seed order within each (scenario, policy)
        by.setdefault((key[0], key[2]), []).append(r)
    head = " | ".join(f"{p} TTFT / TBT" for p in policies)
    lines = [
        "",
        "## Latency against each scenario's SLO (reported, not a target)",
        "",
        "Seeds whose priority-0 TTFT p99 is within the scenario's `slo.ttft_ms`, and seeds whose TBT",
        "p99 over every call is within its `slo.tbt_ms`; then the median over seeds of the priority-0",
        "TTFT p99 (ms).",
        "",
        f"| scenario | SLO TTFT / TBT ms | {head} | p0 TTFT p99 " + " / ".join(policies) + " |",
        "|---|---:|" + "---:|" * len(policies) + "---:|",
    ]

    def cell(rs: list[dict[str, Any]]) -> tuple[str, str, str | None]:
        got = [within_slo(r) for r in rs]
        ttft = [x for x, _ in got if x is not None]
        tbt = [y for _, y in got if y is not None]
        vals = sorted(float(r["p0_ttft_p99_ms"]) for r in rs if r.get("p0_ttft_p99_ms") is not None)
        slo = None
        if rs and rs[0].get("slo_ttft_ms") is not None:
            slo = f"{rs[0]['slo_ttft_ms']:.0f} / {rs[0]['slo_tbt_ms']:.0f}"
        median = f"{vals[len(vals) // 2]:.0f}" if vals else "-"
        return f"{sum(ttft)}/{len(ttft)} / {sum(tbt)}/{len(tbt)}", median, slo

    lines += _scenario_rows(by, policies, cell)
    lines.append("")
    for p, c in summary.items():
        lines.append(
            f"- {p}: priority-0 TTFT p99 within SLO on **{c['p0_ttft_within_slo']}** of {c['p0_ttft_pairs']}"
            f" pairs, TBT p99 on **{c['tbt_within_slo']}** of {c['tbt_pairs']}"
        )
    return lines + caller_lines(by, summary)


def _scenario_rows(
    by: dict[tuple[str, str], list[dict[str, Any]]],
    policies: list[str],
    cell: Callable[[list[dict[str, Any]]], tuple[str, str, str | None]],
) -> list[str]:
    """One markdown row per scenario: its SLO, then ``cell(rows)``'s first part for each policy and
    its second parts joined by " / " (``cell`` gives (cell, figure, SLO or None) for one policy's
    rows of the scenario)."""
    out: list[str] = []
    for s in sorted({sc for sc, _ in by}):
        cells: list[str] = []
        figures: list[str] = []
        slo: str | None = None
        for p in policies:
            c, figure, slo_p = cell(by.get((s, p), []))
            cells.append(c)
            figures.append(figure)
            slo = slo or slo_p
        out.append(f"| {s} | {slo or '-'} | " + " | ".join(cells) + " | " + " / ".join(figures) + " |")
    return out


def _share(within: int, calls: int) -> str:
    return f"{100.0 * within / calls:.2f}%" if calls else "-"


def caller_lines(
    by: dict[tuple[str, str], list[dict[str, Any]]], summary: dict[str, dict[str, int]]
) -> list[str]:
    """Priority-0 first tokens as callers see them (see the module docstring): per scenario and
    policy, the seeds where at least 99% of calls got theirs within the SLO, and the share of calls
    within it over every seed."""
    policies = list(summary)
    if not any(c["p0_caller_ttft_pairs"] for c in summary.values()):  # rows without the figures
        return []
    lines = [
        "",
        "### Priority-0 first tokens as callers see them",
        "",
        "Every priority-0 call counts once, its first token timed from the call's first attempt to the",
        "first token of the attempt that completed it (sheds, timeouts, backoff and retries included);",
        "a call whose task failed during it is a miss. Seeds where at least 99% of the calls got their",
        "first token within `slo.ttft_ms` (the p99 a caller sees is within it), then the share of calls",
        "within it over every seed.",
        "",
        "| scenario | SLO TTFT ms | "
        + " | ".join(policies)
        + " | share within SLO "
        + " / ".join(policies)
        + " |",
        "|---|---:|" + "---:|" * len(policies) + "---:|",
    ]

    def cell(rows: list[dict[str, Any]]) -> tuple[str, str, str | None]:
        rs = [r for r in rows if caller_ttft_ok(r) is not None]
        within = sum(int(r["p0_calls_ttft_within_slo"]) for r in rs)
        share = _share(within, sum(int(r["p0_calls"]) for r in rs))
        slo = f"{rs[0]['slo_ttft_ms']:.0f}" if rs else None
        return f"{sum(bool(caller_ttft_ok(r)) for r in rs)}/{len(rs)}", share, slo

    lines += _scenario_rows(by, policies, cell)
    lines.append("")
    for p, c in summary.items():
        lines.append(
            f"- {p}: at least 99% of priority-0 calls within the TTFT SLO as callers see it on"
            f" **{c['p0_caller_ttft_pairs_met']}** of {c['p0_caller_ttft_pairs']} pairs;"
            f" {_share(c['p0_calls_ttft_within_slo'], c['p0_calls'])} of all priority-0 calls"
        )
    return lines


def against_peer_lines(rows: list[dict[str, Any]], peer: str) -> list[str]:
    """Default against a peer baseline (``modern``, ``llm-d``) per scenario (reported, not a
    target): geometric mean of the cost ratio over seeds, and tasks and priority-0 tasks won,
    summed over seeds; nothing when the suite did not run the peer."""
    t = _index(rows)
    pairs = sorted((s, seed) for s, seed, p in t if p == peer and (s, seed, "default") in t)
    if not pairs:
        return []
    lines = [
        "",
        f"## Against {peer} (reported, not a target)",
        "",
        f"| scenario | seeds | geomean $/success default / {peer} | tasks +/- | p0 tasks +/- |",
        "|---|---:|---:|---:|---:|",
    ]
    every: list[float] = []
    for s in sorted({s for s, _ in pairs}):
        ps = [(t[(s, seed, "default")], t[(s, seed, peer)]) for sc, seed in pairs if sc == s]
        ratios = [cost_ratio(d, m) for d, m in ps]
        finite = [r for r in ratios if math.isfinite(r) and r > 0]
        every.extend(finite)
        g = _geomean(finite)
        tasks = sum(int(d["tasks_succeeded"]) - int(m["tasks_succeeded"]) for d, m in ps)
        p0 = sum(int(d["p0_tasks_succeeded"]) - int(m["p0_tasks_succeeded"]) for d, m in ps)
        lines.append(f"| {s} | {len(ps)} | {'-' if g is None else f'{g:.3f}'} | {tasks:+d} | {p0:+d} |")
    g = _geomean(every)
    lines += [
        "",
        f"- geometric mean of $/success default vs {peer} over {len(every)} runs: "
        f"**{'-' if g is None else f'{g:.3f}'}**",
    ]
    return lines


def suite_ablation_markdown(rows: list[dict[str, Any]], levers: Iterable[str]) -> str:
    """Per lever off: geometric-mean cost ratio against the full default policy (> 1: the lever
    saves money) and the tasks it gains (+: the full policy succeeds at more tasks) per scenario,
    summed over seeds."""
    t = _index(rows)
    scenarios = sorted({r["scenario"] for r in rows})
    lines = [
        "# What each lever contributes (over seeds)",
        "",
        "The default policy with one lever turned off (its section swapped for the no-control algorithm).",
        "Each cell: geometric mean over seeds of cost per successful task, lever off / full default",
        "(> 1: the lever saves money), and in brackets the tasks the lever wins, summed over seeds",
        "(full default's successes minus the lever-off run's; negative: the lever loses tasks).",
        "",
        "| lever off | geomean | " + " | ".join(scenarios) + " |",
        "|---|---:|" + "---:|" * len(scenarios),
    ]
    for lever in levers:
        label = f"no-{lever}"
        cells: list[str] = []
        every: list[float] = []
        for s in scenarios:
            ratios: list[float] = []
            won = 0
            seen = False
            for (sc, seed, pol), a in sorted(t.items()):
                if sc != s or pol != label:
                    continue
                d = t.get((s, seed, "default"))
                if d is None:
                    continue
                seen = True
                ratio = cost_ratio(a, d)
                if math.isfinite(ratio) and ratio > 0:
                    ratios.append(ratio)
                won += int(d["tasks_succeeded"]) - int(a["tasks_succeeded"])
            g = _geomean(ratios)
            every.extend(ratios)
            cells.append(f"{g:.2f} ({won:+d})" if seen and g is not None else "-")
        ge = _geomean(every)
        lines.append(f"| {lever} | {'-' if ge is None else f'{ge:.3f}'} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def progress_line(done: int, total: int, row: dict[str, Any]) -> None:
    sys.stderr.write(
        f"[{done}/{total}] {row['scenario']} seed {row['seed']} {row['policy']}: "
        f"{_pct(row['success_rate'])} success, ${row['per_successful_task_usd'] or 0:.5f}/task, "
        f"{row['wall_s']:.0f} s\n"
    )
