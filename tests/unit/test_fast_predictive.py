"""slo-predictive (its batch form, a pool at a time) decides exactly as its oracle reading each pool's
node views one by one (``tests/oracles/predictive.py``): the same decisions' JSON, diagnostics bit for
bit and states, tick after tick on a generated fleet whose nodes go cold, drain, go silent, fail and
report hostile values; and ``NodeFigures`` (read from the snapshot's columns, no views) are the views'
own values."""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import numpy as np
import pytest
from fleetloop.policies.autoscale import predictive
from fleetloop.policies.autoscale.predictive import NodeFigures, SloPredictive, SloPredictiveParams, rule
from fleetloop.policies.autoscale.predictive.rule import (
    MIN_TREND_SAMPLES,
    SIGNIFICANCE,
    accumulation,
    fit_slope,
    trend_slope,
)
from fleetloop.policies.autoscale.predictive.signals import Siblings, Sides
from fleetloop.policies.base import PolicyContext
from fleetloop.policies.slo import DEFAULT_BOOK
from fleetloop.schemas.decisions import AutoscaleDecision, BreakerDecision
from tests.oracles import predictive as oracle
from tests.support.perturbed import perturbed_snapshots


@pytest.fixture(scope="module")
def snapshots() -> list[Any]:
    return list(perturbed_snapshots(320, 45))


def test_node_figures_are_the_views_values(snapshots: list[Any]) -> None:
    for snap in snapshots[::5]:
        for pool_id in [*sorted(snap.pools), "no-such-pool"]:
            views = snap.pool_nodes(pool_id)
            got = predictive.node_figures(snap, pool_id)
            assert len(got) == len(views)
            for f, v in zip(got, views, strict=True):
                want = tuple(getattr(v, name) for name in NodeFigures._fields)
                assert [(type(x), repr(x)) for x in f] == [(type(x), repr(x)) for x in want]


@pytest.mark.parametrize(
    "params",
    [SloPredictiveParams(), SloPredictiveParams(spare_nodes=0, tolerance=0.0, down_period_s=0.0)],
    ids=["default", "eager"],
)
def test_predictive_decides_as_its_oracle_on_views(snapshots: list[Any], params: Any) -> None:
    algo = SloPredictive()
    fast: dict[str, Any] = {}
    plain: dict[str, Any] = {}
    reasons: set[str] = set()
    # A pool whose node reports 10**12 queued prompt tokens (a value the schema accepts) used to ask
    # for ~1.7e15 nodes, beyond the decision's figure bound, failing the pool's tick in both forms;
    # the need is capped at MAX_NEED_NODES now, so no tick may be refused.
    refused = 0
    desired: set[int] = set()
    for k, snap in enumerate(snapshots):
        for pool_id in sorted(snap.pools):
            # Now and then a breaker ejects the pool's first node: the sibling reads leave it out.
            nodes = snap.pool_nodes(pool_id)
            breakers = {}
            if nodes and k % 3 == 0:
                n = nodes[0]
                breakers[n.node_id] = BreakerDecision(
                    entity=f"node/{n.node_id}", reason="x", pool_id=pool_id, node_id=n.node_id, state="open"
                )
            ctx = PolicyContext(
                now_ms=snap.now_ms, tick_id=k, tick_ms=1000, pool_id=pool_id, seed=(k,), breakers=breakers
            )
            refusal: ValueError | None = None
            try:
                a = algo.decide(snap, params, fast.get(pool_id, algo.initial_state()), ctx)
            except ValueError as e:  # both forms refuse the same hostile figures (see above)
                refusal = e
            if refusal is not None:
                with pytest.raises(type(refusal), match=re.escape(str(refusal))):
                    oracle.decide(snap, params, plain.get(pool_id, algo.initial_state()), ctx)
                refused += 1
                continue
            b = oracle.decide(snap, params, plain.get(pool_id, algo.initial_state()), ctx)
            assert [d.model_dump_json() for d in a.decisions] == [d.model_dump_json() for d in b.decisions]
            assert {x: v.hex() for x, v in a.diagnostics.items()} == {
                x: v.hex() for x, v in b.diagnostics.items()
            }
            assert a.state == b.state
            fast[pool_id], plain[pool_id] = a.state, b.state
            reasons.update(d.reason.split(":")[0] for d in a.decisions)
            desired.update(d.desired_nodes for d in a.decisions if isinstance(d, AutoscaleDecision))
    assert len(reasons) >= 2, reasons
    assert len(desired) >= 5, desired
    assert refused == 0


def test_the_sibling_short_the_most_is_the_first_greatest_of_the_others() -> None:
    """``Siblings.most_short`` (two best per model, not a scan per pool) picks what the plain scan
    over the model's short pools picks for every pool asking, ties to the first in pool order and
    the pool's own entry skipped, with the pressure of the entry picked."""

    class Listed(Siblings):
        def __init__(self, listed: list[tuple[str, float, float]]) -> None:
            super().__init__(None, SloPredictiveParams(), Sides([], [], [], [], [], [], []))  # type: ignore[arg-type]
            self.listed = listed

        def shortfalls(self, model: str, slo: Any) -> list[tuple[str, float, float]]:
            return self.listed

    slo = DEFAULT_BOOK.default
    for n in range(6):  # every order of shortfalls among three values, ties included
        for shorts in itertools.product((0.5, 1.0, 2.0), repeat=n):
            listed = [(f"p{i}", 0.1 * i, short) for i, short in enumerate(shorts)]
            sib = Listed(listed)
            for pool_id in [f"p{i}" for i in range(n + 1)]:
                want = (0.0, 0.0)
                for sid, p_s, short in listed:
                    if sid != pool_id and short > want[1]:
                        want = (p_s, short)
                assert sib.most_short("m", slo, pool_id) == want, (listed, pool_id)


def _plain_fit_slope(samples: list[tuple[int, float]], window_ms: int) -> float:
    """``fit_slope`` as first written: generators over the samples (the form the fast one keeps)."""
    n = len(samples)
    if n < 3:
        return 0.0
    span_ms = samples[-1][0] - samples[0][0]
    n_eff = span_ms / max(1, window_ms)
    if n_eff < MIN_TREND_SAMPLES:
        return 0.0
    ts = [(t - samples[0][0]) / 1000.0 for t, _ in samples]
    ys = [y for _, y in samples]
    mt = sum(ts) / n
    my = sum(ys) / n
    sxx = sum((t - mt) ** 2 for t in ts)
    if sxx <= 0:
        return 0.0
    slope = sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / sxx
    if slope <= 0:
        return 0.0
    resid = sum((y - my - slope * (t - mt)) ** 2 for t, y in zip(ts, ys, strict=True))
    var = resid / max(1, n - 2)
    se = math.sqrt(var / sxx) * math.sqrt(n / max(n_eff, 1.0))
    return slope if slope > SIGNIFICANCE * se else 0.0


def _plain_trend_slope(samples: list[tuple[int, float]], window_ms: int) -> float:
    if len(samples) < 2:
        return 0.0
    mid_ms = (samples[0][0] + samples[-1][0]) / 2.0
    whole = _plain_fit_slope(samples, window_ms)
    newer = _plain_fit_slope([s for s in samples if s[0] >= mid_ms], window_ms)
    return min(whole, newer) if whole > 0 and newer > 0 else 0.0


def test_the_trend_fit_is_the_plain_sums_bit_for_bit() -> None:
    """``fit_slope`` and ``trend_slope`` (sums iterated in C) give the plain generators' doubles,
    bits and all, on demand histories of every shape: ticks a second apart with jitter, flat, noisy,
    rising, falling, stepped, repeated or out-of-order times, integer demand, a handful of samples
    or a lead's worth (the trend is positive on many, so the residual and the newer half are fitted)."""
    rng = np.random.default_rng(11)
    fits = 0
    for case in range(4000):
        n = int(rng.integers(0, 200))
        times = np.cumsum(rng.choice([0, 1000, 1000, 1000, 997, 1013], size=n)) + int(rng.integers(0, 10**12))
        if case % 17 == 0:
            times = rng.permutation(times)
        level = float(rng.uniform(0.0, 5e5))
        slope = float(rng.choice([0.0, 1.0, 50.0, -20.0, 1e3]))
        noise = float(rng.choice([0.0, 1.0, 100.0, 1e4]))
        ys = level + slope * (times - (times[0] if n else 0)) / 1000.0 + noise * rng.standard_normal(n)
        if case % 5 == 0:
            ys = np.round(ys)
        demand = [int(y) for y in ys] if case % 11 == 0 else [float(y) for y in ys]
        samples = list(zip((int(t) for t in times), demand, strict=True))
        window_ms = int(rng.choice([1000, 5000, 10_000]))
        for got, want in (
            (fit_slope(samples, window_ms), _plain_fit_slope(samples, window_ms)),
            (trend_slope(samples, window_ms), _plain_trend_slope(samples, window_ms)),
        ):
            assert got.hex() == float(want).hex(), (case, got, want)
            fits += got > 0
    assert fits > 500  # the significant-trend branch is exercised, not only the early zeros


def test_the_kept_time_terms_give_the_plain_fit_on_every_pool_and_tick() -> None:
    """The fit's time terms are kept per offset pattern (every pool of a tick, and the next tick,
    hold samples at the same offsets): a fit that finds them kept gives the plain doubles too, for
    other demand, other start times and a lead's span sliding on by a tick."""
    rng = np.random.default_rng(3)
    rule._time_terms.cache_clear()
    for tick in range(40):
        t0 = 1_767_225_600_000 + 1000 * tick
        for pool in range(30):
            n = 121 if pool % 3 else 60
            ys = 1e4 + 25.0 * np.arange(n) * (pool % 4) + 300.0 * rng.standard_normal(n)
            samples = [(t0 + 1000 * i, float(y)) for i, y in enumerate(ys)]
            for got, want in (
                (fit_slope(samples, 10_000), _plain_fit_slope(samples, 10_000)),
                (trend_slope(samples, 10_000), _plain_trend_slope(samples, 10_000)),
            ):
                assert got.hex() == float(want).hex(), (tick, pool)
    info = rule._time_terms.cache_info()
    assert info.hits > 50 * info.misses  # the pools and ticks found the terms kept


def _demand_batch(
    rng: np.random.Generator, tick: int, window_ms: int
) -> list[list[tuple[int, float]] | None]:
    """One tick's demand samples of ~60 pools, most at the same times (a lead of them, or a shorter
    span), with trends well past, near and below significance, and hostile figures."""
    t0 = 1_767_225_600_000 + 1000 * tick
    times = [t0 + 1000 * i for i in range(121)]
    out: list[list[tuple[int, float]] | None] = []
    for pool in range(60):
        kind = pool % 12
        at = times if kind else times[60:]  # a few pools hold half a lead
        if kind == 11:
            at = [t + 7 for t in at]  # times no other pool shares
        n = len(at)
        noise = float(rng.choice([0.0, 1.0, 300.0, 1e5]))
        # A lead's fit has a standard error of about noise * 0.0026 * sqrt(n / n_eff) (121 samples a
        # second apart): slopes spread over 0-8 of those, over the threshold (2), and half of them
        # close to it.
        se = noise * 0.0026 * math.sqrt(121 / max(120_000 / window_ms, 1.0))
        z = float(rng.uniform(0.0, 8.0) if pool % 2 else rng.uniform(1.9, 2.1))
        slope = float(rng.choice([-1.0, 0.0, 1.0, 1.0])) * se * z
        ys = 1e4 + slope * np.arange(n) + noise * rng.standard_normal(n)
        demand: list[float] = [float(y) for y in ys]
        if kind == 3:
            demand[int(rng.integers(0, n))] = float(rng.choice([math.nan, math.inf, -math.inf, 1e308, -0.0]))
        if kind == 5 and tick % 2:
            demand = [float(round(y)) for y in demand]
        samples: list[tuple[int, float]] = list(zip(at, demand, strict=True))
        if kind == 7 and tick % 3 == 0:
            samples[5] = (samples[5][0], int(samples[5][1]))  # type: ignore[assignment]  # an int demand
        out.append(None if kind == 9 else samples[: 2 if kind == 10 else n])
    return out


def test_the_batch_trend_fits_are_each_pools_own_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``trend_slopes`` (the pools sharing sample times fitted as arrays, the pools whose slope is
    clearly not significant left at 0.0 without the exact residual) gives ``trend_slope`` of each
    pool, bits and all: flat, rising and falling demand, slopes at every distance from the
    significance threshold, NaN, infinities, -0.0, an int demand, times no other pool shares, too
    few samples, no samples; and it leaves most pools to the arrays, not to ``trend_slope``."""
    rng = np.random.default_rng(23)
    plain = rule.trend_slope
    fitted = [0]

    def counted(samples: Any, window_ms: int) -> float:
        fitted[0] += 1
        return plain(samples, window_ms)

    near = trends = pools = 0
    for tick in range(60):
        window_ms = 10_000 if tick % 4 else 1000
        many = _demand_batch(rng, tick, window_ms)
        want = [plain(s, window_ms) if s is not None else 0.0 for s in many]
        monkeypatch.setattr(rule, "trend_slope", counted)
        got = rule.trend_slopes(many, window_ms)
        monkeypatch.setattr(rule, "trend_slope", plain)
        assert [g.hex() for g in got] == [float(w).hex() for w in want], tick
        pools += len(many)
        trends += sum(w > 0 for w in want)
        for s in many:
            if s is not None and len(s) == 121 and all(type(y) is float and math.isfinite(y) for _, y in s):
                whole = _plain_fit_slope(s, window_ms)
                ratio = _significance(s, window_ms)
                near += 1.8 < ratio < 2.2 and whole == 0.0
    assert trends > 100  # the significant branch is exercised
    assert near > 50  # and slopes just short of significance, which the arrays must not misjudge
    assert fitted[0] < pools / 2  # most pools are judged by the arrays (a trend is fitted again)


def _significance(samples: list[tuple[int, float]], window_ms: int) -> float:
    """A fit's slope over its standard error (:func:`fit_slope`'s test is ``> SIGNIFICANCE``)."""
    n = len(samples)
    ts = np.array([(t - samples[0][0]) / 1000.0 for t, _ in samples])
    ys = np.array([y for _, y in samples])
    dt = ts - ts.mean()
    sxx = float((dt * dt).sum())
    with np.errstate(all="ignore"):  # a 1e308 demand overflows the sums: no trend near the threshold
        slope = float((dt * (ys - ys.mean())).sum()) / sxx
        resid = float(((ys - ys.mean() - slope * dt) ** 2).sum())
    n_eff = (samples[-1][0] - samples[0][0]) / window_ms
    se = math.sqrt(resid / (n - 2) / sxx) * math.sqrt(n / max(n_eff, 1.0))
    return slope / se if se > 0 else math.inf


def test_the_open_workflow_midpoint_is_the_plain_scans() -> None:
    """``accumulation`` reads the open count at the first sample at or past the span's middle (found
    by bisection, checked) as the plain scan does, ascending times or not, repeated ones included."""
    rng = np.random.default_rng(5)
    for case in range(3000):
        n = int(rng.integers(2, 150))
        times = np.cumsum(rng.choice([0, 1000, 1000, 999, 1500], size=n)) + int(rng.integers(0, 10**12))
        if case % 7 == 0:
            times = rng.permutation(times)
        opened = rng.integers(0, 50, size=n)
        samples = [
            (int(t), int(o), 10 * k, 9 * k) for k, (t, o) in enumerate(zip(times, opened, strict=True))
        ]
        mid_ms = (samples[0][0] + samples[-1][0]) / 2.0
        plain = next((o for t, o, _, _ in samples if t >= mid_ms), None)
        if plain is None:  # no sample past the middle (times out of order): both give up alike
            with pytest.raises(StopIteration):
                accumulation(samples)
            continue
        rise = float(samples[-1][1] - samples[0][1]) if samples[-1][1] > plain else 0.0
        got = accumulation(samples)
        assert got[0].hex() == rise.hex(), (case, got, rise)


def test_the_kept_entries_are_the_plain_filters_whatever_the_order_of_time() -> None:
    """``_recent``, ``_within`` and ``_first_at`` skip their suffix checks on tuples known to be in
    time order (built tick after tick by ``_then``, or checked once as a whole): with time going on,
    standing still, going back and jumping, spans that keep nothing or everything, and now and then a
    state in no order (as another process might hand one over), every answer is the plain filter's."""
    rng = np.random.default_rng(9)
    for case in range(400):
        seq: tuple[tuple[int, int], ...] = ()
        now = int(rng.integers(0, 10**12))
        for _ in range(50):
            now += int(rng.choice([1000, 1000, 1000, 0, -1500, 999, 30_000]))
            span = float(rng.choice([0.0, 2500.0, 10_000.0, 1e9, -1.0]))
            if rng.random() < 0.05:
                seq = tuple(seq[i] for i in rng.permutation(len(seq)).tolist())
            kept = rule._recent(seq, now, span)
            assert kept == tuple(e for e in seq if now - e[0] <= span), case
            recs = rule._then(kept, (now, int(rng.integers(0, 9))), now, ordered=rule._ordered(seq, now))
            for pick in (min, max):
                for within in (span, span / 2, 5000.0):
                    plain = [r for t, r in recs if now - t <= within]
                    if plain:
                        assert rule._within(recs, now, within, pick) == pick(plain), case
            mid_ms = (recs[0][0] + recs[-1][0]) / 2.0
            first = next((i for i, s in enumerate(recs) if s[0] >= mid_ms), None)
            if first is not None:
                assert rule._first_at(recs, mid_ms) == first, case
            seq = recs
