"""``--report DIR``: an HTML page with PNG timelines of one simulated run (matplotlib, Agg backend).

Panels, over virtual time in 10 s buckets: TTFT p99 of successful calls (the bucket's largest
per-second p99, an upper bound), tasks succeeded and failed, cost rate ($/h of provisioned nodes),
nodes provisioned and warm, and control events (enforced open breakers, shed calls, retries).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from fleetloop.sim.runner import RunResult

BUCKET_S = 10


def _buckets(rows: list[dict[str, float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {
        k: []
        for k in (
            "t_min",
            "ttft_p99_ms",
            "tasks_succeeded",
            "tasks_failed",
            "cost_rate_usd_per_h",
            "provisioned",
            "warm",
            "breakers_open",
            "shed",
            "retries",
        )
    }
    for i in range(0, len(rows), BUCKET_S):
        chunk = rows[i : i + BUCKET_S]
        out["t_min"].append(chunk[-1]["t_s"] / 60.0)
        out["ttft_p99_ms"].append(max(r["ttft_p99_ms"] for r in chunk))
        for k in ("tasks_succeeded", "tasks_failed", "shed", "retries"):
            out[k].append(sum(r[k] for r in chunk))
        for k in ("cost_rate_usd_per_h", "provisioned", "warm", "breakers_open"):
            out[k].append(chunk[-1][k])
    return out


def write_report(directory: str | Path, result: RunResult, data: dict[str, Any]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    b = _buckets(result.report.timeline)
    t = b["t_min"]
    panels: list[tuple[str, str]] = []

    def save(name: str, title: str, fig: Any) -> None:
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        panels.append((name, title))

    fig, ax = plt.subplots(figsize=(9, 3))
    ax.plot(t, b["ttft_p99_ms"], color="tab:red")
    ax.set_ylabel("TTFT p99 (ms)")
    ax.set_xlabel("virtual time (min)")
    ax.set_yscale("symlog")
    save("ttft.png", "TTFT p99 of successful calls", fig)

    fig, ax = plt.subplots(figsize=(9, 3))
    ax.plot(t, b["tasks_succeeded"], label="succeeded", color="tab:green")
    ax.plot(t, b["tasks_failed"], label="failed", color="tab:red")
    ax.set_ylabel(f"tasks / {BUCKET_S} s")
    ax.set_xlabel("virtual time (min)")
    ax.legend()
    save("tasks.png", "Task outcomes", fig)

    fig, ax = plt.subplots(figsize=(9, 3))
    ax.plot(t, b["cost_rate_usd_per_h"], color="tab:purple")
    ax.set_ylabel("$ / h")
    ax.set_xlabel("virtual time (min)")
    save("cost.png", "Cost rate (provisioned nodes)", fig)

    fig, ax = plt.subplots(figsize=(9, 3))
    ax.plot(t, b["provisioned"], label="provisioned")
    ax.plot(t, b["warm"], label="warm")
    ax.set_ylabel("nodes")
    ax.set_xlabel("virtual time (min)")
    ax.legend()
    save("nodes.png", "Nodes provisioned and warm", fig)

    fig, ax = plt.subplots(figsize=(9, 3))
    ax.plot(t, b["breakers_open"], label="breakers open (enforced)")
    ax.plot(t, b["shed"], label=f"shed calls / {BUCKET_S} s")
    ax.plot(t, b["retries"], label=f"retries / {BUCKET_S} s")
    ax.set_xlabel("virtual time (min)")
    ax.set_yscale("symlog")
    ax.legend()
    save("control.png", "Breakers, shedding and retries", fig)

    tasks, cost, lat = data["tasks"], data["cost"], data["latency"]
    per_task = cost["per_successful_task_usd"]
    summary = [
        ("scenario", data["scenario"]),
        ("policy", data["policy"]),
        ("seed", str(data["seed"])),
        (
            "tasks started / succeeded / failed",
            f"{tasks['started']} / {tasks['succeeded']} / {tasks['failed']}",
        ),
        ("cost per successful task", "-" if per_task is None else f"${per_task:.5f}"),
        ("total / wasted cost", f"${cost['total_usd']:.2f} / ${cost['wasted_usd']:.2f}"),
        ("TTFT p50 / p99", f"{lat['ttft_p50_ms']} ms / {lat['ttft_p99_ms']} ms"),
        ("virtual / wall", f"{data['sim']['virtual_s']} s / {data['sim']['wall_s']} s"),
    ]
    rows = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in summary)
    imgs = "\n".join(
        f'<h2>{html.escape(title)}</h2><img src="{name}" alt="{html.escape(title)}">'
        for name, title in panels
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>fleetloop sim: {html.escape(data["scenario"])}</title>
<style>
body{{font-family:sans-serif;max-width:900px;margin:2em auto}} th{{text-align:left;padding-right:2em}}
</style>
</head><body>
<h1>fleetloop sim: {html.escape(data["scenario"])} under {html.escape(data["policy"])}</h1>
<table>{rows}</table>
{imgs}
</body></html>
"""
    (out / "index.html").write_text(page)
    return out / "index.html"
