"""SLO classes: the one place a policy's latency objectives live (``spec.slo``), as algorithms see it.

The policy document states SLOs per priority class, optionally narrowed to one model's or one
pool's calls (:class:`fleetloop.schemas.policy.SloSpec`). The engine compiles them once into an
:class:`SloBook` and hands it to every algorithm through ``PolicyContext.slo``; admission,
batching, autoscaling and the breaker read their SLO there and carry no copy of their own.

Which SLO judges a pool's latency: **the strictest SLO among the calls the pool actually served**
in the window (per priority class, from ``PoolView.requests_by_priority_w``), taken per signal
(the smallest TTFT target and the smallest TBT target). The reason is physical: a continuous
batching engine serves its running calls together, so every call on a node sees the same step
time and queue whatever its priority; the pool meets the strictest class it serves or it does not
meet it. A pool serving only best-effort work is held to the best-effort SLO, not to the
interactive one, and one serving nothing in the window is held to the strictest class that could
reach it (the conservative choice when there is no evidence).

Resolution of one call's SLO, most specific first: ``(priority, pool)``, ``(priority, model)``,
``priority``, then ``default``.

Restating the objective (:func:`restated`): a run against a workload whose SLO is given elsewhere
(a simulator scenario's ``slo``) keeps the policy's class *shape* and takes the workload's
*scale*: the default becomes the stated SLO and every class is scaled by the same two factors
(``ttft x stated_ttft / default_ttft``, ``tbt x stated_tbt / default_tbt``), clamped to the
schema's bounds. The policy says how much looser best effort is than interactive work; the
workload says what interactive means for it.

Failure mode: a pool that serves a trickle of a strict class (one priority-0 call in a window of
thousands of batch calls) is held to the strict SLO for that window; that is the point of the
class (the call is served by the same batch), at the cost of capacity sized for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fleetloop.schemas.policy import SloClass, SloSpec, SloTarget

# SloTarget's bounds (ms): a restated class is clamped into them.
TTFT_BOUNDS = (50.0, 600_000.0)
TBT_BOUNDS = (5.0, 60_000.0)


@dataclass(frozen=True, slots=True)
class Slo:
    """A resolved objective: TTFT (p99) and TBT (p99) in milliseconds."""

    ttft_ms: float
    tbt_ms: float


@dataclass(frozen=True, slots=True)
class SloBook:
    """``spec.slo`` compiled for lookups. Pure and immutable; built once per policy."""

    default: Slo = Slo(2000.0, 100.0)
    by_priority: Mapping[int, Slo] = field(default_factory=dict)
    by_model: Mapping[tuple[int, str], Slo] = field(default_factory=dict)
    by_pool: Mapping[tuple[int, str], Slo] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec: SloSpec) -> SloBook:
        def s(t: SloTarget) -> Slo:
            return Slo(float(t.ttft_ms), float(t.tbt_ms))

        by_priority: dict[int, Slo] = {}
        by_model: dict[tuple[int, str], Slo] = {}
        by_pool: dict[tuple[int, str], Slo] = {}
        for c in spec.classes:
            if c.pool is not None:
                by_pool[(c.priority, c.pool)] = s(c)
            elif c.model is not None:
                by_model[(c.priority, c.model)] = s(c)
            else:
                by_priority[c.priority] = s(c)
        return cls(
            default=s(spec.default),
            by_priority=dict(sorted(by_priority.items())),
            by_model=dict(sorted(by_model.items())),
            by_pool=dict(sorted(by_pool.items())),
        )

    def target(self, priority: int, *, model: str = "", pool: str = "") -> Slo:
        """The SLO of one call of ``priority`` on ``pool`` (serving ``model``)."""
        return (
            self.by_pool.get((priority, pool))
            or self.by_model.get((priority, model))
            or self.by_priority.get(priority)
            or self.default
        )

    def priorities(self) -> tuple[int, ...]:
        """Every priority class named anywhere in the book (sorted)."""
        named = set(self.by_priority) | {p for p, _ in self.by_model} | {p for p, _ in self.by_pool}
        return tuple(sorted(named))

    def strictest(self, priorities: Iterable[int], *, model: str = "", pool: str = "") -> Slo:
        """Per signal, the tightest SLO among calls of ``priorities`` (the default with none)."""
        slos = [self.target(p, model=model, pool=pool) for p in sorted(set(priorities))]
        if not slos:
            slos = [self.default]
        return Slo(min(s.ttft_ms for s in slos), min(s.tbt_ms for s in slos))

    def served(self, served_by_priority: Mapping[int, int], *, model: str = "", pool: str = "") -> Slo:
        """The SLO a pool is judged by: the strictest among the classes it served (calls > 0), or
        with nothing served, the strictest among every named class and the default."""
        served = [p for p, n in served_by_priority.items() if n > 0]
        if served:
            return self.strictest(served, model=model, pool=pool)
        every = (
            self.strictest(self.priorities(), model=model, pool=pool) if self.priorities() else self.default
        )
        return Slo(min(every.ttft_ms, self.default.ttft_ms), min(every.tbt_ms, self.default.tbt_ms))


DEFAULT_BOOK = SloBook()


def _clamp(x: float, bounds: tuple[float, float]) -> float:
    return min(max(x, bounds[0]), bounds[1])


def restated(spec: SloSpec, ttft_ms: float, tbt_ms: float) -> SloSpec:
    """``spec`` with its default set to ``(ttft_ms, tbt_ms)`` and every class scaled by the same
    factors (see the module docstring): the classes keep their ratios to the default."""
    ft = ttft_ms / spec.default.ttft_ms
    fb = tbt_ms / spec.default.tbt_ms
    classes = tuple(
        SloClass(
            priority=c.priority,
            model=c.model,
            pool=c.pool,
            ttft_ms=_clamp(round(c.ttft_ms * ft, 3), TTFT_BOUNDS),
            tbt_ms=_clamp(round(c.tbt_ms * fb, 3), TBT_BOUNDS),
        )
        for c in spec.classes
    )
    default = SloTarget(ttft_ms=_clamp(ttft_ms, TTFT_BOUNDS), tbt_ms=_clamp(tbt_ms, TBT_BOUNDS))
    return SloSpec(default=default, classes=classes)
