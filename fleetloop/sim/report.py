"""``--report DIR``: an HTML page with PNG timelines of one run, or of several runs overlaid.

Panels, over virtual time in 10 s buckets: TTFT p99 of successful calls (the bucket's largest
per-second p99, an upper bound) against the scenario's SLO, tasks succeeded and failed, cost rate
($/h of provisioned nodes), nodes provisioned and warm, and control events (enforced open
breakers, shed calls, retries). Fault times are marked on every panel. With ``--compare`` each
policy is one line in the same colour on every panel, so a cascade reads side by side.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetloop.sim.runner import RunResult
from fleetloop.sim.scenario import Scenario

BUCKET_S = 10
COLORS = ("tab:gray", "tab:orange", "tab:blue", "tab:green", "tab:purple", "tab:brown")


@dataclass(frozen=True, slots=True)
class Run:
    label: str
    result: RunResult
    data: dict[str, Any]


def _buckets(rows: list[dict[str, float]]) -> dict[str, list[float]]:
    keys: tuple[str, ...] = ("t_min", "ttft_p99_ms", "tasks_succeeded", "tasks_failed", "cost_rate_usd_per_h")
    keys += ("provisioned", "warm", "breakers_open", "shed", "retries", "ok", "timeouts", "orphaned")
    out: dict[str, list[float]] = {k: [] for k in keys}
    for i in range(0, len(rows), BUCKET_S):
        chunk = rows[i : i + BUCKET_S]
        out["t_min"].append(chunk[-1]["t_s"] / 60.0)
        out["ttft_p99_ms"].append(max(r["ttft_p99_ms"] for r in chunk))
        for k in ("tasks_succeeded", "tasks_failed", "shed", "retries", "ok", "timeouts", "orphaned"):
            out[k].append(sum(r.get(k, 0.0) for r in chunk))
        for k in ("cost_rate_usd_per_h", "provisioned", "warm", "breakers_open"):
            out[k].append(chunk[-1][k])
    return out


def write_report(
    directory: str | Path, scenario: Scenario, runs: Sequence[Run], *, preface_html: str = ""
) -> Path:
    """Write ``index.html`` and the PNG panels; ``preface_html`` (already escaped) goes above the
    summary table (``fleetloop whatif`` puts its KPI and fidelity tables there)."""
    import matplotlib  # noqa: PLC0415 - matplotlib loads only to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after matplotlib.use('Agg'): no display

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    series = [(r, _buckets(r.result.report.timeline), COLORS[i % len(COLORS)]) for i, r in enumerate(runs)]
    panels: list[tuple[str, str]] = []
    fault_min = sorted({f.at_s / 60.0 for f in scenario.faults})

    def panel(
        name: str, title: str, ylabel: str, lines: list[tuple[str, str, str]], *, log: bool = False
    ) -> None:
        """lines: (series key, label suffix, linestyle)."""
        fig, ax = plt.subplots(figsize=(9, 3.2))
        for run, b, color in series:
            for key, suffix, style in lines:
                label = f"{run.label}{suffix}" if len(series) > 1 or suffix else None
                ax.plot(b["t_min"], b[key], color=color, linestyle=style, label=label, linewidth=1.4)
        for x in fault_min:
            ax.axvline(x, color="black", linestyle=":", linewidth=1)
        if name == "ttft.png":
            ax.axhline(scenario.slo.ttft_ms, color="tab:red", linestyle="--", linewidth=1, label="SLO")
        if log:
            ax.set_yscale("symlog")
            ax.set_ylim(bottom=0)
        ax.set_ylabel(ylabel)
        ax.set_xlabel("virtual time (min); dotted lines: faults")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper left")
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        panels.append((name, title))

    panel("ttft.png", "TTFT p99 of successful calls", "TTFT p99 (ms)", [("ttft_p99_ms", "", "-")], log=True)
    panel(
        "tasks.png",
        "Task outcomes (solid: succeeded, dashed: failed)",
        f"tasks / {BUCKET_S} s",
        [("tasks_succeeded", " ok", "-"), ("tasks_failed", " failed", "--")],
    )
    panel("cost.png", "Cost rate (provisioned nodes)", "$ / h", [("cost_rate_usd_per_h", "", "-")])
    panel(
        "nodes.png",
        "Nodes (solid: provisioned, dashed: warm)",
        "nodes",
        [("provisioned", " provisioned", "-"), ("warm", " warm", "--")],
    )
    panel(
        "control.png",
        "Breakers open (solid), retries (dashed), shed calls (dotted)",
        f"count / {BUCKET_S} s",
        [("breakers_open", " breakers", "-"), ("retries", " retries", "--"), ("shed", " shed", ":")],
        log=True,
    )
    panel(
        "storm.png",
        "Calls answered (solid) and timed out at the client (dashed)",
        f"calls / {BUCKET_S} s",
        [("ok", " answered", "-"), ("timeouts", " timed out", "--")],
        log=True,
    )
    page = _page(scenario, runs, panels, preface_html)
    (out / "index.html").write_text(page)
    return out / "index.html"


def _summary_rows(runs: Sequence[Run]) -> str:
    head = "".join(f"<th>{html.escape(r.label)}</th>" for r in runs)
    metrics: list[tuple[str, Any]] = [
        ("tasks started", lambda d: d["tasks"]["started"]),
        ("task success", lambda d: _pct(d["tasks"]["success_rate"])),
        ("cost per successful task", lambda d: _usd(d["cost"]["per_successful_task_usd"])),
        ("total / wasted cost", lambda d: f"${d['cost']['total_usd']:.2f} / ${d['cost']['wasted_usd']:.2f}"),
        ("TTFT p50 / p99", lambda d: f"{d['latency']['ttft_p50_ms']} / {d['latency']['ttft_p99_ms']} ms"),
        ("retries / shed", lambda d: f"{d['requests']['retries']} / {d['requests']['shed']}"),
        (
            "timeouts / orphans",
            lambda d: f"{d['requests']['timeouts']} / {d['requests'].get('orphaned', 0)}",
        ),
        ("failed tasks by cause", lambda d: causes_text(d["tasks"].get("failed_by", {}))),
        ("priority-0 success", lambda d: _pct(d["by_priority"].get("0", {}).get("success_rate"))),
        (
            "priority-0 calls, first token within SLO",
            lambda d: calls_within_text(d["by_priority"].get("0", {})),
        ),
    ]
    body = "\n".join(
        f"<tr><th>{html.escape(name)}</th>"
        + "".join(f"<td>{html.escape(str(f(r.data)))}</td>" for r in runs)
        + "</tr>"
        for name, f in metrics
    )
    return f"<table><tr><th></th>{head}</tr>\n{body}</table>"


def causes_text(failed_by: dict[str, int]) -> str:
    """``failed_by`` in one line: ``deadline:timeout 4, retries_exhausted:timeout 1`` (or ``none``)."""
    return ", ".join(f"{k} {v}" for k, v in failed_by.items()) or "none"


def calls_within_text(row: dict[str, Any]) -> str:
    """The share of a class's calls whose first token came within the scenario's TTFT SLO as their
    callers saw it (from the call's first attempt; a call that never completed is a miss), from a
    ``by_priority`` entry of a run's JSON; ``-`` without calls."""
    calls, within = row.get("calls"), row.get("calls_ttft_within_slo")
    return "-" if not calls or within is None else f"{within / calls:.2%}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.2%}"


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x:.5f}"


def _page(
    scenario: Scenario, runs: Sequence[Run], panels: list[tuple[str, str]], preface_html: str = ""
) -> str:
    title = f"fleetloop sim: {scenario.name} under {', '.join(r.label for r in runs)}"
    faults = "".join(
        f"<li>{f.at_s:.0f} s: {html.escape(f.kind)} {html.escape(f.node or f.pool or '')}</li>"
        for f in scenario.faults
    )
    imgs = "\n".join(
        f'<h2>{html.escape(t)}</h2><img src="{n}" alt="{html.escape(t)}" width="810">' for n, t in panels
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body{{font-family:sans-serif;max-width:900px;margin:2em auto}} th{{text-align:left;padding-right:1.5em}}
td{{text-align:right;padding-right:1.5em}}
</style>
</head><body>
<h1>{html.escape(title)}</h1>
<p>{html.escape(scenario.description)}</p>
{preface_html}
<p>seed {scenario.seed}, {scenario.duration_s} s of arrivals, SLO TTFT {scenario.slo.ttft_ms} ms</p>
{_summary_rows(runs)}
<h3>faults</h3><ul>{faults or "<li>none</li>"}</ul>
{imgs}
</body></html>
"""
