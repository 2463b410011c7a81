"""A router's per-worker outcome counters -> RequestOutcomes for ``fleet.requests``: the translation.

vllm-router and SGLang's router report no call to fleetloop, but both count, per worker, how the
calls their own circuit breaker saw ended, on their Prometheus page (read from the installed
binaries, vllm-router 0.1.17 and sglang-router 0.3.2):

- vllm-router: ``vllm_router_cb_outcomes_total{worker="URL",outcome="success"|"failure"}``;
- SGLang's router: ``smg_worker_cb_outcomes_total{worker="URL",outcome="success"|"failure"}``.

Each is one count per attempt the router sent the worker (its own retries included: a call it
retried on another worker is a failure on the first and a success on the second). ``failure`` is
what the router's breaker holds against the worker: an error status or a transport error
(connection refused or reset, its request timeout). The two routers draw the line differently:
vllm-router counts a 4xx answer (429 included) as a ``success``, SGLang's router counts any answer
that is not 2xx as a ``failure``. Neither says which status, nor how long the call took, per worker.

:class:`Translator` turns the counters' increase since the last scrape into one record per counted
call: ``success`` -> ``ok``, ``failure`` -> ``error``, on the worker's node (the worker map). It
only translates; what a run of errors means is the daemon's breaker's to judge. What is unknown is
filled as a call without fleetloop's headers is through HAProxy's log (the table of
:mod:`fleetloop.edges.headers`): its own request id, which is also its task (a one-call task, its
own last call: a success ends it, a failure leaves it to the ledger's handoff horizon), tenant
``anonymous``, priority 1, no budget, no tokens, no cost, no TTFT, ``e2e_ms`` 0 (unknown; the daemon
reads no call's e2e). Within a worker's period the errors are spread evenly among its successes (the
counters keep no order): a worker that fails every call makes an unbroken run of errors, one
failing a call in ten makes runs of one, and the breaker's failure streak reads either as it is.

What it does with what a page may hold:

- the first scrape is a baseline: calls counted before the actuator started are not published (they
  may be hours old); a series first seen later starts from 0 (the router makes it at its first call);
- a counter below its last value is a reset (the router restarted): the calls since are its value,
  counted in ``resets``, never negative calls;
- a worker the map does not name: its calls are counted (``unmapped_calls``, its URL in
  ``unmapped_workers``, for the caller to log once) and not published under any node;
- an outcome label other than ``success`` or ``failure``: counted (``unread_calls``), not published;
- a value that is not a finite number >= 0 (NaN, an infinity, a negative): counted (``hostile``)
  and skipped, the last good value kept, so the next good one resumes the count; so is a new series
  past the ``MAX_SERIES`` (10,000) followed (a page naming endless workers would grow memory);
- more calls in a period than ``max_calls_per_s`` (1000 per worker per second of the period) could
  make: the worker's counts are scaled down to that many, its outcomes' shares kept, and the rest
  counted (``capped``). No LLM engine completes a thousand calls a second per worker, so a jump past
  it is a hostile or broken counter, and unbounded it would make the actuator build and send
  millions of records from one number;
- a scrape more than ``max_gap_s`` (10 s) after the last good one: the calls in between are counted
  (``stale_calls``) and not published (placed in that gap they would be older than the daemon takes
  on time; placed now they would be a burst that did not happen), and the count starts again; so
  are the calls of a scrape stamped no later than the last (the wall clock stepped back).

A scrape that fails is the caller's to handle (publish nothing: no data is not "all ok").
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from fleetloop.edges.actuate.worker_list.mapping import WorkerMap
from fleetloop.edges.headers import DEFAULT_PRIORITY, call_headers
from fleetloop.schemas.requests import Outcome, RequestOutcome

MAX_CALLS_PER_S = 1000.0  # per worker: far above what an LLM engine completes
MAX_GAP_S = 10.0
MAX_SERIES = 10_000  # (worker, outcome) series followed: a router has two per worker

Samples = Mapping[str, list[tuple[dict[str, str], float]]]


@dataclass(frozen=True, slots=True)
class OutcomeCounter:
    """Where a router's Prometheus page counts each worker's calls by how they ended."""

    router: str
    prefix: str  # every metric the router exports starts with it (a page without one is not its)
    metric: str
    outcomes: Mapping[str, Outcome]  # the outcome label's values -> fleetloop's outcome
    worker_label: str = "worker"
    outcome_label: str = "outcome"


VLLM_ROUTER = OutcomeCounter(
    "vllm-router", "vllm_router_", "vllm_router_cb_outcomes_total", {"success": "ok", "failure": "error"}
)
SGLANG_ROUTER = OutcomeCounter(
    "sglang-router", "smg_", "smg_worker_cb_outcomes_total", {"success": "ok", "failure": "error"}
)


@dataclass(slots=True)
class TranslateStats:
    periods: int = 0
    outcomes: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)
    resets: int = 0
    unmapped_calls: int = 0
    unmapped_workers: set[str] = field(default_factory=set)
    unread_calls: int = 0
    hostile: int = 0
    capped: int = 0
    stale_calls: int = 0


def worker_key(url: str) -> str:
    """A worker URL as the router labels it and the map names it (no trailing slash)."""
    return url.rstrip("/")


class Translator:
    """``period(samples, now_ms)`` per scrape: the RequestOutcomes of the calls counted since the last.

    Pure: no I/O, no clock (``now_ms`` comes in); ``run_id`` makes its request ids unique across
    the actuator's restarts (each is its own task in the ledger, so one must not continue another).
    """

    def __init__(
        self,
        spec: OutcomeCounter,
        wmap: WorkerMap,
        *,
        model: str,
        run_id: str,
        max_calls_per_s: float = MAX_CALLS_PER_S,
        max_gap_s: float = MAX_GAP_S,
    ) -> None:
        self.spec, self.model, self.run_id = spec, model, run_id
        self.max_calls_per_s, self.max_gap_ms = max_calls_per_s, max_gap_s * 1000.0
        self.nodes = {
            worker_key(u): (pool, node) for pool, ns in wmap.pools.items() for node, u in ns.items()
        }
        self.stats = TranslateStats()
        self._last: dict[tuple[str, str], float] = {}
        self._last_ms: int | None = None
        self._seq = 0

    def period(self, samples: Samples, now_ms: int) -> list[RequestOutcome]:
        """The calls each series counted since the last call of this (none on the first: a baseline)."""
        spec, last = self.spec, self._last
        baseline = self._last_ms is None
        span_ms = 0 if self._last_ms is None else now_ms - self._last_ms
        # a span past the gap, or none (the wall clock stepped back): nowhere true to place the calls
        stale = not baseline and not 0 < span_ms <= self.max_gap_ms
        counts: dict[str, dict[Outcome, int]] = {}
        for labels, value in samples.get(spec.metric, ()):
            worker, label = worker_key(labels.get(spec.worker_label, "")), labels.get(spec.outcome_label, "")
            key = (worker, label)
            if not (math.isfinite(value) and value >= 0):
                self.stats.hostile += 1
                continue
            before = last.get(key)
            if before is None and len(last) >= MAX_SERIES:
                self.stats.hostile += 1  # a page naming endless workers: not followed, not kept
                continue
            last[key] = value
            if baseline:
                continue
            if before is None:
                before = 0.0
            if value < before:
                self.stats.resets += 1
                before = 0.0
            n = math.floor(value) - math.floor(before)
            if n <= 0:
                continue
            if stale:
                self.stats.stale_calls += n
                continue
            if worker not in self.nodes:
                self.stats.unmapped_calls += n
                self.stats.unmapped_workers.add(worker)
                continue
            outcome = spec.outcomes.get(label)
            if outcome is None:
                self.stats.unread_calls += n
                continue
            got = counts.setdefault(worker, {})
            got[outcome] = got.get(outcome, 0) + n
        self._last_ms = now_ms
        self.stats.periods += 1
        if baseline or stale:
            return []
        cap = max(1, math.ceil(self.max_calls_per_s * span_ms / 1000.0))
        out: list[RequestOutcome] = []
        for worker in sorted(counts):
            pool_id, node_id = self.nodes[worker]
            for i, outcome, n in self._spread(self._capped(counts[worker], cap)):
                out.append(self._record(pool_id, node_id, outcome, now_ms - span_ms + (i + 1) * span_ms // n))
        self.stats.outcomes += len(out)
        for o in out:
            self.stats.by_outcome[o.outcome] = self.stats.by_outcome.get(o.outcome, 0) + 1
        return out

    def _capped(self, counts: dict[Outcome, int], cap: int) -> dict[Outcome, int]:
        """``counts`` scaled down to ``cap`` calls in all when above it (largest remainders keep
        the outcomes' shares); the calls left out are counted in ``capped``."""
        total = sum(counts.values())
        if total <= cap:
            return counts
        exact = {k: v * cap / total for k, v in counts.items()}
        kept = {k: math.floor(x) for k, x in exact.items()}
        for k in sorted(exact, key=lambda k: kept[k] - exact[k])[: cap - sum(kept.values())]:
            kept[k] += 1
        self.stats.capped += total - cap
        return kept

    @staticmethod
    def _spread(counts: dict[Outcome, int]) -> Iterator[tuple[int, Outcome, int]]:
        """(index, outcome, total) for each call, the failed ones spread evenly among the ``ok``."""
        n = sum(counts.values())
        bad = [(k, v) for k, v in sorted(counts.items()) if k != "ok" and v > 0]
        failed = sum(v for _, v in bad)
        seq: list[Outcome] = []
        for k, v in bad:
            seq.extend([k] * v)
        j = 0
        for i in range(n):
            if failed and (i + 1) * failed // n > i * failed // n:
                yield i, seq[j], n
                j += 1
            else:
                yield i, "ok", n

    def _record(self, pool_id: str, node_id: str, outcome: Outcome, ts_ms: int) -> RequestOutcome:
        self._seq += 1
        rid = f"{self.spec.router}-{self.run_id}-{self._seq}"
        c = call_headers({}, request_id=rid, default_priority=DEFAULT_PRIORITY)
        return RequestOutcome(
            ts_ms=ts_ms,
            pool_id=pool_id,
            node_id=node_id,
            model=self.model,
            ttft_ms=None,
            e2e_ms=0.0,
            outcome=outcome,
            **c.outcome_fields(outcome),
        )
