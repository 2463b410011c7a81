"""Decision bodies assembled without validation are the models validation would build: the same
fields set, the same values of the same types, the same JSON; out-of-bounds parts still go through
validation and fail there. Checked on generated fleets that misbehave (``tests/support/perturbed``)."""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.policies.base import PolicyContext
from fleetloop.policies.retry_budget import ratio
from fleetloop.policies.retry_budget.ratio import Ratio, RatioParams
from fleetloop.schemas.base import MAX_COUNT
from fleetloop.schemas.decisions import RetryBudgetDecision
from pydantic import BaseModel, ValidationError
from tests.support.perturbed import perturbed_snapshots


def same_model(got: BaseModel, want: BaseModel) -> None:
    assert type(got) is type(want)
    assert got.model_fields_set == want.model_fields_set
    assert list(got.__dict__) == list(want.__dict__)
    assert [(k, type(v), repr(v)) for k, v in got.__dict__.items()] == [
        (k, type(v), repr(v)) for k, v in want.__dict__.items()
    ]
    assert got.model_dump_json() == want.model_dump_json()
    assert got == want


def validated(d: RetryBudgetDecision) -> RetryBudgetDecision:
    return RetryBudgetDecision(**{k: getattr(d, k) for k in d.model_fields_set})


@pytest.fixture(scope="module")
def snapshots() -> list[Any]:
    return list(perturbed_snapshots(320, 24))


@pytest.mark.parametrize(
    "params", [RatioParams(), RatioParams(exempt_shed_and_lost=False, retry_ratio=1.0, min_retries_per_s=0.0)]
)
def test_retry_budget_bodies_are_what_validation_builds(snapshots: list[Any], params: RatioParams) -> None:
    algo = Ratio()
    tenants = pools = 0
    states: dict[str, Any] = {}
    for snap in snapshots:
        for pool_id in sorted(snap.pools):
            ctx = PolicyContext(
                now_ms=snap.now_ms, tick_id=snap.now_ms // 1000, tick_ms=1000, pool_id=pool_id, seed=(0,)
            )
            result = algo.decide(snap, params, states.get(pool_id), ctx)
            states[pool_id] = result.state
            for d in result.decisions:
                assert isinstance(d, RetryBudgetDecision)
                same_model(d, validated(d))
                tenants += d.tenant_id is not None
                pools += d.tenant_id is None
    assert tenants > 0
    assert pools > 0


def test_retry_budget_body_out_of_bounds_is_refused_by_validation() -> None:
    common: dict[str, Any] = {
        "pool_id": "p",
        "tenant_id": "t",
        "params": RatioParams(),
        "exempt_retries_of": (),
        "reason": "tenant-budget",
    }
    ok = ratio.budget_decision("pool/p/tenant/t", retries_allowed_now=MAX_COUNT, inputs={"x": 1.0}, **common)
    same_model(ok, validated(ok))
    with pytest.raises(ValidationError):
        ratio.budget_decision("pool/p/tenant/t", retries_allowed_now=MAX_COUNT + 1, inputs={}, **common)
    with pytest.raises(ValidationError):
        ratio.budget_decision("pool/p/tenant/t", retries_allowed_now=1, inputs={"x": float("nan")}, **common)
    with pytest.raises(ValidationError):
        ratio.budget_decision("pool/p/tenant/t", retries_allowed_now=1, inputs={"x": 1e300}, **common)
    with pytest.raises(ValidationError):
        ratio.budget_decision("", retries_allowed_now=1, inputs={}, **common)


def test_updated_is_model_copy() -> None:
    """``updated`` (the decide tick's envelope copies) builds what ``model_copy(update=...)`` builds:
    for every decision kind, built by validation or by ``model_construct`` (fields set partly), with
    one field or several replaced, by values of other types too; the original is left as it was; a
    model with extras or private attributes goes through ``model_copy``."""
    from fleetloop.schemas.base import updated
    from fleetloop.schemas.decisions import AdmissionDecision, BreakerDecision, RoutingDecision

    made: list[tuple[BaseModel, dict[str, object]]] = [
        (
            RoutingDecision(entity="pool/p", pool_id="p", reason="r", weights={"a": 0.5, "b": 0.5}),
            {"weights": {"b": 1.0}, "reason": "x", "spill_to": ()},
        ),
        (
            RoutingDecision.model_construct(pool_id="p", weights={"a": -0.0}),
            {"inputs": {"stale_nodes": float("nan")}, "by_priority": {}},
        ),
        (
            BreakerDecision(entity="node/n", pool_id="p", node_id="n", reason="r", state="open"),
            {"enforced": False, "reason": "r:cap"},
        ),
        (
            AdmissionDecision(entity="pool/p", pool_id="p", reason="r", max_queue_depth={"1": 3, "0": 1}),
            {"max_queue_depth": {"0": 4, "1": True}, "new_task_max_outstanding": {}},
        ),
        (AdmissionDecision.model_construct(pool_id="p"), {"reject_if_budget_below_ms": 10**30}),
    ]
    for d, update in made:
        before = (dict(d.__dict__), set(d.model_fields_set))
        same_model(updated(d, dict(update)), d.model_copy(update=dict(update)))
        assert updated(d, dict(update)).__pydantic_fields_set__ is not d.__pydantic_fields_set__
        assert (dict(d.__dict__), set(d.model_fields_set)) == before

    class Private(BaseModel):
        x: int = 0
        _p: int = 1

    m = Private()
    got = updated(m, {"x": 2})
    assert got.x == 2
    assert got._p == 1


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_subclasses(sub))
    return out


def test_assemble_sets_what_every_model_would_find_for_itself() -> None:
    """``assemble`` (and the engine's decision wrappers) create a model with ``object.__new__`` and
    set its ``__dict__`` through BaseModel's descriptor, both found once, instead of looking them up
    on each model's class: the same only while no model defines ``__new__`` or a ``__dict__`` of its
    own. Every model of the project (each module imported), checked by name."""
    import importlib
    import pkgutil

    import fleetloop
    from fleetloop.schemas.base import assemble
    from fleetloop.schemas.decisions import Decision

    for mod in pkgutil.walk_packages(fleetloop.__path__, "fleetloop."):
        if mod.name.startswith(("fleetloop.policies", "fleetloop.schemas", "fleetloop.core")):
            importlib.import_module(mod.name)
    models = [c for c in _subclasses(BaseModel) if c.__module__.startswith("fleetloop.")]
    assert RetryBudgetDecision in models
    assert Decision in models
    dict_descriptor = BaseModel.__dict__["__dict__"]
    for cls in models:
        assert cls.__new__ is object.__new__, cls
        found = next(k.__dict__["__dict__"] for k in cls.__mro__ if "__dict__" in k.__dict__)
        assert found is dict_descriptor, cls
    d = RetryBudgetDecision(
        entity="pool/p",
        reason="budget",
        pool_id="p",
        retry_ratio=0.2,
        min_retries_per_s=1.0,
        retries_allowed_now=3,
    )
    same_model(assemble(RetryBudgetDecision, dict(d.__dict__), set(d.model_fields_set)), d)

    class Own(BaseModel):  # what the test would catch: a model with its own __new__
        x: int = 0

        def __new__(cls, *args: Any, **kwargs: Any) -> Own:
            return super().__new__(cls)

    assert Own.__new__ is not object.__new__
