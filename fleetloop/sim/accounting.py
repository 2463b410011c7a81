"""KPI accounting: cost per successful task, and where the money went.

- ``total_usd`` = sum over every node of (provisioned seconds x its $/s): idle and warming time
  included, up to the node's removal (drain, crash) or the end of the run.
- ``per_successful_task_usd`` = ``total_usd / tasks_succeeded`` (None when nothing succeeded).
- ``wasted_usd`` = GPU cost attributed to attempts that did not return ``ok`` (retried or failed
  calls, including work the node did after the client gave up) plus the cost of every attempt of a
  task that failed.
- Per priority class: tasks, success rate, TTFT p99, wasted, and cost per successful task with the
  fleet's total split by attributed GPU cost (idle capacity is shared in proportion to use).
- Latency: TTFT over attempts that received a first token; TBT p99 over every generated token
  (each iteration's step time, weighted by the tokens it produced).
- First tokens as the caller sees them, per priority class (an SLI in the SRE sense: good events
  over valid events): every call a task made counts once, its first token timed from the call's
  first attempt to the first token of the attempt that completed it (shed attempts, timeouts,
  backoff and retries included), and a call that never completed (its task failed during it) is
  a miss. ``calls_ttft_within_slo`` counts the calls whose first token came within the scenario's
  TTFT SLO. TTFT over successful attempts alone flatters a policy that fails its slowest calls:
  under a slowdown, the call that timed out drops out of that percentile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetloop.sim.clients import Task

# TBT histogram: log bins of ratio 2**(1/32) (~2%) from 0.1 ms.
_TBT_RATIO = 2 ** (1 / 32)
_TBT_MIN_MS = 0.1
_TBT_BINS = 32 * 24


def _tbt_bin(ms: float) -> int:
    if ms <= _TBT_MIN_MS:
        return 0
    return min(_TBT_BINS - 1, int(math.log(ms / _TBT_MIN_MS, _TBT_RATIO)) + 1)


def _r(x: float | None, nd: int = 9) -> float | None:
    return None if x is None else round(float(x), nd)


@dataclass(slots=True)
class ClassAcc:
    tasks_started: int = 0
    tasks_succeeded: int = 0
    tasks_failed: int = 0
    attributed_usd: float = 0.0
    wasted_usd: float = 0.0
    ttft_ms: list[float] = field(default_factory=list)
    calls: int = 0  # calls made (each counted once, whatever its retries)
    calls_ttft_within_slo: int = 0  # of them, first token within the TTFT SLO from the first attempt


class Accounting:
    def __init__(self, slo_ttft_ms: float) -> None:
        self.slo_ttft_ms = slo_ttft_ms
        self.classes: dict[int, ClassAcc] = {}
        self.sent = 0
        self.retries = 0
        self.shed = 0
        self.errors = 0
        self.timeouts = 0
        self.ok = 0
        self.ttft_ms: list[float] = []
        # The TBT histogram's weights, added in a list (a float64 add either way: the same sums as
        # adding into the numpy array, without a numpy scalar round trip per sample).
        self._tbt_weights: list[float] = [0.0] * _TBT_BINS

    def cls(self, priority: int) -> ClassAcc:
        c = self.classes.get(priority)
        if c is None:
            c = self.classes[priority] = ClassAcc()
        return c

    def task_started(self, task: Task) -> None:
        self.cls(task.priority).tasks_started += 1

    def attempt(
        self, task: Task, outcome: str, cost_usd: float, ttft_ms: float | None, attempt_no: int
    ) -> None:
        c = self.cls(task.priority)
        self.sent += 1
        if attempt_no > 0:
            self.retries += 1
        if outcome == "shed":
            self.shed += 1
        elif outcome == "timeout":
            self.timeouts += 1
        elif outcome == "ok":
            self.ok += 1
        else:
            self.errors += 1
        c.attributed_usd += cost_usd
        if outcome != "ok":
            c.wasted_usd += cost_usd
        task.attempts_cost.append(cost_usd if outcome == "ok" else 0.0)
        if ttft_ms is not None and outcome == "ok":
            self.ttft_ms.append(ttft_ms)
            c.ttft_ms.append(ttft_ms)

    def call_completed(self, priority: int, first_token_ms: float) -> None:
        """A call completed; its first token came ``first_token_ms`` after its first attempt was sent."""
        c = self.cls(priority)
        c.calls += 1
        if first_token_ms <= self.slo_ttft_ms:
            c.calls_ttft_within_slo += 1

    def call_missed(self, priority: int) -> None:
        """A call never completed: its task failed during it (a miss for every latency SLO)."""
        self.cls(priority).calls += 1

    def waste(self, priority: int, usd: float) -> None:
        c = self.cls(priority)
        c.attributed_usd += usd
        c.wasted_usd += usd

    def task_finished(self, task: Task, succeeded: bool) -> None:
        c = self.cls(task.priority)
        if succeeded:
            c.tasks_succeeded += 1
        else:
            c.tasks_failed += 1
            c.wasted_usd += sum(task.attempts_cost)

    @property
    def tbt_hist(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        """The TBT histogram: weight (tokens) per log bin."""
        return np.array(self._tbt_weights, dtype=np.float64)

    def tbt(self, samples: list[tuple[float, float]]) -> None:
        w = self._tbt_weights
        for ms, weight in samples:
            w[_tbt_bin(ms)] += weight

    def tbt_quantile(self, q: float) -> float | None:
        hist = self.tbt_hist
        total = float(hist.sum())
        if total <= 0:
            return None
        idx = int(np.searchsorted(np.cumsum(hist), q * total))
        idx = min(idx, _TBT_BINS - 1)
        if idx == 0:
            return _TBT_MIN_MS
        lo = _TBT_MIN_MS * _TBT_RATIO ** (idx - 1)
        return lo * math.sqrt(_TBT_RATIO)

    def summary(self, total_usd: float) -> dict[str, Any]:
        started = sum(c.tasks_started for c in self.classes.values())
        succeeded = sum(c.tasks_succeeded for c in self.classes.values())
        failed = sum(c.tasks_failed for c in self.classes.values())
        wasted = sum(c.wasted_usd for c in self.classes.values())
        attributed = sum(c.attributed_usd for c in self.classes.values())
        ttft = np.asarray(self.ttft_ms, dtype=np.float64)
        by_priority: dict[str, Any] = {}
        for p in sorted(self.classes):
            c = self.classes[p]
            share = (c.attributed_usd / attributed) if attributed > 0 else (c.tasks_started / max(1, started))
            t = np.asarray(c.ttft_ms, dtype=np.float64)
            by_priority[str(p)] = {
                "tasks_started": c.tasks_started,
                "tasks_succeeded": c.tasks_succeeded,
                "tasks_failed": c.tasks_failed,
                "success_rate": _r(c.tasks_succeeded / c.tasks_started if c.tasks_started else None),
                "ttft_p99_ms": _r(float(np.percentile(t, 99)) if t.size else None, 3),
                "cost_per_successful_task_usd": _r(
                    total_usd * share / c.tasks_succeeded if c.tasks_succeeded else None
                ),
                "wasted_usd": _r(c.wasted_usd),
                "calls": c.calls,
                "calls_ttft_within_slo": c.calls_ttft_within_slo,
            }
        return {
            "tasks": {
                "started": started,
                "succeeded": succeeded,
                "failed": failed,
                "success_rate": _r(succeeded / started if started else None),
            },
            "cost": {
                "total_usd": _r(total_usd),
                "per_successful_task_usd": _r(total_usd / succeeded if succeeded else None),
                "wasted_usd": _r(wasted),
                "attributed_usd": _r(attributed),
                "idle_usd": _r(max(0.0, total_usd - attributed)),
            },
            "latency": {
                "ttft_p50_ms": _r(float(np.percentile(ttft, 50)) if ttft.size else None, 3),
                "ttft_p99_ms": _r(float(np.percentile(ttft, 99)) if ttft.size else None, 3),
                "tbt_p99_ms": _r(self.tbt_quantile(0.99), 3),
            },
            "requests": {
                "sent": self.sent,
                "ok": self.ok,
                "retries": self.retries,
                "shed": self.shed,
                "errors": self.errors,
                "timeouts": self.timeouts,
            },
            "by_priority": by_priority,
        }
