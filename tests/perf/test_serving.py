"""The steady-state serving model (fleetloop.perf.serving) against the simulated node it shares its
physics with: a node under a Poisson stream of calls, its time between tokens and its calls in flight
as the model predicts them, and the largest rate a node serves within a latency target."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from fleetloop.perf.catalog import node_spec
from fleetloop.perf.serving import (
    Mix,
    Targets,
    max_rate,
    median_step_s,
    meets,
    node_shape,
    steady,
)
from fleetloop.sim.node import Node, Req
from tests.sim.physics import Recorder


def _poisson_node(
    model: str, gpu: str, rate: float, prompt: int, output: int, *, seconds: float = 240.0
) -> tuple[float, float]:
    """(token-weighted mean time between tokens in ms, time-averaged calls in flight) of one
    simulated node fed ``rate`` calls/s of ``prompt`` and ``output`` tokens, measured over the
    second half of the run (the first is the ramp)."""
    heap: list[tuple[float, int, int, int]] = []
    seq = 0

    def schedule(t: float, node: Node, version: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, 0, version))

    node = Node("p/0", "p", node_spec(model, gpu), Recorder(), schedule, now=0.0, warm=True)
    rng = np.random.default_rng(7)
    t = 0.0
    while t < seconds:
        t += float(rng.exponential(1.0 / rate))
        seq += 1
        heapq.heappush(heap, (t, seq, 1, 0))
    half = seconds / 2.0
    area = 0.0
    last = 0.0
    rid = 0
    while heap:
        now, _, kind, version = heapq.heappop(heap)
        if now > seconds:
            break
        if now > half:
            area += (now - max(last, half)) * node.running
        last = now
        if kind == 1:
            rid += 1
            node.submit(Req(rid, prompt, output, None, 0), now)
        else:
            node.on_event(now, version)
        if now <= half:
            node.stats.tbt.clear()
    tokens = sum(w for _, w in node.stats.tbt)
    tbt = sum(ms * w for ms, w in node.stats.tbt) / tokens
    return tbt, area / (seconds - half)


@pytest.mark.parametrize(
    ("model", "gpu", "prompt", "output"),
    [("llama-8b", "H100", 700, 250), ("llama-70b", "H100", 2000, 250), ("llama-8b", "A100", 800, 300)],
)
@pytest.mark.parametrize(("load", "rel"), [(0.3, 0.1), (0.8, 0.1), (0.9, 0.15)])
def test_the_model_predicts_the_simulated_node_within_ten_percent(
    model: str, gpu: str, prompt: int, output: int, load: float, rel: float
) -> None:
    """Within 10% up to 80% of a node's rate; at 90% of the 70B's (where the TBT target binds on the
    median iteration) the fluid model reads the mean iteration 12% and the calls in flight 14% short
    of the simulated node's: near the knee the batch's variance lengthens iterations, which a mean
    misses. The 99th-percentile population ``max_rate`` holds a node to is the margin for it."""
    shape = node_shape(model, gpu, 0)
    assert shape is not None
    mix = Mix(prompt, 0, output)
    rate = load * max_rate(shape, mix, Targets(tbt_s=0.1, ttft_s=2.0))
    model_state = steady(shape, mix, rate)
    assert model_state is not None
    tbt_ms, running = _poisson_node(model, gpu, rate, prompt, output)
    assert model_state.step_s * 1000.0 == pytest.approx(tbt_ms, rel=rel)
    assert model_state.running == pytest.approx(running, rel=0.15)


def test_a_node_past_its_budget_has_no_steady_state() -> None:
    shape = node_shape("llama-8b", "H100", 0)
    assert shape is not None
    mix = Mix(700, 0, 250)
    assert steady(shape, mix, 1000.0) is None
    ok = steady(shape, mix, 5.0)
    assert ok is not None
    assert ok.step_s > steady(shape, mix, 0.0).step_s  # type: ignore[union-attr]


def test_max_rate_is_the_edge_of_meeting_the_targets_and_grows_with_them() -> None:
    shape = node_shape("llama-8b", "H100", 0)
    assert shape is not None
    mix = Mix(1500, 1000, 200)
    tight, loose = Targets(0.04, 1.0), Targets(0.1, 2.0)
    r_tight, r_loose = max_rate(shape, mix, tight), max_rate(shape, mix, loose)
    assert 0.0 < r_tight < r_loose
    assert meets(shape, mix, r_tight, tight)
    assert not meets(shape, mix, r_tight * 1.02, tight)
    # A cached prefix is not prefilled again: the same calls with none of it cached fit fewer per node.
    assert max_rate(shape, Mix(1500, 0, 200), loose) < r_loose
    # A node measured twice as slow as its physics serves fewer.
    assert max_rate(shape, mix, loose, slow=2.0) < r_loose


def test_the_kv_cache_bounds_long_calls() -> None:
    shape = node_shape("llama-70b", "H100", 4)
    assert shape is not None
    long_calls = Mix(60_000, 0, 500)
    rate = max_rate(shape, long_calls, Targets(1.0, 60.0))
    st = steady(shape, long_calls, rate)
    assert st is not None
    assert st.kv_tokens <= shape.kv_tokens  # the mean, and by construction its 99th percentile too
    assert not meets(shape, long_calls, rate * 1.05, Targets(1.0, 60.0))


def test_median_step_is_at_most_the_mean_where_prefill_iterations_are_rare() -> None:
    shape = node_shape("llama-8b", "H100", 0)
    assert shape is not None
    mix = Mix(700, 0, 250)
    st = steady(shape, mix, 5.0)
    med = median_step_s(shape, mix, 5.0)
    assert st is not None
    assert med is not None
    assert med <= st.step_s


def test_a_long_prompts_chunk_iterations_do_not_set_a_nodes_rate() -> None:
    """An iteration carrying a chunk of a 4,000-token prompt is long on an idle node too (the chunk
    cap sets it, not the batch): the TBT target holds the median iteration, so a target well above the
    idle node's median barely moves the rate (held to the mean iteration, 30 ms gave 25% less than
    50 ms)."""
    shape = node_shape("llama-8b", "H100", 0)
    assert shape is not None
    mix = Mix(4000, 0, 200)
    tight, loose = max_rate(shape, mix, Targets(0.03, 5.0)), max_rate(shape, mix, Targets(0.05, 5.0))
    assert tight >= 0.9 * loose
    med = median_step_s(shape, mix, tight)
    assert med is not None
    assert med <= 0.03


def test_a_steady_state_just_past_a_small_step_budget_misses_rather_than_fails() -> None:
    """A 512-token step budget (the batching lever's floor) on an A100: the population's 99th
    percentile settles within the fixed point's tolerance just past the budget, where the iteration
    mixture has no value; that rate is missed, the search goes on below it."""
    shape = node_shape("llama-8b", "A100", 1, max_batch_tokens=512)
    assert shape is not None
    mix = Mix(1405.0, 157.4, 293.9, 1405.0)
    rate = max_rate(shape, mix, Targets(0.1, 2.0))
    assert rate > 0.0
    assert meets(shape, mix, rate, Targets(0.1, 2.0))


def test_unknown_hardware_has_no_shape() -> None:
    assert node_shape("llama-9000", "H100", 1) is None
    assert node_shape("llama-8b", "TPU", 1) is None
    assert node_shape("llama-8b", "H100", 1, engine="vllm", family="9.9") is None
    assert node_shape("llama-8b", "H100", 1, engine="sglang") is not None
