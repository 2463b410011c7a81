"""The per-pool figures computed fleet-wide (:mod:`fleetloop.policies.pool_figures`) equal the plain
per-node forms that state the rules, value for value (ints exactly, the median bit for bit), on
generated fleets whose nodes go cold, drain, go silent, fail and report hostile values."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fleetloop.core.decide import shaping
from fleetloop.policies.base import PolicyContext
from fleetloop.policies.batching import tbt_feedback
from fleetloop.policies.pool_figures import figures_of, pool_figures, row_ids
from fleetloop.policies.retry_budget import ratio
from fleetloop.policies.retry_budget.ratio import RatioParams
from fleetloop.schemas.decisions import BreakerDecision
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.oracles import ratio as ratio_oracle
from tests.oracles.engine import cap_ejections_plain, pool_is_silent_plain
from tests.oracles.tbt_feedback import pool_tbt_ms_plain
from tests.policies.snapshots import node, snapshot
from tests.support.perturbed import perturbed_snapshots


@pytest.fixture(scope="module")
def snapshots() -> list[Any]:
    return list(perturbed_snapshots(320, 30))


def ctx_for(snap: Any, pool_id: str, breakers: dict[str, BreakerDecision] | None = None) -> PolicyContext:
    return PolicyContext(
        now_ms=snap.now_ms, tick_id=1, tick_ms=1000, pool_id=pool_id, seed=(0,), breakers=breakers or {}
    )


def test_pool_figures_are_the_plain_forms(snapshots: list[Any]) -> None:
    seen: dict[str, int] = dict.fromkeys(("lost_calls", "lost_nodes", "silent", "median", "episode"), 0)
    params = RatioParams()
    episodes: dict[str, Any] = {}
    for snap in snapshots:
        assert row_ids(snap) == [n.node_id for p in sorted(snap.pools) for n in snap.pool_nodes(p)]
        figs = pool_figures(snap)
        for pool_id in [*sorted(snap.pools), "no-such-pool"]:
            nodes = snap.pool_nodes(pool_id)
            f = figures_of(snap, pool_id)
            assert f.lost_calls == ratio_oracle.lost_calls(nodes)
            assert f.lost_nodes == ratio_oracle.lost_nodes(nodes)
            assert f.warm_fresh == sum(1 for n in nodes if n.warm and not n.stale)
            assert f.max_outstanding == max((n.queue_depth + n.running_requests for n in nodes), default=0)
            assert shaping.pool_is_silent(snap, pool_id) == pool_is_silent_plain(snap, pool_id)
            c = ctx_for(snap, pool_id)
            got, want = tbt_feedback.pool_tbt_ms(snap, c), pool_tbt_ms_plain(snap, c)
            assert (got.hex() if got is not None else None) == (want.hex() if want is not None else None)
            state = episodes.get(pool_id)
            plain = ratio_oracle.next_episode(params, state, nodes, snap.now_ms, snap.window_ms)
            fast = ratio.episode_after(
                params,
                state,
                f.warm_fresh,
                lost_now=lambda f=f: f.lost_nodes,
                now_ms=snap.now_ms,
                window_ms=snap.window_ms,
            )
            assert fast == plain
            episodes[pool_id] = plain[0]
            seen["lost_calls"] += f.lost_calls > 0
            seen["lost_nodes"] += f.lost_nodes > 0
            seen["silent"] += pool_is_silent_plain(snap, pool_id) and pool_id in figs
            seen["median"] += want is not None
            seen["episode"] += plain[0] is not None
    assert all(v > 0 for v in seen.values()), seen


def test_pool_tbt_with_an_ejected_node_is_the_plain_form(snapshots: list[Any]) -> None:
    snap = snapshots[-1]
    checked = 0
    for pool_id in sorted(snap.pools):
        warm = [n for n in snap.pool_nodes(pool_id) if n.warm and not n.stale and n.tbt_p99_ms is not None]
        if len(warm) < 3:
            continue
        slowest = max(warm, key=lambda n: (n.tbt_p99_ms, n.node_id))
        b = BreakerDecision(
            entity=f"node/{slowest.node_id}",
            reason="x",
            pool_id=pool_id,
            node_id=slowest.node_id,
            state="open",
        )
        c = ctx_for(snap, pool_id, {slowest.node_id: b})
        got = tbt_feedback.pool_tbt_ms(snap, c)
        assert got == pool_tbt_ms_plain(snap, c)
        # The ejected node is left out: the median moves off the all-nodes figure in some pools.
        checked += got != tbt_feedback.pool_tbt_ms(snap, ctx_for(snap, pool_id))
    assert checked > 0


signed = st.sampled_from([0.0, -0.0, 1.0, 2.0, 2.0, 5.5])
states = st.sampled_from(["warm", "warm", "cold", "loading"])


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2), signed | st.none(), states, st.booleans(), st.integers(0, 3), st.booleans()
        ),
        min_size=1,
        max_size=30,
    )
)
def test_pool_figures_of_any_node_mix_and_signed_zeros(rows: list[Any]) -> None:
    """Every mix of loaded / draining / stale / failing nodes; between 0.0 and -0.0 the median
    keeps the node order, as ``list.sort`` does."""
    views = [
        node(
            f"n{i:02d}",
            pool_id=f"p{p}",
            tbt_p99_ms=v,
            weights_state=ws,
            draining=dr,
            failures_w=fails,
            requests_w=fails,
            stale=stale,
            queue_depth=i,
            running_requests=fails,
        )
        for i, (p, v, ws, dr, fails, stale) in enumerate(rows)
    ]
    snap = snapshot(views)
    for pool_id in sorted(snap.pools):
        nodes = snap.pool_nodes(pool_id)
        f = figures_of(snap, pool_id)
        assert f.lost_calls == ratio_oracle.lost_calls(nodes)
        assert f.lost_nodes == ratio_oracle.lost_nodes(nodes)
        assert f.warm_fresh == sum(1 for n in nodes if n.warm and not n.stale)
        assert f.max_outstanding == max((n.queue_depth + n.running_requests for n in nodes), default=0)
        assert f.all_stale == all(n.stale for n in nodes)
        c = ctx_for(snap, pool_id)
        got, want = tbt_feedback.pool_tbt_ms(snap, c), pool_tbt_ms_plain(snap, c)
        assert (got.hex() if got is not None else None) == (want.hex() if want is not None else None)


def test_upper_median_of_long_pools_of_signed_zeros_keeps_node_order() -> None:
    """Pools of 17-90 nodes (past the length where numpy's sort is an insertion sort, so an unstable
    sort reorders 0.0 and -0.0), mostly signed zeros, some not warm, some without a figure, 1e308:
    the median is ``sorted(xs)[len(xs) // 2]``'s double, bit for bit, in every pool."""
    rng = np.random.default_rng(7)
    figures = [0.0, -0.0, 0.0, -0.0, 3.0, -1.0, 1e308, None]
    for _ in range(30):
        views = []
        for p in range(int(rng.integers(1, 7))):
            for i in range(int(rng.integers(17, 91))):
                v = figures[int(rng.integers(0, len(figures)))]
                ws = ["warm", "warm", "warm", "cold"][int(rng.integers(0, 4))]
                views.append(node(f"p{p}/n{i:02d}", pool_id=f"p{p}", tbt_p99_ms=v, weights_state=ws))
        snap = snapshot(views)
        for pool_id in sorted(snap.pools):
            xs = [
                n.tbt_p99_ms
                for n in snap.pool_nodes(pool_id)
                if n.warm and not n.stale and n.tbt_p99_ms is not None
            ]
            want = sorted(xs)[len(xs) // 2] if xs else None
            got = figures_of(snap, pool_id).tbt_upper_median
            assert (got.hex() if got is not None else None) == (want.hex() if want is not None else None)


def test_pool_tbt_median_between_signed_zeros_is_the_later_node_s() -> None:
    for first, second in ((0.0, -0.0), (-0.0, 0.0)):
        snap = snapshot([node("a", tbt_p99_ms=first), node("b", tbt_p99_ms=second)])
        c = ctx_for(snap, "p")
        got, want = tbt_feedback.pool_tbt_ms(snap, c), pool_tbt_ms_plain(snap, c)
        assert want is not None
        assert got is not None
        assert got.hex() == want.hex() == second.hex()


@pytest.mark.parametrize("frac", [0.34, 1.0])
def test_engine_ejection_cap_on_columns_is_the_plain_rule(snapshots: list[Any], frac: float) -> None:
    """Random sets of open (enforced or not), probing and closed breakers per pool, a node of no
    pool among them, some held from the last tick: the columns' capacity check caps exactly the
    nodes the per-view rule caps."""
    import numpy as np
    from fleetloop.policies.envelope import Envelope

    env = Envelope(max_ejected_frac=frac)
    rng = np.random.default_rng(7)
    capped = kept = 0
    for snap in snapshots[::3]:
        for pool_id in sorted(snap.pools):
            ids = [n.node_id for n in snap.pool_nodes(pool_id)] + ["gone-node"]
            decisions = []
            for node_id in ids:
                state = str(rng.choice(["open", "open", "closed", "half_open"]))
                decisions.append(
                    BreakerDecision(
                        entity=f"node/{node_id}",
                        reason="r",
                        pool_id=pool_id,
                        node_id=node_id,
                        state=state,
                        enforced=bool(rng.random() < 0.8),
                    )
                )
            # Some of them held from the last tick, their end ahead, past or not given.
            held = {
                node_id: [None, snap.now_ms - 1, snap.now_ms, snap.now_ms + 1][int(rng.integers(0, 4))]
                for node_id in ids
                if rng.random() < 0.3
            }
            got = shaping.cap_ejections(list(decisions), snap, pool_id, env, held)
            want = cap_ejections_plain(list(decisions), snap, pool_id, env, held)
            assert [d.model_dump_json() for d in got] == [d.model_dump_json() for d in want]
            capped += sum(1 for d in got if d.reason.endswith("-cap"))
            kept += sum(1 for d in got if d.state == "open" and d.enforced)
    assert capped > 0
    assert kept > 0


def test_pool_slo_is_read_once_per_snapshot_pool_and_book(snapshots: list[Any]) -> None:
    """The memo answers what the book says for the pool, and a second book on the same snapshot is
    read afresh, not served the first one's answer."""
    from fleetloop.policies.slo import Slo, SloBook

    strict = SloBook(default=Slo(500.0, 40.0))
    loose = SloBook(default=Slo(9000.0, 400.0))
    snap = snapshots[-1]
    for pool_id in [*sorted(snap.pools), "no-such-pool"]:
        for book in (strict, loose, strict):
            c = PolicyContext(
                now_ms=snap.now_ms, tick_id=1, tick_ms=1000, pool_id=pool_id, seed=(0,), slo=book
            )
            pool = snap.pools.get(pool_id)
            want = (
                book.served(pool.requests_by_priority_w, model=pool.model, pool=pool_id)
                if pool is not None
                else book.served({}, pool=pool_id)
            )
            assert c.pool_slo(snap) == want
    assert strict.default != loose.default
