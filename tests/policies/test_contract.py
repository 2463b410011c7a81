"""The contract every algorithm of the table keeps, in every section.

Run over ``REGISTRY``, so a new algorithm is held to it the moment it is in the table
(fleetloop.policies.builtin): decisions only for the tick's pool, each a valid wire model of its
section's kind; deterministic (same inputs, same output and state); its input state left untouched; routing
weights >= 0 summing to 1 (or all zero when no node can serve); autoscale targets >= 0; a module
docstring (for a package, the README.md beside its code) that states the formula, inputs, parameters
and failure mode; a ``Params`` model whose defaults validate.
"""

from __future__ import annotations

import copy
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from fleetloop.policies.base import FleetSnapshot, NodeView, PolicyResult
from fleetloop.policies.registry import REGISTRY
from fleetloop.schemas.decisions import (
    AdmissionDecision,
    AutoscaleDecision,
    BatchingDecision,
    BreakerDecision,
    DecisionBody,
    RetryBudgetDecision,
    RoutingDecision,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter
from tests.policies.snapshots import ctx, node, nodes, snapshot, tenant

ALGORITHMS = [
    (section, name, cls) for section in sorted(REGISTRY) for name, cls in sorted(REGISTRY[section].items())
]
IDS = [f"{section}:{name}" for section, name, _ in ALGORITHMS]
KIND: dict[str, type[BaseModel]] = {
    "routing": RoutingDecision,
    "breaker": BreakerDecision,
    "admission": AdmissionDecision,
    "retry_budget": RetryBudgetDecision,
    "autoscale": AutoscaleDecision,
    "batching": BatchingDecision,
}
BODY: TypeAdapter[Any] = TypeAdapter(DecisionBody)


def mixed_pool(now_ms: int) -> list[NodeView]:
    """Every kind of node, in pool "p", plus a node of another pool."""
    return [
        node("a", gpu_util_frac=0.9, queue_depth=12, running_requests=8, ok_w=120, requests_w=120),
        node("b", gpu_util_frac=0.2, consecutive_failures=9, failures_w=30, ok_w=90),
        node("c", weights_state="loading", gpu_util_frac=0.0),
        node("d", weights_state="cold"),
        node("e", draining=True, queue_depth=3),
        node("f", stale=True, age_ms=60_000, last_seen_ms=now_ms - 60_000),
        node("g", gpu_count=8, gpu_util_frac=0.75, ok_w=300, failures_w=1),
        node("x", pool_id="q", queue_depth=40, consecutive_failures=50),
    ]


def scenarios() -> dict[str, list[FleetSnapshot]]:
    """Named sequences of snapshots (event time moving on), to drive stateful algorithms too."""
    t0 = 1_700_000_000_000
    tenants = [tenant("gold", 0, 50, 5), tenant("free", 2, 200, 80)]
    pool_fields = {"p": {"requests_w": 500, "retries_w": 40}, "q": {"requests_w": 10}}
    seq: dict[str, list[FleetSnapshot]] = {
        "mixed": [
            snapshot(
                mixed_pool(t0 + s * 1000), now_ms=t0 + s * 1000, tenants=tenants, pool_fields=pool_fields
            )
            for s in (0, 1, 11, 16, 31, 45, 60)
        ],
        "empty-pool": [
            snapshot([node("x", pool_id="q")], pool_fields={"p": {}}, now_ms=t0 + s * 1000) for s in (0, 20)
        ],
        "nothing-warm": [snapshot([node("c", weights_state="cold"), node("d", draining=True)], now_ms=t0)],
        "large-failing": [
            snapshot(nodes(24, consecutive_failures=s, failures_w=s, ok_w=100), now_ms=t0 + s * 1000)
            for s in (0, 6, 12, 18)
        ],
    }
    return seq


def run(cls: Any, snaps: list[FleetSnapshot], pool_id: str = "p") -> list[PolicyResult[Any]]:
    algo = cls()
    params = cls.Params()
    state = algo.initial_state()
    results = []
    for i, snap in enumerate(snaps):
        results.append(algo.decide(snap, params, state, ctx(snap, pool_id=pool_id, tick_id=i)))
        state = results[-1].state
    return results


@pytest.mark.parametrize(("section", "name", "cls"), ALGORITHMS, ids=IDS)
def test_registered_with_name_section_and_default_params(section: str, name: str, cls: Any) -> None:
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name)
    assert (cls.name, cls.section) == (name, section)
    assert issubclass(cls.Params, BaseModel)
    assert cls.Params.model_config.get("frozen") is True
    assert cls.Params.model_config.get("extra") == "forbid"
    cls.Params()  # every parameter has a default: a document may name the algorithm alone


@pytest.mark.parametrize(("section", "name", "cls"), ALGORITHMS, ids=IDS)
def test_docstring_states_formula_inputs_parameters_failure_mode(section: str, name: str, cls: Any) -> None:
    """A module's docstring, or for a package its README.md beside the code."""
    module = inspect.getmodule(cls)
    doc = (module.__doc__ if module is not None else None) or ""
    if module is not None and Path(module.__file__ or "").name == "__init__.py":
        readme = Path(module.__file__ or "").with_name("README.md")
        assert doc.lstrip().startswith(f"{name}:"), "the package's docstring opens with the algorithm's name"
        assert "README.md" in doc, "the package's docstring sends the reader to its README.md"
        doc = readme.read_text(encoding="utf-8")
        assert doc.startswith(f"# {name}\n"), "the README is titled with the algorithm's name"
    else:
        assert doc.lstrip().startswith(f"{name}:"), "the docstring opens with the algorithm's name"
    for word in ("Formula", "Inputs", "Failure mode"):
        assert word in doc, f"{name}: docstring lacks {word!r}"
    assert "Parameters" in doc or "Defaults" in doc, f"{name}: docstring lacks 'Parameters'"


@pytest.mark.parametrize("scenario", sorted(scenarios()))
@pytest.mark.parametrize(("section", "name", "cls"), ALGORITHMS, ids=IDS)
def test_decisions_for_the_ticks_pool_only_and_valid(
    section: str, name: str, cls: Any, scenario: str
) -> None:
    for result in run(cls, scenarios()[scenario]):
        for d in result.decisions:
            assert isinstance(d, KIND[section]), f"{name} returned a {type(d).__name__}"
            assert d.pool_id == "p"
            assert BODY.validate_python(d.model_dump()) == d
            assert BODY.validate_json(BODY.dump_json(d)) == d
            if isinstance(d, BreakerDecision):
                assert d.node_id in scenarios()[scenario][0].pools["p"].node_ids
        assert all(isinstance(v, float) for v in result.diagnostics.values())


@pytest.mark.parametrize("scenario", sorted(scenarios()))
@pytest.mark.parametrize(("section", "name", "cls"), ALGORITHMS, ids=IDS)
def test_deterministic_and_does_not_mutate_its_input_state(
    section: str, name: str, cls: Any, scenario: str
) -> None:
    algo, params = cls(), cls.Params()
    state = algo.initial_state()
    for i, snap in enumerate(scenarios()[scenario]):
        frozen = copy.deepcopy(state)
        first = algo.decide(snap, params, state, ctx(snap, tick_id=i))
        assert state == frozen, f"{name} mutated its input state"
        second = algo.decide(snap, params, state, ctx(snap, tick_id=i))
        assert first.decisions == second.decisions
        assert first.state == second.state
        assert first.diagnostics == second.diagnostics
        state = first.state


@pytest.mark.parametrize("scenario", sorted(scenarios()))
@pytest.mark.parametrize(("section", "name", "cls"), [a for a in ALGORITHMS if a[0] == "routing"])
def test_routing_weights_non_negative_and_sum_to_one(
    section: str, name: str, cls: Any, scenario: str
) -> None:
    snaps = scenarios()[scenario]
    for snap, result in zip(snaps, run(cls, snaps), strict=True):
        (d,) = result.decisions
        assert isinstance(d, RoutingDecision)
        assert set(d.weights) == set(snap.pools["p"].node_ids)
        assert all(w >= 0 for w in d.weights.values())
        total = sum(d.weights.values())
        if any(n.warm for n in snap.pool_nodes("p")):
            assert total == pytest.approx(1.0, abs=1e-5)
        else:
            assert total == 0.0


@pytest.mark.parametrize("scenario", sorted(scenarios()))
@pytest.mark.parametrize(("section", "name", "cls"), [a for a in ALGORITHMS if a[0] == "autoscale"])
def test_autoscale_targets_non_negative(section: str, name: str, cls: Any, scenario: str) -> None:
    for result in run(cls, scenarios()[scenario]):
        (d,) = result.decisions
        assert isinstance(d, AutoscaleDecision)
        assert d.desired_nodes >= 0
        assert d.current_nodes >= 0
        assert len(d.drain) <= d.current_nodes


node_specs = st.lists(
    st.fixed_dictionaries(
        {
            "weights_state": st.sampled_from(["cold", "loading", "warm"]),
            "draining": st.booleans(),
            "stale": st.booleans(),
            "queue_depth": st.integers(min_value=0, max_value=2000),
            "running_requests": st.integers(min_value=0, max_value=256),
            "gpu_util_frac": st.floats(min_value=0.0, max_value=1.0),
            "consecutive_failures": st.integers(min_value=0, max_value=20),
        }
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(node_specs)
def test_property_every_algorithm_on_random_pools(specs: list[dict[str, Any]]) -> None:
    snap = snapshot([node(f"n{i:02d}", **spec) for i, spec in enumerate(specs)])
    for section, name, cls in ALGORITHMS:
        (result,) = run(cls, [snap])
        for d in result.decisions:
            assert isinstance(d, KIND[section])
            if isinstance(d, RoutingDecision):
                assert all(w >= 0 for w in d.weights.values()), name
                total = sum(d.weights.values())
                expected = 1.0 if any(n.warm for n in snap.nodes.values()) else 0.0
                assert total == pytest.approx(expected, abs=1e-5), name
            if isinstance(d, AutoscaleDecision):
                assert d.desired_nodes >= 0, name


def test_every_algorithm_class_in_the_package_is_in_the_one_table() -> None:
    """Algorithms are named in one table (fleetloop.policies.builtin), not by being imported: a new
    module whose class is missing from the table is found here, not by a policy that names it."""
    import importlib
    import pkgutil

    import fleetloop.policies as package
    from fleetloop.policies.builtin import ALGORITHMS as TABLE

    found = set()
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and hasattr(cls, "decide") and hasattr(cls, "Params"):
                found.add(cls)
    assert len(found) >= 19
    assert found == set(TABLE)
    assert {cls for _, _, cls in ALGORITHMS} == set(TABLE)


def test_a_name_twice_in_a_section_or_an_unknown_section_is_refused() -> None:
    from fleetloop.policies.registry import by_section

    class A:
        name, section = "a", "routing"

    class B:
        name, section = "a", "routing"

    class C:
        name, section = "c", "nowhere"

    with pytest.raises(ValueError, match="routing algorithm 'a' named twice"):
        by_section([A, B])
    with pytest.raises(ValueError, match="C: unknown policy section 'nowhere'"):
        by_section([C])
    assert by_section([A])["routing"] == {"a": A}
