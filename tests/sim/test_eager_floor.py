"""An iteration without a CUDA graph launches its layers' kernels one by one: it lasts at least
``layers x EAGER_LAYER_S`` (fleetloop.perf.step.eager_floor_s). Which iterations do is the engine's
(RuntimeProfile.runs_eager); the simulated node and the capacity physics price them alike."""

from __future__ import annotations

import heapq

import pytest
from fleetloop.perf import catalog
from fleetloop.perf.catalog import NodeSpec, node_spec
from fleetloop.perf.engines import RuntimeProfile, profile
from fleetloop.perf.serving import Mix, node_shape, steady
from fleetloop.perf.step import StepCosts, compute_s, eager_floor_s, memory_s, roofline
from fleetloop.sim.node import Node, Req
from tests.sim.physics import Recorder

PROMPT = 224  # the SGLang / vLLM 0.6 comparison's mean prompt


def _first_token_s(spec: NodeSpec, runtime: RuntimeProfile, prompt: int) -> float:
    """A lone request's first token on an idle node (the engine's own time, no api_s)."""
    heap: list[tuple[float, int, int]] = []
    rec = Recorder()

    def schedule(t: float, node: Node, version: int) -> None:
        heapq.heappush(heap, (t, len(heap), version))

    node = Node("p/0", "p", spec, rec, schedule, now=0.0, warm=True, runtime=runtime)
    node.submit(Req(1, prompt, 2, None, 0), 0.0)
    while heap:
        t, _, version = heapq.heappop(heap)
        node.on_event(t, version)
    return rec.first[1]


def _prefill_s(spec: NodeSpec, runtime: RuntimeProfile, prompt: int) -> tuple[float, float]:
    """(roofline time, fixed costs) of one prefill of ``prompt`` tokens on an idle node."""
    costs = StepCosts.of(spec)
    gpu = roofline(
        compute_s(costs, prompt, costs.attn * prompt * prompt / 2.0), memory_s(costs, float(prompt))
    )
    fixed = spec.overhead_s(1, prompt, 1, step_s=runtime.step_s, seq_s=runtime.seq_s, admit_s=runtime.admit_s)
    return gpu, fixed


def test_which_iterations_run_eagerly() -> None:
    v1, v0, sgl, trt = profile("vllm"), profile("vllm", "0.6"), profile("sglang"), profile("trtllm")
    for p in (v1, v0, sgl, trt):
        assert not p.runs_eager(64, prefill=False, graph_top=160)  # a decode batch in a graph
        assert p.runs_eager(161, prefill=False, graph_top=160)  # past the largest graph
    # A prefill: eager on the engines that capture decode batches only; V1's piecewise graphs take
    # any batch of up to its largest capture size.
    assert [p.runs_eager(224, prefill=True, graph_top=512) for p in (v1, v0, sgl, trt)] == [
        False,
        True,
        True,
        True,
    ]
    assert v1.runs_eager(513, prefill=True, graph_top=512)


def test_a_short_prefill_of_a_deep_model_waits_for_its_launches() -> None:
    """70B on four H100s: a 224-token prefill's GPU time is under 80 layers' launches (SGLang 0.3
    runs it eagerly), so its first token comes after the floor; vLLM V1 replays it as a graph."""
    spec = node_spec("llama-70b", "H100")
    assert spec.gpus == 4
    floor = eager_floor_s(spec)
    assert floor == pytest.approx(80 * catalog.EAGER_LAYER_S)
    sgl = profile("sglang")
    gpu, fixed = _prefill_s(spec, sgl, PROMPT)
    assert gpu < floor
    assert _first_token_s(spec, sgl, PROMPT) == pytest.approx(floor + fixed, rel=1e-9)
    v1 = profile("vllm")
    gpu, fixed = _prefill_s(spec, v1, PROMPT)
    assert _first_token_s(spec, v1, PROMPT) == pytest.approx(gpu + fixed, rel=1e-9)


def test_a_long_prefill_hides_its_launches() -> None:
    spec = node_spec("llama-8b", "A100")
    sgl = profile("sglang")
    gpu, fixed = _prefill_s(spec, sgl, 4000)
    assert gpu > eager_floor_s(spec)
    assert _first_token_s(spec, sgl, 4000) == pytest.approx(gpu + fixed, rel=1e-9)


def test_the_capacity_physics_prices_an_eager_prefill_as_the_node_does() -> None:
    shape = node_shape("llama-70b", "H100", 4, engine="sglang")
    assert shape is not None
    assert shape.graph_top == 160
    idle = steady(shape, Mix(PROMPT, 0.0, 189.0), 0.0)
    assert idle is not None
    own = _first_token_s(shape.spec, shape.runtime, PROMPT)
    assert idle.ttft_s == pytest.approx(shape.runtime.api_s + idle.step_s / 2.0 + own, rel=1e-9)
