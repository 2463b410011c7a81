"""Serving-node physics: the formulas, KV capacity, preemption, prefix cache, cold start."""

from __future__ import annotations

import pytest
from fleetloop.sim.catalog import (
    GPU_MEMORY_UTIL,
    PREFILL_MFU,
    STEP_OVERHEAD_S,
    TP_EFFICIENCY,
    node_spec,
)
from fleetloop.sim.node import Req
from tests.sim.physics import Loop, batch


def test_node_spec_derivations() -> None:
    s = node_spec("llama-70b", "H100")
    assert s.gpus == 4  # 141 GB of weights need 4 x 80 GB at <= 75% share
    assert s.flops == pytest.approx(4 * 989e12 * PREFILL_MFU * TP_EFFICIENCY)
    kv = (4 * 80e9 * GPU_MEMORY_UTIL - 70.6e9 * 2) // 327_680
    assert s.kv_capacity_tokens == kv
    assert s.step_overhead_s == pytest.approx(STEP_OVERHEAD_S + 2 * 80 * 20e-6)
    assert node_spec("llama-8b", "L40S").gpus == 1
    assert node_spec("llama-70b", "MI300X").gpus == 1
    assert node_spec("llama-70b", "H200").gpus == 2


def test_prefill_time_is_compute_bound_formula() -> None:
    spec = node_spec("llama-8b", "H100")
    prompt = 4000
    loop, _ = batch(spec, 1, prompt, 1, max_batch_tokens=8192)
    m = spec.model
    flops = 2 * m.params * prompt + 2 * m.layers * m.hidden * (prompt * prompt / 2)
    expected = flops / spec.flops + STEP_OVERHEAD_S  # compute >> memory for a 4k-token prefill
    assert loop.rec.first[1] == pytest.approx(expected, rel=1e-9)


def test_chunked_prefill_respects_max_batch_tokens() -> None:
    spec = node_spec("llama-8b", "H100")
    one, _ = batch(spec, 1, 8000, 1, max_batch_tokens=8192)
    chunked, _ = batch(spec, 1, 8000, 1, max_batch_tokens=1024)
    # 8 chunks: each pays the weight read / step overhead, so TTFT grows.
    assert chunked.rec.first[1] > one.rec.first[1]
    assert chunked.node.stats.prompt_tokens == 8000


def test_decode_step_is_bandwidth_bound_formula() -> None:
    spec = node_spec("llama-8b", "H100")
    prompt, output = 100, 201
    loop, _ = batch(spec, 1, prompt, output)
    decode = loop.rec.finish[1] - loop.rec.first[1]
    m = spec.model
    # steps k = 0..199, context prompt + 1 + k
    expected = sum(
        (m.weight_bytes + m.kv_bytes_per_token * (prompt + 1 + k)) / spec.bytes_per_s + STEP_OVERHEAD_S
        for k in range(output - 1)
    )
    assert decode == pytest.approx(expected, rel=1e-9)


def test_batching_shares_the_weight_read() -> None:
    spec = node_spec("llama-8b", "H100")
    one, _ = batch(spec, 1, 200, 200)
    many, _ = batch(spec, 32, 200, 200)
    assert max(many.rec.finish.values()) < 3 * max(one.rec.finish.values())


def test_kv_capacity_forces_preemption_and_everything_still_finishes() -> None:
    spec = node_spec("llama-8b", "L40S")
    cap = spec.kv_capacity_tokens
    n = 12
    prompt = cap // n  # prompts alone fill the cache; decoding must preempt
    loop, _reqs = batch(spec, n, prompt, 2000)
    assert loop.node.stats.preemptions > 0
    assert len(loop.rec.finish) == n
    assert loop.node.kv_used == 0


def test_prompt_longer_than_kv_is_rejected() -> None:
    spec = node_spec("llama-8b", "L40S")
    loop, _ = batch(spec, 1, spec.kv_capacity_tokens + 10, 10)
    assert 1 in loop.rec.lost


def test_prefix_hit_skips_that_prefill() -> None:
    spec = node_spec("llama-70b", "H100")
    loop = Loop(spec)
    a = Req(1, 6000, 1, "x1", 5000)
    loop.node.submit(a, 0.0)
    loop.run_until()
    miss_ttft = loop.rec.first[1]
    t0 = loop.rec.finish[1]
    b = Req(2, 6000, 1, "x1", 5000)
    loop.node.submit(b, t0)
    loop.run_until()
    hit_ttft = loop.rec.first[2] - t0
    assert b.cached == 5000
    assert hit_ttft < miss_ttft / 3
    assert loop.node.hot_prefixes() == ("x1",)


def test_cold_node_waits_for_weights() -> None:
    spec = node_spec("llama-8b", "H100")
    loop = Loop(spec, warm=False)
    r = Req(1, 100, 10, None, 0)
    loop.node.submit(r, 0.0)
    loop.run_until()
    assert not loop.rec.first  # nothing runs on cold weights
    loop.node.set_weights_state("warm", 30.0)
    loop.run_until()
    assert loop.rec.first[1] > 30.0


def test_degrade_slows_and_crash_loses_in_flight() -> None:
    spec = node_spec("llama-8b", "H100")
    fast, _ = batch(spec, 4, 500, 300)
    slow_loop = Loop(spec)
    slow_loop.node.set_degrade(5.0, 0.0)
    for i in range(4):
        slow_loop.node.submit(Req(i + 1, 500, 300, None, 0), 0.0)
    slow_loop.run_until()
    assert max(slow_loop.rec.finish.values()) == pytest.approx(5.0 * max(fast.rec.finish.values()), rel=1e-6)

    loop = Loop(spec)
    for i in range(4):
        loop.node.submit(Req(i + 1, 500, 3000, None, 0), 0.0)
    loop.run_until(2.0)  # mid-decode
    assert loop.rec.first
    assert not loop.rec.finish
    loop.node.crash(2.0)
    assert sorted(loop.rec.lost) == [1, 2, 3, 4]
    assert not loop.node.alive
    assert loop.node.removed_at == 2.0
    loop.run_until()
    assert not loop.rec.finish


def test_cancel_stops_spending_and_reports_waste() -> None:
    spec = node_spec("llama-8b", "H100")
    loop = Loop(spec)
    r = Req(1, 500, 5000, None, 0)
    loop.node.submit(r, 0.0)
    loop.run_until(1.0)
    loop.node.cancel(r, 1.0)
    loop.run_until()
    assert not loop.rec.finish
    assert loop.node.kv_used == 0
    assert loop.node.idle
    assert r.reported_cost > 0
    assert loop.rec.waste >= 0


def test_busy_time_counts_every_iteration_so_utilization_reads_true() -> None:
    # A node that works without pause from t=0 to its last event is busy 100% of that time. (The
    # busy tail of each iteration used to be dropped when the iteration ended, so GPU utilization
    # read near 0 and an HPA on utilization could not scale.)
    loop = Loop(node_spec("llama-8b", "H100"))
    for i in range(16):
        loop.node.submit(Req(i + 1, 2000, 400, None, 0), 0.0)
    end = loop.run_until()
    assert end > 1.0
    stats = loop.node.take_stats(end)
    assert stats.busy_s == pytest.approx(end, rel=1e-6)
