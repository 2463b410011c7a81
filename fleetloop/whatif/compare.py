"""KPI rows of a what-if and its fidelity check (pure: ``fleetloop sim --json`` objects in, rows out).

KPIs of a run: task success, priority-0 success, cost per successful task, TTFT p99, tasks lost
(tasks that failed: past their deadline or their retries). The candidate's effect is
``candidate - recorded`` on the same scenario and seed, paired by seed; over several seeds, the
mean of those deltas (and their range), and each side's mean.

Fidelity: the runs under the recorded policy (their mean) against what the window observed (same definitions,
:class:`fleetloop.whatif.derive.Observed`). The signed error is ``simulated - observed``: in
percentage points for success rates, and in the figure's unit and relative to the observed value
for TTFT p99 and cost per successful task. A large error says the scenario misses something of the
incident (a fault the telemetry did not show, a load shape the averages flatten), so the candidate's
delta deserves the same doubt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetloop.whatif.derive import Observed

KPIS: tuple[tuple[str, str], ...] = (
    ("task_success", "task success"),
    ("p0_success", "priority-0 success"),
    ("cost_per_successful_task_usd", "cost per successful task"),
    ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("tasks_lost", "tasks lost"),
)


def kpis(run: dict[str, Any]) -> dict[str, float | int | None]:
    """The five KPIs of one ``fleetloop sim --json`` object."""
    p0 = run["by_priority"].get("0") or {}
    return {
        "task_success": run["tasks"]["success_rate"],
        "p0_success": p0.get("success_rate"),
        "cost_per_successful_task_usd": run["cost"]["per_successful_task_usd"],
        "ttft_p99_ms": run["latency"]["ttft_p99_ms"],
        "tasks_lost": run["tasks"]["failed"],
    }


def observed_kpis(o: Observed) -> dict[str, float | int | None]:
    return {
        "task_success": o.success_rate,
        "p0_success": o.p0_success_rate,
        "cost_per_successful_task_usd": o.cost_per_successful_task_usd,
        "ttft_p99_ms": o.ttft_p99_ms,
        "tasks_lost": o.tasks_failed,
    }


def delta(a: float | int | None, b: float | int | None) -> float | None:
    """``b - a``, or None when either is unknown."""
    if a is None or b is None:
        return None
    return round(float(b) - float(a), 9)


def relative(err: float | None, ref: float | int | None) -> float | None:
    if err is None or ref is None or ref == 0:
        return None
    return round(err / float(ref), 6)


def mean(xs: Sequence[float | int | None]) -> float | None:
    """The mean of the known values (None when none is known)."""
    known = [float(x) for x in xs if x is not None]
    return round(sum(known) / len(known), 9) if known else None


def fidelity(
    observed: Observed, recorded_runs: Sequence[dict[str, Any]]
) -> dict[str, dict[str, float | None]]:
    """Signed errors of the simulated recorded-policy runs (their mean over seeds) against the
    window: simulated - observed."""
    obs = observed_kpis(observed)
    sims = [kpis(r) for r in recorded_runs]
    out: dict[str, dict[str, float | None]] = {}
    for key in ("task_success", "ttft_p99_ms", "cost_per_successful_task_usd"):
        o, s = obs[key], mean([k[key] for k in sims])
        err = delta(o, s)
        row: dict[str, float | None] = {
            "observed": None if o is None else float(o),
            "simulated": s,
            "error": err,
        }
        if key != "task_success":
            row["relative_error"] = relative(err, o)
        out[key] = row
    return out


def comparison(
    recorded_runs: Sequence[dict[str, Any]], candidate_runs: Sequence[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per KPI: the recorded and candidate runs' means over seeds, and ``candidate - recorded``
    paired by seed (same scenario, same seed: the same arrivals and sizes): its mean, min and max."""
    if len(recorded_runs) != len(candidate_runs) or not recorded_runs:
        raise ValueError("comparison needs one candidate run per recorded run, at least one")
    rec = [kpis(r) for r in recorded_runs]
    cand = [kpis(c) for c in candidate_runs]
    out: dict[str, dict[str, Any]] = {}
    for k, _ in KPIS:
        deltas = [d for d in (delta(r[k], c[k]) for r, c in zip(rec, cand, strict=True)) if d is not None]
        out[k] = {
            "recorded": mean([r[k] for r in rec]),
            "candidate": mean([c[k] for c in cand]),
            "delta": mean(deltas),
            "delta_min": min(deltas) if deltas else None,
            "delta_max": max(deltas) if deltas else None,
        }
    return out
