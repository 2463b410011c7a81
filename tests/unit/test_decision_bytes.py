"""``decision_bytes`` (orjson over the models' own field dicts) writes the bytes of
``_pydantic_bytes`` (pydantic's JSON form, keys sorted), the statement, byte for byte: on every
decision of generated fleets under the shipped policies, on bodies holding hostile values the
engine's unvalidated builders could carry (NaN, infinities, -0.0, 1e308, numpy scalars, ints past
64 bits, odd strings), and on generated bodies. Where the plain form raises, the fast one raises
the same kind of error."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from fleetloop.core.decide.engine import EngineState, decide_many
from fleetloop.daemon.act import publish
from fleetloop.daemon.act.publish import _pydantic_bytes as decision_bytes_plain
from fleetloop.daemon.act.publish import decision_bytes
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas import Tick
from fleetloop.schemas.base import assemble
from fleetloop.schemas.decisions import (
    AdmissionDecision,
    AutoscaleDecision,
    BatchingDecision,
    BreakerDecision,
    Decision,
    FleetDecision,
    PolicyStamp,
    RetryBudgetDecision,
    RoutingDecision,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.perturbed import perturbed_snapshots

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

STAMP = PolicyStamp(name="default", version=3, hash="0123456789abcdef", mode="enforce")


def same(d: Decision) -> None:
    try:
        want = decision_bytes_plain(d)
    except Exception as exc:  # the fast form must fail the same way
        with pytest.raises(type(exc)):
            decision_bytes(d)
        return
    assert decision_bytes(d) == want


def envelope(body: Any, **kw: Any) -> Decision:
    values = {
        "ts_ms": kw.get("ts_ms", 1_700_000_000_000),
        "tick_id": kw.get("tick_id", 7),
        "policy": kw.get("policy", STAMP),
        "input_offsets": kw.get("input_offsets", {"fleetloop.telemetry:0": 12}),
        "body": body,
    }
    return assemble(Decision, values, set(values))


def body(cls: type[Any], **values: Any) -> Any:
    """A body built as the engine's hot paths build them: every field, unvalidated."""
    full = {name: f.get_default(call_default_factory=True) for name, f in cls.model_fields.items()}
    full.update(values)
    return assemble(cls, full, set(values))


def routing(**fields: Any) -> Any:
    """A routing body of pool "p" holding these fields."""
    return body(RoutingDecision, entity="p", reason="r", pool_id="p", **fields)


def draining(drain: tuple[Any, ...]) -> Any:
    """An autoscale body whose drain list holds what the test puts there."""
    return body(
        AutoscaleDecision, entity="p", reason="r", pool_id="p", current_nodes=1, desired_nodes=1, drain=drain
    )


def test_every_decision_of_generated_fleets_is_the_same_bytes() -> None:
    kinds: set[str] = set()
    fast = 0
    for policy in (builtin_policy("default"), builtin_policy("classic"), builtin_policy("modern")):
        states: dict[str, EngineState] = {}
        for k, snap in enumerate(perturbed_snapshots(400, 16, seed=3)):
            pools = sorted(snap.pools)
            batch = [Tick(ts_ms=snap.now_ms, tick_id=k + 1, pool_id=p) for p in pools]
            offsets = {"fleetloop.telemetry:0": 7 * k, "fleetloop.requests:1": 11 * k}
            results = decide_many(snap, policy, [states.get(p, EngineState()) for p in pools], batch, offsets)
            for p, r in zip(pools, results, strict=True):
                states[p] = r.state
                for d in r.decisions:
                    assert decision_bytes(d) == decision_bytes_plain(d), (k, d.key)
                    kinds.add(d.body.kind)
                    fast += publish._PLANS.get(type(d.body)) is not None
    assert kinds >= {"routing", "breaker", "admission", "retry_budget", "autoscale", "batching"}
    assert fast > 1000


def test_the_fast_form_does_not_call_the_plain_one_for_finite_bodies(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without this the equality tests above would pass with a fast form that always fell back.
    d = envelope(routing(weights={"a": 0.5, "b": 1.0}))
    want = decision_bytes_plain(d)

    def refuse(_: Decision) -> bytes:
        raise AssertionError("plain form called")

    monkeypatch.setattr(publish, "_pydantic_bytes", refuse)
    assert decision_bytes(d) == want


def test_every_body_class_of_the_envelope_is_planned() -> None:
    assert set(publish._PLANS) == {
        RoutingDecision,
        BreakerDecision,
        AdmissionDecision,
        RetryBudgetDecision,
        AutoscaleDecision,
        BatchingDecision,
        FleetDecision,
    }
    assert publish._ENVELOPE_READY
    assert publish._STAMP_PLAN is not None
    routing = publish._PLANS[RoutingDecision]
    assert routing.float_dicts == ("inputs", "weights")
    assert routing.dicts2 == ("by_priority",)
    assert routing.ints({"max_prompt_tokens": 5}) == (5,)
    assert routing.int_dicts == ("slo_prompt_tokens",)
    budget = publish._PLANS[RetryBudgetDecision]
    assert budget.floats({"retry_ratio": 0.5, "min_retries_per_s": 1.5}) == (0.5, 1.5)


HOSTILE_FLOATS = [
    math.nan,
    math.inf,
    -math.inf,
    -0.0,
    0.0,
    1e308,
    -1e308,
    5e-324,
    0.1,
    1 / 3,
    np.float64(0.25),
    np.float32(0.5),
    True,
    3,
    2**53 + 1,
]


@pytest.mark.parametrize("x", HOSTILE_FLOATS, ids=repr)
def test_hostile_floats_anywhere_a_body_holds_one(x: Any) -> None:
    bodies = [
        routing(weights={"a": x, "b": 1.0}),
        routing(weights={}, by_priority={"0": {"a": x}}),
        routing(weights={"a": 1.0}, inputs={"load": x}),
        body(BreakerDecision, entity="n", reason="r", pool_id="p", node_id="n", state="open", probe_frac=x),
        body(
            RetryBudgetDecision,
            entity="p",
            reason="r",
            pool_id="p",
            retry_ratio=x,
            min_retries_per_s=1.0,
            retries_allowed_now=3,
        ),
        body(
            RetryBudgetDecision,
            entity="p",
            reason="r",
            pool_id="p",
            retry_ratio=0.1,
            min_retries_per_s=x,
            retries_allowed_now=3,
        ),
        body(
            FleetDecision,
            entity="fleet",
            reason="r",
            shards=1,
            pools=2,
            nodes=3,
            cost_rate_usd_per_h=x,
            requests_w=1,
            retries_w=0,
            retries_allowed=0,
            retry_budget_used_frac=None,
            tasks_succeeded=1,
            tasks_failed=0,
            fleet_cost_usd=1.0,
            spend_on_failed_usd=0.0,
            cost_per_successful_task_usd=x,
        ),
        body(
            AutoscaleDecision,
            entity="p",
            reason="r",
            pool_id="p",
            current_nodes=2,
            desired_nodes=3,
            inputs={"a": 1.0, "b": x},
        ),
    ]
    for b in bodies:
        same(envelope(b))


def test_sums_that_overflow_and_ints_past_64_bits_and_odd_strings() -> None:
    same(envelope(routing(weights={"a": 1e308, "b": 1e308})))
    same(envelope(body(AdmissionDecision, entity="p", reason="r", pool_id="p", max_queue_depth={"0": 2**70})))
    same(envelope(body(BatchingDecision, entity="p", reason="r", pool_id="p", max_batch_tokens=2**64)))
    same(envelope(body(BatchingDecision, entity="p", reason="r", pool_id="p", max_batch_tokens=-(2**63))))
    odd = 'null\u2028"\\\x00é😀'
    same(envelope(body(BreakerDecision, entity=odd, reason=odd, pool_id="p", node_id="null", state="closed")))
    same(
        envelope(
            draining(("a", odd)),
            input_offsets={odd: 2**63 - 1},
            tick_id=2**53,
        )
    )
    ids = {f"n{i:06d}": float(i) / 7 for i in range(100_000)}
    same(envelope(routing(weights=ids)))


def test_a_body_missing_a_field_goes_the_plain_way() -> None:
    values = {"entity": "p", "reason": "r", "kind": "batching", "pool_id": "p", "max_batch_tokens": 5}
    b = assemble(BatchingDecision, values, set(values))  # no "inputs"
    same(envelope(b))


finite = st.floats(allow_nan=True, allow_infinity=True, width=64)
names = st.text(min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(
    weights=st.dictionaries(names, finite, max_size=8),
    by_priority=st.dictionaries(names, st.dictionaries(names, finite, max_size=4), max_size=3),
    inputs=st.dictionaries(names, finite, max_size=4),
    affinity=st.dictionaries(names, st.tuples(names, names), max_size=3),
    spill=st.tuples(names),
    cap=st.one_of(st.none(), st.integers(min_value=-(2**64), max_value=2**64)),
    slo_fit=st.dictionaries(names, st.integers(min_value=-(2**64), max_value=2**64), max_size=10),
)
def test_generated_routing_bodies(
    weights: dict[str, float],
    by_priority: dict[str, dict[str, float]],
    inputs: dict[str, float],
    affinity: dict[str, tuple[str, ...]],
    spill: tuple[str, ...],
    cap: int | None,
    slo_fit: dict[str, int],
) -> None:
    same(
        envelope(
            routing(
                weights=weights,
                by_priority=by_priority,
                inputs=inputs,
                prefix_affinity=affinity,
                spill_to=spill,
                max_prompt_tokens=cap,
                slo_prompt_tokens=slo_fit,
            )
        )
    )


MISTYPED = [
    True,
    False,
    3,
    3.0,
    math.nan,
    None,
    "x",
    np.int64(3),
    np.float64(2.0),
    (1, 2),
    [1.0],
    {"a": 1.0},
    2**70,
]


@pytest.mark.parametrize("x", MISTYPED, ids=repr)
def test_a_value_that_is_not_its_fields_type_is_written_as_the_plain_form_writes_it(x: Any) -> None:
    # pydantic converts some of these (a bool in an int field is 1, an int in a float field 3.0);
    # the fast form must never write them its own way.
    for name in ("max_batch_tokens", "entity", "inputs"):
        values = {
            "entity": "p",
            "reason": "r",
            "inputs": {},
            "kind": "batching",
            "pool_id": "p",
            "max_batch_tokens": 5,
        }
        values[name] = x
        same(envelope(assemble(BatchingDecision, values, set(values))))
    for name in ("probe_frac", "enforced", "until_ms", "state"):
        b = body(
            BreakerDecision, entity="n", reason="r", pool_id="p", node_id="n", state="open", probe_frac=0.5
        )
        b.__dict__[name] = x
        same(envelope(b))
    same(envelope(body(AdmissionDecision, entity="p", reason="r", pool_id="p", max_queue_depth={"0": x})))
    same(envelope(draining(("a", x))))
    same(
        envelope(
            routing(
                weights={},
                prefix_affinity={"h": ("a", x)},
                by_priority={"0": x},
            )
        )
    )
    same(envelope(routing(weights={}, by_priority={"0": {"a": x}})))
    batching = body(BatchingDecision, entity="p", reason="r", pool_id="p", max_batch_tokens=1)
    same(envelope(batching, ts_ms=x))
    same(envelope(batching, tick_id=x))
    same(envelope(batching, input_offsets={"t:0": x}))
    same(envelope(batching, policy=assemble(PolicyStamp, {**STAMP.__dict__, "version": x}, set())))


def test_a_body_holding_a_key_that_is_not_a_field_goes_the_plain_way() -> None:
    b = body(BatchingDecision, entity="p", reason="r", pool_id="p", max_batch_tokens=1)
    b.__dict__["extra"] = 1.5
    same(envelope(b))
