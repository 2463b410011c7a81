"""``r6_array`` gives exactly ``round(x, 6)`` (``r6``) for every element: the same doubles, sign of
zero included, on hostile values: near and exact ties at the sixth decimal, tiny, huge, subnormal,
negative, NaN and infinities."""

from __future__ import annotations

import math

import numpy as np
from fleetloop.policies.base import r6, r6_array
from hypothesis import given, settings
from hypothesis import strategies as st


def same(xs: list[float]) -> None:
    got = r6_array(np.array(xs, dtype=np.float64)).tolist()
    want = [r6(x) for x in xs]
    assert [g.hex() if not math.isnan(g) else "nan" for g in got] == [
        w.hex() if not math.isnan(w) else "nan" for w in want
    ], xs


def ties(j: int) -> list[float]:
    """Doubles at and around ``(j + 0.5) / 10**6``: where ``x * 1e6`` can round onto the tie."""
    t = (j + 0.5) / 1e6
    out = [t]
    up = dn = t
    for _ in range(4):
        up = math.nextafter(up, math.inf)
        dn = math.nextafter(dn, -math.inf)
        out += [up, dn, -up, -dn]
    return out


def test_exact_and_near_ties() -> None:
    xs: list[float] = [0.0078125, -0.0078125, 0.5e-6, 1.5e-6, 2.5e-6, -2.5e-6, 0.0000025, 0.1234565]
    for j in [*range(0, 2000, 7), 123456, 999999, 1000000, 2**20, 10**9, 2**31]:
        xs += ties(j)
    same(xs)
    # The fallback is taken for these (a tie within the margin), and they do differ from rint alone
    # for some of them: the check is not vacuous.
    a = np.array(xs)
    naive = (np.rint(a * 1e6) / 1e6).tolist()
    assert any(n.hex() != r6(x).hex() for n, x in zip(naive, xs, strict=True))


def test_special_values() -> None:
    same(
        [0.0, -0.0, 1e-9, -1e-9, 5e-324, -5e-324, 2.2250738585072014e-308, 1e-7, 4.9999999e-7, 5e-7,
         1.0, 0.999999999, 1073.741823, 1073.7418245, 1e9, -1e9, 4.5e9 + 0.3, 1e10 + 0.1234567,
         123456789012.345678, -98765432109.8765, 1e15, 1e300, -1e300,
         float("inf"), -float("inf"), float("nan")]
    )  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=50))
def test_any_doubles(xs: list[float]) -> None:
    same(xs)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=64))
def test_weights(xs: list[float]) -> None:
    same(xs)
    total = sum(xs)
    if total > 0:
        same([x / total for x in xs])


@settings(max_examples=300, deadline=None)
@given(st.integers(-(10**12), 10**12), st.integers(-3, 3))
def test_around_every_tie(j: int, step: int) -> None:
    x = (j + 0.5) / 1e6
    for _ in range(abs(step)):
        x = math.nextafter(x, math.inf if step > 0 else -math.inf)
    same([x, -x, x / 3, x * 7])


weights_maps = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=3),
    st.floats(min_value=0.0, max_value=1.0) | st.sampled_from([0.0, 1e-9, 0.5, 1.0]),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(weights_maps, st.sampled_from([0.5, 1.0, 4.0, 6.0, 16.0]))
def test_cache_aware_shares_are_the_plain_rule(scores: dict[str, float], alpha: float) -> None:
    from fleetloop.policies.routing.cache_aware import shares
    from tests.oracles.cache_aware import shares_plain

    got, want = shares(scores, alpha), shares_plain(scores, alpha)
    assert list(got) == list(want)
    assert [v.hex() for v in got.values()] == [v.hex() for v in want.values()]


@settings(max_examples=300, deadline=None)
@given(weights_maps, st.floats(min_value=0.0, max_value=2.0))
def test_engine_scaling_and_renormalizing_are_the_plain_forms(ws: dict[str, float], scale: float) -> None:
    from tests.oracles import engine

    got = engine._scaled(ws, scale)
    want = {n: r6(w * scale) for n, w in ws.items()}
    assert list(got) == list(want)
    assert [v.hex() for v in got.values()] == [v.hex() for v in want.values()]
    total = sum(ws.values())
    plain = {n: r6(w / total) for n, w in sorted(ws.items())} if total > 0 else {}
    again = engine._renormalize(ws)
    assert list(again) == list(plain)
    assert [v.hex() for v in again.values()] == [v.hex() for v in plain.values()]


def near_tie_pairs() -> list[dict[str, float]]:
    """Two-node weight maps whose total is exactly 1 and whose first share sits at or next to a tie
    at the sixth decimal: where rounding by ``rint`` alone goes the wrong way."""
    out = [
        {"a": t, "b": 1.0 - t}
        for j in range(0, 400_000, 997)
        for t in ties(j)[:5]
        if 0 < t < 0.5 and t + (1.0 - t) == 1.0
    ]
    naive = [np.rint(np.array(list(m.values())) * 1e6) / 1e6 for m in out]
    assert any(
        float(n[0]).hex() != r6(m["a"]).hex() for n, m in zip(naive, out, strict=True)
    )  # the cases do separate rint alone from round
    return out


def test_shares_scaling_and_renormalizing_at_near_ties() -> None:
    from fleetloop.policies.routing.cache_aware import shares
    from tests.oracles import engine
    from tests.oracles.cache_aware import shares_plain

    for m in near_tie_pairs():
        wide = {**m, **{f"n{i}": 0.0 for i in range(10)}}  # long enough for the array path
        assert [v.hex() for v in shares(wide, 1.0).values()] == [
            v.hex() for v in shares_plain(wide, 1.0).values()
        ]
        assert [v.hex() for v in engine._scaled(wide, 1.0).values()] == [r6(w).hex() for w in wide.values()]
        plain = {n: r6(w / 1.0) for n, w in sorted(wide.items())}
        assert [v.hex() for v in engine._renormalize(wide).values()] == [v.hex() for v in plain.values()]
