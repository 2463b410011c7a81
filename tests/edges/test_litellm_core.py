"""The LiteLLM integration's core (fleetloop/edges/litellm/core.py, mapping.py): LiteLLM's candidate
deployments in, the node fleetloop's router picks out, and each attempt's RequestOutcome. No LiteLLM
and no broker: deployments are the ``model_list`` dicts LiteLLM hands its filter hook."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fleetloop.edges.litellm.core import LiteLLMRouting
from fleetloop.edges.litellm.mapping import (
    DeploymentMap,
    DeploymentMapError,
    Placement,
    call_of,
    load_deployment_map,
    placement_of,
)
from fleetloop.schemas.requests import Outcome
from tests.router.test_pick import admission, breaker, budget, routing

NODES = [f"chat/{i}" for i in range(3)]
CALLS = itertools.count()


def deployment(
    node: str, *, group: str = "llama-8b", pool: str | None = "chat", named: bool = True
) -> dict[str, Any]:
    i = node.rsplit("/", 1)[-1]
    info: dict[str, Any] = {"id": f"d{i}"}
    if named:
        info["fleetloop_node"] = node
        if pool is not None:
            info["fleetloop_pool"] = pool
    return {
        "model_name": group,
        "litellm_params": {"model": f"openai/{group}", "api_base": f"http://127.0.0.1:800{i}/v1"},
        "model_info": info,
    }


DEPLOYMENTS = [deployment(n) for n in NODES]


def headers(**kw: str) -> dict[str, Any]:
    return {"metadata": {"headers": {f"x-fleetloop-{k.replace('_', '-')}": v for k, v in kw.items()}}}


def pick(r: LiteLLMRouting, now: float = 1.0, deps: list[dict[str, Any]] | None = None, **hdr: str) -> str:
    kept, shed = r.select(
        "llama-8b", deps or DEPLOYMENTS, headers(**hdr), call_id=f"c{next(CALLS)}", now_s=now, wall_ms=1000
    )
    if shed is not None:
        assert kept == []
        return "shed"
    assert len(kept) == 1, kept
    return str(kept[0]["model_info"]["fleetloop_node"])


def routing_core(*decisions: Any) -> LiteLLMRouting:
    r = LiteLLMRouting(rng=np.random.default_rng(1))
    r.apply(list(decisions), 0.0)
    return r


def test_a_deployment_is_a_node_by_its_model_info_or_by_the_map_s_api_base(tmp_path: Path) -> None:
    assert placement_of(deployment("chat/0"), DeploymentMap()) == Placement("chat/0", "chat", "llama-8b")
    # no fleetloop_pool: the map's pool for the model group, else the group's own name
    assert placement_of(deployment("chat/0", pool=None), DeploymentMap()) == Placement(
        "chat/0", "llama-8b", "llama-8b"
    )
    bare = deployment("chat/1", named=False)
    assert placement_of(bare, DeploymentMap()) is None
    path = tmp_path / "map.yaml"
    path.write_text("deployments: {'http://127.0.0.1:8001/v1/': chat/1}\npools: {llama-8b: chat}\n")
    assert placement_of(bare, load_deployment_map(path)) == Placement("chat/1", "chat", "llama-8b")


@pytest.mark.parametrize(
    ("text", "message"),
    [("[1, 2]", "want a mapping"), ("nodes: {}", "want a mapping"), ("deployments: {a: 1}", "name -> name")],
)
def test_a_bad_deployment_map_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "map.yaml"
    path.write_text(text)
    with pytest.raises(DeploymentMapError, match=message) as exc:
        load_deployment_map(path)
    assert "\n" not in str(exc.value)


def test_a_call_is_read_from_its_headers_and_the_sdk_s_metadata_wins() -> None:
    req = headers(task="t-7", call="2", tenant="gold", priority="0", prefix="p1", prompt_tokens="900")
    c = call_of(req, call_id="lc-1", default_priority=1)
    assert (c.request_id, c.workflow_id, c.step_index, c.tenant_id, c.priority) == (
        "lc-1",
        "t-7",
        2,
        "gold",
        0,
    )
    assert (c.prefix_digest, c.prompt_tokens, c.attempt, c.latency_budget_ms) == ("p1", 900, 0, 0)
    req["metadata"]["fleetloop"] = {"priority": 3, "budget_ms": 5000}
    c = call_of(req, call_id="lc-1", default_priority=1)
    assert (c.priority, c.latency_budget_ms, c.workflow_id) == (3, 5000, "t-7")
    # nothing said: the request is its own task, the default priority, an anonymous tenant
    c = call_of({}, call_id="lc-2", default_priority=1)
    assert (c.workflow_id, c.priority, c.tenant_id) == ("lc-2", 1, "anonymous")


def test_without_state_it_fails_static_over_litellm_s_candidates() -> None:
    r = routing_core()
    got = Counter(pick(r) for _ in range(30))
    assert got == dict.fromkeys(NODES, 10)  # round robin over every candidate


def test_an_open_breaker_takes_a_node_out_of_the_picks_until_the_state_goes_stale() -> None:
    r = routing_core(routing("chat", dict.fromkeys(NODES, 1.0)), breaker("chat/0"))
    assert {pick(r) for _ in range(30)} == {"chat/1", "chat/2"}
    # the state is 31 s old: fail static, every candidate again, the ejected node included
    assert {pick(r, now=31.0) for _ in range(30)} == set(NODES)


def test_a_node_litellm_leaves_out_is_never_picked_and_never_empties_the_pool() -> None:
    r = routing_core(routing("chat", {"chat/0": 1.0, "chat/1": 0.0, "chat/2": 0.0}))
    assert {pick(r) for _ in range(10)} == {"chat/0"}
    # LiteLLM cooled chat/0 down: the decision leaves no candidate, so the others share evenly
    assert {pick(r, deps=DEPLOYMENTS[1:]) for _ in range(10)} == {"chat/1", "chat/2"}
    assert {pick(r) for _ in range(10)} == {"chat/0"}  # back among the candidates: the weights again


def test_a_full_queue_sheds_the_call_with_no_node_named() -> None:
    r = routing_core(routing("chat", {"chat/0": 1.0}), admission("chat", max_queue_depth={"2": 4}))
    assert pick(r, priority="2") == "chat/0"  # the first call: the nodes are known from then on
    r.endpoints["chat/0"].queue_depth = 4  # fleet.telemetry, through the follower
    assert pick(r, priority="0") == "chat/0"  # priority 0 has no limit
    kept, shed = r.select(
        "llama-8b", DEPLOYMENTS, headers(priority="2", task="t-1"), call_id="c9", now_s=1.0, wall_ms=5
    )
    assert kept == []
    assert shed is not None
    assert (shed.outcome, shed.node_id, shed.pool_id, shed.workflow_id, shed.priority) == (
        "shed", None, "chat", "t-1", 2,
    )  # fmt: skip


def test_a_retry_spends_the_budget_and_is_shed_when_it_is_spent() -> None:
    r = routing_core(routing("chat", dict.fromkeys(NODES, 1.0)), budget("chat", 1))
    assert pick(r, attempt="1") != "shed"
    assert pick(r, attempt="1") == "shed"
    assert pick(r) != "shed"  # a first attempt spends nothing
    # LiteLLM's own retry (the same call placed again) counts as a retry too
    r.apply([budget("chat", 1, tick=2)], 0.0)
    first, _ = r.select("llama-8b", DEPLOYMENTS, {}, call_id="lc-9", now_s=1.0, wall_ms=1)
    again, _ = r.select("llama-8b", DEPLOYMENTS, {}, call_id="lc-9", now_s=1.1, wall_ms=1)
    third, shed = r.select("llama-8b", DEPLOYMENTS, {}, call_id="lc-9", now_s=1.2, wall_ms=1)
    assert (len(first), len(again), third, shed is not None) == (1, 1, [], True)


def test_prefix_affinity_keeps_a_task_on_the_node_holding_its_prefix() -> None:
    r = routing_core(routing("chat", dict.fromkeys(NODES, 1.0), prefix_affinity={"p9": ("chat/2",)}))
    assert {pick(r, prefix="p9") for _ in range(10)} == {"chat/2"}


def test_a_model_group_with_a_deployment_fleetloop_does_not_know_is_left_to_litellm() -> None:
    r = routing_core(routing("chat", {"chat/0": 1.0}))
    deps = [*DEPLOYMENTS, deployment("chat/9", named=False)]
    kept, shed = r.select("llama-8b", deps, {}, call_id="c", now_s=1.0, wall_ms=1)
    assert (kept, shed) == (deps, None)
    assert r.counts.left_to_litellm == 1


def test_outcomes_name_the_node_that_served_and_drop_what_no_node_served() -> None:
    r = routing_core(routing("chat", {"chat/1": 1.0}))
    req = headers(task="t-3", call="1", tenant="gold", priority="0", prompt_tokens="1200")
    kept, _ = r.select("llama-8b", DEPLOYMENTS, req, call_id="c1", now_s=1.0, wall_ms=1)
    assert r.router.outstanding == {"chat/1": 1}
    ok = r.outcome(("c1",), kept[0], "ok", request=req, now_s=1.5, wall_ms=2000, ttft_ms=80.0, e2e_ms=400.0,
                   prompt_tokens=7, output_tokens=20)  # fmt: skip
    assert ok is not None
    assert (ok.node_id, ok.pool_id, ok.model, ok.workflow_id, ok.step_index, ok.priority) == (
        "chat/1", "chat", "llama-8b", "t-3", 1, 0,
    )  # fmt: skip
    # the header's prompt size over LiteLLM's count; TTFT and tokens as LiteLLM measured them
    assert (ok.prompt_tokens, ok.output_tokens, ok.ttft_ms, ok.e2e_ms, ok.outcome) == (
        1200,
        20,
        80.0,
        400.0,
        "ok",
    )
    assert r.router.outstanding == {"chat/1": 0}
    # a result with no placement on record (the filter did not place it) is still its node's
    err = r.outcome(("c2",), deployment("chat/2"), "error", request=req, now_s=2.0, wall_ms=3000)
    assert err is not None
    assert (err.node_id, err.outcome, err.ttft_ms) == ("chat/2", "error", None)
    # no node to attribute it to: not published (never evidence against a node)
    assert (
        r.outcome(("c3",), deployment("chat/5", named=False), "error", request=req, now_s=2.0, wall_ms=1)
        is None
    )
    assert r.counts.unattributed == 1


def test_a_failed_attempt_without_its_deployment_is_the_node_fleetloop_placed_it_on() -> None:
    r = routing_core(routing("chat", {"chat/2": 1.0}))
    r.select("llama-8b", DEPLOYMENTS, {}, call_id="c1", now_s=1.0, wall_ms=1)
    o = r.outcome(("", "c1"), {"model_info": None}, "timeout", request={}, now_s=3.0, wall_ms=9)
    assert o is not None
    assert (o.node_id, o.outcome, o.e2e_ms) == ("chat/2", "timeout", 2000.0)
    assert not r.placed(("c1",))


def test_a_call_whose_result_never_comes_stops_counting_as_outstanding() -> None:
    r = routing_core(routing("chat", {"chat/0": 1.0}))
    r.select("llama-8b", DEPLOYMENTS, {}, call_id="gone", now_s=1.0, wall_ms=1)
    assert r.router.outstanding == {"chat/0": 1}
    r.select("llama-8b", DEPLOYMENTS, {}, call_id="next", now_s=1000.0, wall_ms=1)
    assert not r.placed(("gone",))
    assert r.router.outstanding == {"chat/0": 1}  # the new call only


def test_header_values_the_schema_refuses_drop_the_outcome_and_are_counted() -> None:
    r = routing_core()
    o = r.outcome(
        ("c",), deployment("chat/0"), "ok", request=headers(task="no spaces allowed"), now_s=1.0, wall_ms=1
    )
    assert o is None
    assert r.counts.malformed == 1
    assert "workflow_id" in r.counts.last_error


ROOT = Path(__file__).resolve().parents[2]


def test_the_example_config_places_every_deployment_and_loads_the_callback() -> None:
    import yaml
    from fleetloop.edges.litellm import launch

    doc = yaml.safe_load((ROOT / "examples" / "litellm" / "config.yaml").read_text())
    places = [placement_of(d, DeploymentMap()) for d in doc["model_list"]]
    assert [p.node_id if p else None for p in places] == [f"chat-l40s/{i}" for i in range(4)]
    assert {p.pool_id for p in places if p} == {"chat-l40s"}
    assert doc["litellm_settings"]["callbacks"] == [launch.CALLBACK]
    # the deployment map says the same of the same deployments without their model_info
    dmap = load_deployment_map(ROOT / "examples" / "litellm" / "deployments.yaml")
    bare = [{**d, "model_info": {"id": d["model_info"]["id"]}} for d in doc["model_list"]]
    assert [placement_of(d, dmap) for d in bare] == places
    # what a bench arm starts is the same shape
    made = launch.proxy_config(
        {f"chat-l40s/{i}": f"http://127.0.0.1:810{i}" for i in range(4)},
        model="llama-8b", pool="chat-l40s", fleetloop=True,
    )  # fmt: skip
    assert [placement_of(d, DeploymentMap()) for d in made["model_list"]] == places
    assert made["litellm_settings"]["callbacks"] == [launch.CALLBACK]
    # and the proxy it starts keeps LiteLLM from fetching its price map
    env = launch.proxy_env(bootstrap="127.0.0.1:9092", topic_prefix="it", base={})
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert (env["FLEETLOOP_BOOTSTRAP_SERVERS"], env["FLEETLOOP_TOPIC_PREFIX"]) == ("127.0.0.1:9092", "it")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "set FLEETLOOP_BOOTSTRAP_SERVERS"),
        ({"FLEETLOOP_FAIL_STATIC_S": "0"}, "FLEETLOOP_FAIL_STATIC_S must be in (0, 3600]"),
        ({"FLEETLOOP_FAIL_STATIC_S": "soon"}, "FLEETLOOP_FAIL_STATIC_S 'soon': not a number"),
        ({"FLEETLOOP_DEFAULT_PRIORITY": "12"}, "FLEETLOOP_DEFAULT_PRIORITY must be in 0..9"),
        ({"FLEETLOOP_SECURITY_PROTOCOL": "CARRIER_PIGEON"}, "unknown security protocol"),
        ({"FLEETLOOP_LITELLM_MAP": "/nope.yaml"}, "FLEETLOOP_LITELLM_MAP"),
    ],
)
def test_the_proxy_callback_s_bad_settings_are_one_line(env: dict[str, str], message: str) -> None:
    import os

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from fleetloop.edges.litellm.handler import ConfigError, FleetloopCallback

    base = {"FLEETLOOP_BOOTSTRAP_SERVERS": "127.0.0.1:9092"} if env else {}
    with pytest.raises(ConfigError) as exc:
        FleetloopCallback.from_env({**base, **env})
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)
    cb = FleetloopCallback.from_env(
        {"FLEETLOOP_BOOTSTRAP_SERVERS": "127.0.0.1:9092", "FLEETLOOP_FAIL_STATIC_S": "4"}
    )
    assert (cb.routing.fail_static_s, cb.bootstrap, cb.follow_telemetry) == (4.0, "127.0.0.1:9092", True)


def test_a_final_call_that_succeeds_ends_its_task_and_one_that_fails_does_not() -> None:
    """The caller's ``x-fleetloop-final: 1`` (or ``final`` in the SDK's metadata) marks its task's last
    call: its outcome, when it succeeds, carries ``task_outcome``; a failed one may be retried and
    carries none, as does any call not marked."""
    r = routing_core(routing("chat", {"chat/1": 1.0}))
    cases: list[tuple[str | None, Outcome, str | None]] = [
        ("1", "ok", "succeeded"),
        ("1", "error", None),
        ("0", "ok", None),
        (None, "ok", None),
    ]
    for final, kind, want in cases:
        req = headers(task="t-4", call="3") if final is None else headers(task="t-4", call="3", final=final)
        kept, _ = r.select("llama-8b", DEPLOYMENTS, req, call_id="c1", now_s=1.0, wall_ms=1)
        o = r.outcome(("c1",), kept[0], kind, request=req, now_s=1.5, wall_ms=2000, e2e_ms=400.0)
        assert o is not None
        assert o.task_outcome == want, (final, kind)
    req = headers(task="t-5", call="0")
    for said, final in ((1, True), (True, True), ("true", True), (0, False), (False, False), ("yes", False)):
        req["metadata"]["fleetloop"] = {"final": said}
        assert call_of(req, call_id="lc-3", default_priority=1).final is final, said
