"""capacity: the engine a pool's nodes report (``NodeTelemetry.engine``) picks the runtime profile
its physics is planned with; an engine without a profile, or none, keeps the stated one."""

from __future__ import annotations

import pytest
from fleetloop.perf.serving import Mix, Targets, max_rate, node_shape
from fleetloop.policies.autoscale.capacity import CapacityParams
from fleetloop.policies.autoscale.capacity.params import PoolSpec
from fleetloop.policies.autoscale.capacity.rule import pool_engine
from tests.policies.snapshots import nodes
from tests.policies.test_capacity import H100, OUTPUT, PROMPT, decide, h100s, history, pool_snap

CALLS = 60.0


def _rate(engine: str, family: str | None = None) -> float:
    shape = node_shape("llama-8b", "H100", 1, engine=engine, family=family, max_batch_tokens=8192)
    assert shape is not None
    return max_rate(shape, Mix(PROMPT, 0.0, OUTPUT), Targets(0.1, 2.0))


def test_the_reported_engine_changes_the_sized_node_count() -> None:
    default, _ = decide(pool_snap(h100s(4), CALLS), history(CALLS))
    sized = {}
    for engine in ("vllm", "sglang", "trtllm"):
        d, _ = decide(pool_snap(h100s(4, engine=engine), CALLS), history(CALLS))
        assert d.inputs["node_calls_per_s"] == pytest.approx(_rate(engine), rel=0.05), engine
        sized[engine] = d.desired_nodes
    # vLLM is what a pool without a reported engine is planned as; SGLang's profile (prefill steps
    # of their own) carries fewer calls per node on this mix: one node more for the same demand.
    assert sized["vllm"] == default.desired_nodes == 3
    assert sized["sglang"] == 4
    assert _rate("trtllm") > _rate("vllm") > _rate("sglang")


def test_an_engine_without_a_profile_plans_as_the_stated_engine() -> None:
    default, _ = decide(pool_snap(h100s(4), CALLS), history(CALLS))
    unknown, _ = decide(pool_snap(h100s(4, engine="lmdeploy"), CALLS), history(CALLS))
    assert unknown.desired_nodes == default.desired_nodes
    assert unknown.inputs == default.inputs
    stated = {"p": PoolSpec(engine="sglang")}
    d, _ = decide(pool_snap(h100s(4, engine="lmdeploy"), CALLS), history(CALLS), pools=stated)
    assert d.inputs["node_calls_per_s"] == pytest.approx(_rate("sglang"), rel=0.05)


def test_the_reported_engine_comes_before_the_stated_one_whose_release_fits_only_itself() -> None:
    spec = PoolSpec(engine="vllm", engine_version="0.6")
    (ref, *rest) = h100s(3, engine="sglang")
    assert pool_engine(ref, [ref, *rest], spec) == ("sglang", None)
    (ref, *rest) = h100s(3, engine="vllm")
    assert pool_engine(ref, [ref, *rest], spec) == ("vllm", "0.6")
    (ref, *rest) = h100s(3)
    assert pool_engine(ref, [ref, *rest], spec) == ("vllm", "0.6")
    assert pool_engine(ref, [ref, *rest], CapacityParams().pool("p")) == ("vllm", None)


def test_a_pool_reporting_two_engines_is_planned_with_the_commoner_one() -> None:
    spec = CapacityParams().pool("p")
    trt = nodes(1, prefix="t", **H100, engine="trtllm")
    sgl = nodes(2, prefix="s", **H100, engine="sglang")
    assert pool_engine(trt[0], [*trt, *sgl], spec) == ("sglang", None)
    tie = [*trt, sgl[0]]
    assert pool_engine(trt[0], tie, spec) == ("sglang", None)  # a tie goes to the first name
    # No warm node: the reference node's own report.
    assert pool_engine(trt[0], [], spec) == ("trtllm", None)
