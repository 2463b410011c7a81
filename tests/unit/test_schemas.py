"""The wire contract: exported JSON Schemas, strictness, validators, bounds, canonical bytes, topics."""

from __future__ import annotations

import math
import typing
from typing import Any

import pytest
from fleetloop.daemon.act.publish import decision_bytes
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas import (
    TOPICS,
    AdmissionDecision,
    AutoscaleDecision,
    BatchingDecision,
    BreakerDecision,
    Decision,
    DecisionBody,
    NodeTelemetry,
    PolicyStamp,
    RequestOutcome,
    RetryBudgetDecision,
    RoutingDecision,
    Tick,
    topic_name,
)
from fleetloop.schemas.control import Activation, ActivePolicy, ShadowActivation
from fleetloop.schemas.decisions import FleetDecision
from fleetloop.schemas.export import EXPORTED, JSON_DIR, rendered
from fleetloop.schemas.summary import ShardSummary
from fleetloop.schemas.topics import CHECKPOINT, DEADLETTER, POLICY, POLICY_ACTIVE, STATE
from pydantic import BaseModel, ValidationError
from tests.support.records import outcome, telemetry, tick

STAMP = PolicyStamp(name="default", version=3, hash="0123456789abcdef", mode="enforce")

BODIES: dict[str, DecisionBody] = {
    "routing": RoutingDecision(
        entity="pool/p",
        pool_id="p",
        weights={"b": 0.25, "a": 0.75},
        by_priority={"0": {"a": 1.0}},
        prefix_affinity={"d1": ("a", "b")},
        spill_to=("q",),
        reason="least-queue",
        inputs={"nodes": 2.0, "stale_nodes": 0.0},
    ),
    "breaker": BreakerDecision(
        entity="node/a",
        pool_id="p",
        node_id="a",
        state="open",
        until_ms=1_700_000_010_000,
        ejections=2,
        reason="consecutive-failures",
        inputs={"consecutive_failures": 7.0},
    ),
    "admission": AdmissionDecision(
        entity="pool/p",
        pool_id="p",
        max_queue_depth={"0": 64, "1": 32},
        new_task_max_queue_depth={"0": 48, "1": 24},
        reason="static-thresholds",
    ),
    "retry_budget": RetryBudgetDecision(
        entity="pool/p/tenant/t",
        pool_id="p",
        tenant_id="t",
        retry_ratio=0.2,
        min_retries_per_s=10.0,
        retries_allowed_now=100,
        reason="tenant-budget",
    ),
    "autoscale": AutoscaleDecision(
        entity="pool/p", pool_id="p", current_nodes=4, desired_nodes=3, drain=("n3",), reason="scale-down"
    ),
    "batching": BatchingDecision(entity="pool/p", pool_id="p", max_batch_tokens=8192, reason="static"),
    "fleet": FleetDecision(
        entity="fleet",
        reason="complete",
        shards=4,
        pools=32,
        nodes=1024,
        cost_rate_usd_per_h=5000.5,
        requests_w=9000,
        retries_w=90,
        retries_allowed=900,
        retry_budget_used_frac=0.1,
        tasks_succeeded=700,
        tasks_failed=3,
        fleet_cost_usd=123.25,
        spend_on_failed_usd=0.5,
        cost_per_successful_task_usd=0.17607142857142857,
    ),
}


def decision(body: DecisionBody) -> Decision:
    return Decision(
        ts_ms=1_700_000_000_000,
        tick_id=42,
        policy=STAMP,
        input_offsets={"fleet.telemetry:1": 10, "fleet.requests:0": 7},
        body=body,
    )


# -- drift ----------------------------------------------------------------------------------------


def test_exported_json_schemas_match_the_models() -> None:
    expected = rendered()
    on_disk = {p.name: p.read_text() for p in sorted(JSON_DIR.glob("*.json"))}
    assert sorted(on_disk) == sorted(expected), (
        "schemas/json/ does not hold exactly the exported models; run `make schemas`"
    )
    drifted = sorted(name for name, text in expected.items() if on_disk[name] != text)
    assert not drifted, f"JSON Schema drift in {', '.join(drifted)}; run `make schemas` and commit the result"


def test_export_covers_every_top_level_record() -> None:
    assert {m.__name__ for m in EXPORTED} == {
        "NodeTelemetry",
        "RequestOutcome",
        "Tick",
        "PolicyDocument",
        "Decision",
        "ActivePolicy",
        "ShardSummary",
    }


# -- strictness -----------------------------------------------------------------------------------


def _models_reachable(model: type[BaseModel]) -> set[type[BaseModel]]:
    """The model and every pydantic model its fields can hold, transitively."""
    seen: set[type[BaseModel]] = set()
    todo: list[Any] = [model]
    while todo:
        t = todo.pop()
        if isinstance(t, type) and issubclass(t, BaseModel):
            if t in seen:
                continue
            seen.add(t)
            todo.extend(f.annotation for f in t.model_fields.values())
        else:
            todo.extend(typing.get_args(t))
    return seen


@pytest.mark.parametrize("model", EXPORTED, ids=lambda m: m.__name__)
def test_every_exported_model_and_its_parts_are_frozen_and_forbid_extra_fields(
    model: type[BaseModel],
) -> None:
    reachable = _models_reachable(model)
    assert model in reachable
    loose = sorted(
        m.__name__
        for m in reachable
        if m.model_config.get("extra") != "forbid" or m.model_config.get("frozen") is not True
    )
    assert loose == []


def _active() -> ActivePolicy:
    doc = builtin_policy("default").document
    shadow_doc = doc.model_copy(
        update={"spec": doc.spec.model_copy(update={"mode": "shadow"}), "metadata": doc.metadata}
    )
    return ActivePolicy(
        group="fleetloop",
        name="default",
        version=doc.metadata.version,
        hash="0123456789abcdef",
        from_ts_ms=1_700_000_000_000,
        from_tick_id=1_700_000_000,
        considered_offset=4,
        history=[Activation(from_ts_ms=1_700_000_000_000, document=doc)],
        shadow=[
            ShadowActivation(from_ts_ms=1_700_000_001_000, document=shadow_doc),
            ShadowActivation(from_ts_ms=1_700_000_002_000, document=None),
        ],
    )


def test_active_policy_names_the_shadow_in_force_or_none() -> None:
    active = _active()
    assert active.shadow_document is None  # the last change removed it
    kept = active.model_copy(update={"shadow": active.shadow[:1]})
    assert kept.shadow_document is not None
    assert kept.shadow_document.spec.mode == "shadow"
    # A record written before shadow mode (no "shadow" field) still reads.
    old = active.model_dump(mode="json")
    del old["shadow"]
    assert ActivePolicy.model_validate(old).shadow == []


def _valid_instance(model: type[BaseModel]) -> BaseModel:
    instances: dict[type[BaseModel], BaseModel] = {
        NodeTelemetry: telemetry("a"),
        RequestOutcome: outcome("a"),
        Tick: tick(3),
        Decision: decision(BODIES["routing"]),
        ActivePolicy: _active(),
        ShardSummary: ShardSummary(
            ts_ms=1_700_000_000_000,
            tick_id=42,
            group="fleetloop",
            partition=3,
            window_ms=10_000,
            pools=8,
            nodes=256,
            cost_rate_usd_per_h=1234.5,
            requests_w=5000,
            retries_w=40,
            shed_w=3,
            retries_allowed=800,
            tasks_started=900,
            tasks_succeeded=880,
            tasks_failed=4,
            fleet_cost_nusd=12_345_678_901,
            spend_on_failed_nusd=1_000_000,
        ),
    }
    if model in instances:
        return instances[model]
    return builtin_policy("default").document  # PolicyDocument


@pytest.mark.parametrize("model", EXPORTED, ids=lambda m: m.__name__)
def test_an_unknown_field_is_refused(model: type[BaseModel]) -> None:
    data = _valid_instance(model).model_dump(mode="json")
    assert model.model_validate(data).model_dump(mode="json") == data  # the base case is valid
    with pytest.raises(ValidationError) as err:
        model.model_validate({**data, "surprise": 1})
    assert [(e["type"], e["loc"]) for e in err.value.errors()] == [("extra_forbidden", ("surprise",))]


@pytest.mark.parametrize("model", EXPORTED, ids=lambda m: m.__name__)
def test_an_instance_cannot_be_changed(model: type[BaseModel]) -> None:
    instance = _valid_instance(model)
    name = next(iter(model.model_fields))
    before = getattr(instance, name)
    with pytest.raises(ValidationError) as err:
        setattr(instance, name, before)
    assert err.value.errors()[0]["type"] == "frozen_instance"


def test_a_nested_decision_body_refuses_unknown_fields() -> None:
    data = decision(BODIES["breaker"]).model_dump(mode="json")
    data["body"]["colour"] = "red"
    with pytest.raises(ValidationError) as err:
        Decision.model_validate(data)
    assert err.value.errors()[0]["type"] == "extra_forbidden"
    assert err.value.errors()[0]["loc"][-1] == "colour"


# -- RequestOutcome's validator -------------------------------------------------------------------


def test_cached_prompt_tokens_above_prompt_tokens_are_refused() -> None:
    assert outcome("a", prompt_tokens=100, cached_prompt_tokens=100).cached_prompt_tokens == 100
    with pytest.raises(ValidationError, match="cached_prompt_tokens exceeds prompt_tokens"):
        outcome("a", prompt_tokens=100, cached_prompt_tokens=101)


@pytest.mark.parametrize("kind", ["ok", "error", "timeout", "retry"])
def test_a_placed_outcome_needs_a_node(kind: str) -> None:
    with pytest.raises(ValidationError, match=f"outcome '{kind}' needs node_id"):
        outcome(None, kind)


def test_a_shed_call_may_have_no_node() -> None:
    o = outcome(None, "shed")
    assert (o.outcome, o.node_id) == ("shed", None)


# -- numeric bounds -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "error_type"),
    [
        ("queue_depth", -1, "greater_than_equal"),
        ("running_requests", -1, "greater_than_equal"),
        ("kv_cache_used_frac", 1.0001, "less_than_equal"),
        ("kv_cache_used_frac", -0.1, "greater_than_equal"),
        ("kv_cache_used_frac", math.nan, "finite_number"),
        ("gpu_util_frac", math.inf, "finite_number"),
        ("ttft_p99_ms", math.nan, "finite_number"),
        ("cost_rate_usd_per_h", math.nan, "finite_number"),
        ("cost_rate_usd_per_h", -0.5, "greater_than_equal"),
        ("interval_ms", 0, "greater_than_equal"),
        ("ts_ms", -1, "greater_than_equal"),
    ],
)
def test_telemetry_numeric_bounds(field: str, value: float, error_type: str) -> None:
    with pytest.raises(ValidationError) as err:
        telemetry("a", **{field: value})
    assert [(e["type"], e["loc"]) for e in err.value.errors()] == [(error_type, (field,))]


@pytest.mark.parametrize(
    ("field", "value", "error_type"),
    [
        ("priority", 10, "less_than_equal"),
        ("attempt", -1, "greater_than_equal"),
        ("cost_usd", math.nan, "finite_number"),
        ("e2e_ms", -1.0, "greater_than_equal"),
    ],
)
def test_outcome_numeric_bounds(field: str, value: float, error_type: str) -> None:
    with pytest.raises(ValidationError) as err:
        outcome("a", **{field: value})
    assert [(e["type"], e["loc"]) for e in err.value.errors()] == [(error_type, (field,))]


def test_a_nan_weight_is_refused_in_a_routing_decision() -> None:
    with pytest.raises(ValidationError) as err:
        RoutingDecision(entity="pool/p", pool_id="p", weights={"a": math.nan}, reason="x")
    assert err.value.errors()[0]["type"] == "finite_number"


def test_the_boundaries_themselves_are_accepted() -> None:
    t = telemetry("a", queue_depth=0, kv_cache_used_frac=1.0, gpu_util_frac=0.0, cost_rate_usd_per_h=0.0)
    assert (t.queue_depth, t.kv_cache_used_frac, t.gpu_util_frac) == (0, 1.0, 0.0)


# -- decisions ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "key"),
    [
        ("routing", "routing/pool/p"),
        ("breaker", "breaker/node/a"),
        ("retry_budget", "retry_budget/pool/p/tenant/t"),
        ("autoscale", "autoscale/pool/p"),
        ("fleet", "fleet/fleet"),
    ],
)
def test_decision_key_is_kind_slash_entity(kind: str, key: str) -> None:
    assert decision(BODIES[kind]).key == key


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_a_decision_round_trips_through_json_byte_identically(kind: str) -> None:
    d = decision(BODIES[kind])
    raw = decision_bytes(d)
    back = Decision.model_validate_json(raw)
    assert back == d
    assert type(back.body) is type(d.body)
    assert decision_bytes(back) == raw


def test_canonical_bytes_sort_keys_and_do_not_depend_on_dict_insertion_order() -> None:
    a = decision(BODIES["routing"])
    b = a.model_copy(update={"input_offsets": {"fleet.requests:0": 7, "fleet.telemetry:1": 10}})
    assert decision_bytes(a) == decision_bytes(b)
    raw = decision_bytes(a)
    assert (
        raw.index(b'"body"') < raw.index(b'"input_offsets"') < raw.index(b'"policy"') < raw.index(b'"ts_ms"')
    )
    assert b'"weights":{"a":0.75,"b":0.25}' in raw


# -- topics ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "logical", "physical"),
    [
        ("", "fleet.telemetry", "fleet.telemetry"),
        ("staging", "fleet.telemetry", "staging.fleet.telemetry"),
        ("t1", "control.state", "t1.control.state"),
    ],
)
def test_topic_name(prefix: str, logical: str, physical: str) -> None:
    assert topic_name(prefix, logical) == physical


@pytest.mark.parametrize("prefix", ["", "staging"])
def test_topic_name_refuses_an_unknown_topic(prefix: str) -> None:
    with pytest.raises(KeyError, match=r"unknown topic 'fleet\.nope'"):
        topic_name(prefix, "fleet.nope")


def test_every_topic_has_a_value_model_except_the_dead_letter_and_checkpoint_topics() -> None:
    without = sorted(name for name, spec in TOPICS.items() if spec.value is None)
    assert without == sorted([DEADLETTER, CHECKPOINT])
    assert all(issubclass(spec.value, BaseModel) for spec in TOPICS.values() if spec.value is not None)


def test_compacted_topics_are_exactly_checkpoint_policy_active_and_state() -> None:
    compacted = sorted(name for name, spec in TOPICS.items() if spec.cleanup == "compact")
    assert compacted == sorted([CHECKPOINT, POLICY, POLICY_ACTIVE, STATE])
    assert compacted == ["control.checkpoint", "control.policy", "control.policy.active", "control.state"]


def test_topic_registry_keys_are_the_logical_names() -> None:
    assert all(name == spec.logical for name, spec in TOPICS.items())
    assert len(TOPICS) == 11
    assert TOPICS["control.summaries"].cleanup == "delete"
    assert TOPICS["control.shadow"].cleanup == "delete"
    assert TOPICS["control.shadow"].value is Decision


def test_the_readme_topics_table_lists_every_registry_topic_with_its_cleanup_and_partitions() -> None:
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    section = readme.split("## Topics", 1)[1].split("\n## ", 1)[0]
    table = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| ")
    ]
    header = table[0]
    cleanup, partitions = header.index("cleanup"), header.index("partitions")
    rows = {cells[0]: (cells[cleanup], cells[partitions].split()[0]) for cells in table[1:]}
    assert rows == {name: (spec.cleanup, str(spec.partitions)) for name, spec in TOPICS.items()}
