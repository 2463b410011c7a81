"""What a bench stack scenario's runs add up to: per arm the median of its valid runs with min and
max, the targets checked (best fleetloop arm against best peer; every fleetloop arm against its
router alone), a markdown table and a timeline plot with every arm overlaid."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetloop.bench.stack.arms import BY_NAME, alone_all

if TYPE_CHECKING:
    from rich.table import Table

# (key, label, getter, higher is better)
METRICS: tuple[tuple[str, str, Callable[[dict[str, Any]], float | None], bool], ...] = (
    ("success", "success", lambda r: r["tasks"]["success_rate"], True),
    ("p0_success", "p0 success", lambda r: r["tasks"]["p0_success_rate"], True),
    ("cost_per_task", "$ / successful task", lambda r: r["cost_per_successful_task_usd"], False),
    ("ttft_p50", "TTFT p50 ms", lambda r: r["latency"]["ttft_p50_ms"], False),
    ("ttft_p99", "TTFT p99 ms", lambda r: r["latency"]["ttft_p99_ms"], False),
    ("node_hours", "node-hours", lambda r: r["nodes"]["node_hours"], False),
    ("peak_nodes", "peak nodes", lambda r: r["nodes"]["peak_billed"], False),
)
SMOOTH_S = 10
SUCCESS_AT_LEAST = 1.0  # x the peer's
COST_AT_MOST = 0.9
TTFT_AT_MOST = 1.1


def lag_p99(r: dict[str, Any]) -> float:
    """The worst p99 lag of a run: the emulator's node events or any agents process's event loop."""
    lag = r["realtime_lag"]
    vals = [lag["node_events"]["p99_ms"], lag["agents_loop_p99_ms"]]
    return max((v for v in vals if v is not None), default=0.0)


def summarize(runs: list[dict[str, Any]], arms: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for arm in arms:
        valid = [r for r in runs if r["arm"] == arm and not r.get("void")]
        row: dict[str, Any] = {"runs": len(valid)}
        for key, _, get, _ in METRICS:
            vals = [v for v in (get(r) for r in valid) if v is not None]
            row[key] = (
                {"median": statistics.median(vals), "min": min(vals), "max": max(vals)} if vals else None
            )
        row["lag_p99_max_ms"] = max((lag_p99(r) for r in valid), default=None)
        out[arm] = row
    return out


def _med(summary: dict[str, dict[str, Any]], arm: str, key: str) -> float | None:
    m = summary[arm].get(key)
    return None if m is None else float(m["median"])


def best(summary: dict[str, dict[str, Any]], arms: list[str]) -> str | None:
    """Highest median task success; ties: lowest median cost per successful task."""
    ranked = [a for a in arms if _med(summary, a, "success") is not None]
    if not ranked:
        return None

    def key(a: str) -> tuple[float, float]:
        cost = _med(summary, a, "cost_per_task")
        return (-(_med(summary, a, "success") or 0.0), cost if cost is not None else math.inf)

    return min(ranked, key=key)


def _runs_of(runs: list[dict[str, Any]], arm: str) -> dict[int, dict[str, Any]]:
    return {r["run"]: r for r in runs if r["arm"] == arm and not r.get("void")}


def compare(
    runs: list[dict[str, Any]], summary: dict[str, dict[str, Any]], ours: str, peer: str
) -> dict[str, Any]:
    """The three targets for ``ours`` against ``peer``: on medians, and run by run (same repeat)."""
    checks: tuple[tuple[str, Callable[[float, float], bool], str], ...] = (
        ("success", lambda a, b: a >= b * SUCCESS_AT_LEAST, f">= {SUCCESS_AT_LEAST:g}x"),
        ("cost_per_task", lambda a, b: a <= b * COST_AT_MOST, f"<= {COST_AT_MOST:g}x"),
        ("ttft_p50", lambda a, b: a <= b * TTFT_AT_MOST, f"<= {TTFT_AT_MOST:g}x"),
    )
    getters = {k: g for k, _, g, _ in METRICS}
    mine, theirs = _runs_of(runs, ours), _runs_of(runs, peer)
    out: dict[str, Any] = {"ours": ours, "peer": peer, "targets": {}}
    for key, ok, want in checks:
        a, b = _med(summary, ours, key), _med(summary, peer, key)
        per_run = []
        for n in sorted(set(mine) & set(theirs)):
            x, y = getters[key](mine[n]), getters[key](theirs[n])
            per_run.append(None if x is None or y is None else bool(ok(x, y)))
        median_ok = a is not None and b is not None and bool(ok(a, b))
        out["targets"][key] = {
            "want": want,
            "ours": a,
            "peer": b,
            "ratio": round(a / b, 3) if a is not None and b else None,
            "median_ok": median_ok,
            "per_run_ok": per_run,
            "met": median_ok and bool(per_run) and all(v is True for v in per_run),
        }
    out["met"] = all(t["met"] for t in out["targets"].values())
    return out


def targets(
    runs: list[dict[str, Any]], summary: dict[str, dict[str, Any]], arms: list[str]
) -> dict[str, Any]:
    peers = [a for a in arms if not BY_NAME[a].fleetloop]
    ours = [a for a in arms if BY_NAME[a].fleetloop]
    bp, bo = best(summary, peers), best(summary, ours)
    out: dict[str, Any] = {"best_peer": bp, "best_fleetloop": bo, "headline": None, "same_router": []}
    if bp and bo:
        out["headline"] = compare(runs, summary, bo, bp)
    for a in ours:
        # Its router alone at its best: of that router's own strategies in the run (LiteLLM's three,
        # vllm-router's two), the one :func:`best` ranks first, as the headline's peer is chosen.
        peer = best(summary, [p.name for p in alone_all(BY_NAME[a]) if p.name in arms])
        if peer is not None:
            out["same_router"].append(compare(runs, summary, a, peer))
    return out


def _f(v: Any, nd: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}" if not math.isinf(v) else "inf"
    return str(v)


def _cell(m: dict[str, float] | None, nd: int) -> str:
    if m is None:
        return "-"
    return f"{_f(float(m['median']), nd)} [{_f(float(m['min']), nd)}–{_f(float(m['max']), nd)}]"


def _verdict(c: dict[str, Any]) -> str:
    parts = []
    for key, t in c["targets"].items():
        runs = "".join("✓" if v else ("✗" if v is False else "?") for v in t["per_run_ok"])
        parts.append(
            f"{key} {t['want']}: x{_f(t['ratio'], 3)} {'met' if t['met'] else 'NOT met'} (runs {runs or '-'})"
        )
    return f"`{c['ours']}` vs `{c['peer']}`: " + "; ".join(parts)


def hold_note(hold_s: float, run_s: float) -> str:
    """What a run shorter than the peers' scale-down stabilization means for their cost."""
    return (
        f"peers' KEDA keeps the nodes it started with for {hold_s:g} s after its first sync (the HPA's "
        f"default scale-down stabilization, not shortened); a run's load and drain last at most "
        f"{run_s:g} s, so the peers cannot scale in within it and their cost includes nodes a longer "
        "run would let go"
    )


def _hold(doc: dict[str, Any]) -> str:
    hold_s = doc.get("peer_scale_in_hold_s")
    run_s = float(doc["seconds"]) + float(doc.get("drain_s") or 0.0)
    return f" Note: {hold_note(hold_s, run_s)}." if hold_s is not None and run_s < hold_s else ""


def table_markdown(doc: dict[str, Any]) -> str:
    digits = {
        "success": 3,
        "p0_success": 3,
        "cost_per_task": 6,
        "ttft_p50": 1,
        "ttft_p99": 1,
        "node_hours": 3,
    }
    head = (
        "| arm | valid runs | "
        + " | ".join(label for _, label, _, _ in METRICS)
        + " | worst lag p99 ms |\n|---|---|"
        + "---|" * len(METRICS)
        + "---|\n"
    )
    rows = []
    for arm in doc["arms"]:
        s = doc["summary"][arm]
        cells = [_cell(s[k], digits.get(k, 0)) for k, _, _, _ in METRICS]
        rows.append(f"| {arm} | {s['runs']} | " + " | ".join(cells) + f" | {_f(s['lag_p99_max_ms'])} |\n")
    lines = [f"- {v}." for v in verdicts(doc)]
    voids = [f"{v['arm']} run {v['run']} (lag p99 {v['lag_p99_ms']:.1f} ms)" for v in doc["void"]]
    faults = "; ".join(
        f"{f['kind']} {', '.join(f['nodes']) or '(agents)'} at {f['t_s']:.0f} s"
        for f in doc.get("faults", [])
    )
    return (
        f"## bench stack — {doc['scenario']} ({doc['seconds']:g} s of load, "
        f"{doc['runs']} interleaved run{'s' if doc['runs'] != 1 else ''} per arm)\n\n"
        f"Median [min–max] over each arm's valid runs. Faults: {faults or 'none'}. Cost = every node's "
        "usd_per_h x the time it was billed (booting, serving, draining) from load start to the last "
        "task's end. Peers autoscale with KEDA on queue and KV (`modern`); fleetloop arms with fleetloop's "
        f"default policy.{_hold(doc)}\n\n"
        + head
        + "".join(rows)
        + "\nTargets (median of runs, and in each run; success >= peer, cost <= 0.9x, TTFT p50 <= 1.1x):\n\n"
        + "\n".join(lines)
        + "\n\nEvery run, in the order they ran (lag p99 of the emulator's node events and of the "
        "agents' event loops; a void run's figures are left out of the medians):\n\n"
        + runs_markdown(doc)
        + "\n"
        + (
            f"Void runs (lag p99 above {doc['max_lag_ms']:g} ms, repeated): {', '.join(voids)}.\n\n"
            if voids
            else ""
        )
        + "".join(
            f"Failed run: {f['arm']} run {f['run']}: {f['error']}\n\n" for f in doc.get("failed_runs", [])
        )
        + f"Command: `{doc['command']}`, commit {doc['commit']}, run {doc['date_utc']}, "
        f"{doc['machine']['cpus']} CPUs, load average {doc['machine']['load_start']} at start and "
        f"{doc['machine']['load_end']} at end.\n"
    )


def runs_markdown(doc: dict[str, Any]) -> str:
    """Every run in the order it ran: its figures and its lag p99, void and failed runs marked."""
    lines = [
        "| # | arm | run | tasks ok | success | $ / successful task | TTFT p50 ms | peak nodes "
        "| emulator lag p99 ms | agents lag p99 ms | |\n",
        "|---|---|---|---|---|---|---|---|---|---|---|\n",
    ]
    void_attempts = {(v["arm"], v["run"]): 0 for v in doc.get("void", [])}
    for v in doc.get("void", []):
        void_attempts[(v["arm"], v["run"])] += 1
    order = [*doc["runs_raw"], *doc.get("failed_runs", [])]
    order.sort(key=lambda r: (r["run"], doc["arms"].index(r["arm"])))
    for i, r in enumerate(order, 1):
        if "error" in r:
            lines.append(f"| {i} | {r['arm']} | {r['run']} | - | - | - | - | - | - | - | failed |\n")
            continue
        t, lag = r["tasks"], r["realtime_lag"]
        repeats = void_attempts.get((r["arm"], r["run"]), 0)
        note = "void" if r.get("void") else (f"after {repeats} void" if repeats else "")
        lines.append(
            f"| {i} | {r['arm']} | {r['run']} | {t['succeeded']}/{t['started']} | {_f(t['success_rate'], 3)} "
            f"| {_f(r['cost_per_successful_task_usd'], 6)} | {_f(r['latency']['ttft_p50_ms'])} "
            f"| {r['nodes']['peak_billed']} | {_f(lag['node_events']['p99_ms'])} "
            f"| {_f(lag['agents_loop_p99_ms'])} | {note} |\n"
        )
    return "".join(lines)


def terminal_table(doc: dict[str, Any]) -> Table:
    """The summary as a table for the terminal: one row an arm, fleetloop's arms in bold."""
    from rich.markup import escape  # noqa: PLC0415 - rich loads only to print
    from rich.table import Table  # noqa: PLC0415

    digits = {"success": 3, "p0_success": 3, "cost_per_task": 5, "node_hours": 2}
    t = Table(title=escape(f"bench stack — {doc['scenario']}: median [min–max] of each arm's valid runs"))
    t.add_column("arm")
    t.add_column("runs", justify="right")
    for _, label, _, _ in METRICS:
        t.add_column(label, justify="right")
    t.add_column("worst lag p99 ms", justify="right")
    for arm in doc["arms"]:
        s = doc["summary"][arm]
        cells = [escape(_cell(s[k], digits.get(k, 0))) for k, _, _, _ in METRICS]
        style = "bold" if BY_NAME[arm].fleetloop else None
        t.add_row(arm, str(s["runs"]), *cells, _f(s["lag_p99_max_ms"]), style=style)
    return t


def verdicts(doc: dict[str, Any]) -> list[str]:
    """The targets in words: best fleetloop arm against best peer, then each against its router alone."""
    t = doc["targets"]
    lines = [f"Best fleetloop arm against best peer: {_verdict(t['headline'])}"] if t["headline"] else []
    lines.extend(f"Same router alone: {_verdict(c)}" for c in t["same_router"])
    return lines or ["no pair to compare"]


def median_run(runs: list[dict[str, Any]], arm: str) -> dict[str, Any] | None:
    """The arm's valid run whose cost per successful task is the median (the one plotted)."""
    valid = [r for r in runs if r["arm"] == arm and not r.get("void")]
    if not valid:
        return None
    valid.sort(key=lambda r: r["cost_per_successful_task_usd"] or math.inf)
    return valid[(len(valid) - 1) // 2]


def plot_timelines(doc: dict[str, Any], path: Path) -> None:
    import matplotlib  # noqa: PLC0415 - matplotlib loads only to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after matplotlib.use('Agg'): no display

    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for arm in doc["arms"]:
        r = median_run(doc["runs_raw"], arm)
        if r is None:
            continue
        tl = r["timeline"]
        t = tl["t"]
        cum = [0, *tl["ok_tasks"]]  # tasks succeeded per second over the last SMOOTH_S seconds
        ok = [(cum[i + 1] - cum[max(0, i + 1 - SMOOTH_S)]) / min(i + 1, SMOOTH_S) for i in range(len(t))]
        style = "-" if BY_NAME[arm].fleetloop else "--"
        label = f"{arm} (run {r['run']})"
        axes[0].plot(t, ok, style, label=label, lw=1.2)
        axes[1].plot(
            t, [v if v is not None else float("nan") for v in tl["ttft_p50"]], style, label=label, lw=1.2
        )
        axes[2].plot(t, tl["nodes_provisioned"], style, label=label, lw=1.2)
    axes[0].set_ylabel(f"tasks succeeded / s ({SMOOTH_S} s mean)")
    axes[1].set_ylabel("TTFT p50 ms (last 5 s)")
    axes[2].set_ylabel("nodes billed")
    axes[2].set_xlabel("seconds since load began")
    for f in doc.get("faults", []):
        for ax in axes:
            ax.axvline(f["t_s"], color="grey", ls=":", lw=1)
    axes[0].legend(loc="upper left", fontsize=7, ncol=2)
    axes[0].set_title(f"bench stack — {doc['scenario']} (each arm's median-cost run; solid: fleetloop)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# (metric, axis label, the target's factor on the best peer's median) for the summary plot
SUMMARY_PANELS: tuple[tuple[str, str, float], ...] = (
    ("success", "task success", SUCCESS_AT_LEAST),
    ("cost_per_task", "$ / successful task", COST_AT_MOST),
    ("ttft_p50", "TTFT p50 ms", TTFT_AT_MOST),
)


def plot_summary(doc: dict[str, Any], path: Path) -> None:
    """Each arm's median (dot) and min–max (bar) of the targets' three figures side by side, fleetloop's
    arms in colour, with the line each target draws from the best peer's median."""
    import matplotlib  # noqa: PLC0415 - matplotlib loads only to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after matplotlib.use('Agg'): no display

    arms = doc["arms"]
    peer = doc["targets"]["best_peer"]
    fig, axes = plt.subplots(1, len(SUMMARY_PANELS), figsize=(12, 0.45 * len(arms) + 1.6), sharey=True)
    for ax, (key, label, factor) in zip(axes, SUMMARY_PANELS, strict=True):
        for y, arm in enumerate(arms):
            m = doc["summary"][arm][key]
            if m is None:
                continue
            colour = "tab:blue" if BY_NAME[arm].fleetloop else "tab:grey"
            ax.plot([m["min"], m["max"]], [y, y], color=colour, lw=2, alpha=0.5)
            ax.plot([m["median"]], [y], "o", color=colour)
        line = _med(doc["summary"], peer, key) if peer else None
        if line is not None:
            ax.axvline(line * factor, color="tab:red", ls=":", lw=1)
        ax.set_xlabel(label)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(arms)), arms)
    axes[0].invert_yaxis()
    title = f"bench stack — {doc['scenario']}: median and min–max of each arm's valid runs (blue: fleetloop)"
    if peer:
        title += f"; red: the target against the best peer, {peer}"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
