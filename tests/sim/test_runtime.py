"""Runtime profiles: each engine's values as its cited source states them, and what they do to a node."""

from __future__ import annotations

import pytest
from fleetloop.perf import engines as runtime
from fleetloop.perf.catalog import node_spec
from fleetloop.perf.engines import PROFILES, profile
from fleetloop.perf.step import padded_batch
from fleetloop.sim.calibrate import Row, simulate
from fleetloop.sim.node import Node, Req
from fleetloop.sim.scenario import ScenarioError, parse_scenario
from fleetloop.whatif.derive import engine_arg
from tests.sim.physics import Loop

GB = 1e9


def test_vllm_v1_budgets_follow_get_batch_defaults() -> None:
    # vllm/engine/arg_utils.py EngineArgs.get_batch_defaults: >= 70 GiB and not an A100 -> 8192
    # tokens and 1024 sequences for `vllm serve` (16384 for the LLM class); else 2048 / 256 (8192).
    v1 = profile("vllm", "v1")
    assert v1.max_batch_tokens("H100", 80 * GB) == 8192
    assert v1.max_num_seqs("H100", 80 * GB) == 1024
    assert v1.max_batch_tokens("H100", 80 * GB, offline=True) == 16384
    assert v1.max_batch_tokens("A100", 80 * GB) == 2048  # the A100 exception (PR #17885)
    assert v1.max_num_seqs("A100", 80 * GB) == 256
    assert v1.max_batch_tokens("L40S", 48 * GB) == 2048  # 48 GB < 70 GiB
    assert v1.max_batch_tokens("A100", 80 * GB, offline=True) == 8192
    assert v1.mixed  # "V1 always uses chunked prefills"


def test_cuda_graph_sizes_as_each_engine_captures_them() -> None:
    # vLLM V1: [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16), max = min(2 x max_num_seqs, 512)
    v1 = profile("vllm", "v1").graph_sizes("H100", 80 * GB)
    assert v1[:4] == (1, 2, 4, 8)
    assert v1[-1] == 512
    assert 248 in v1
    assert 272 in v1
    assert 264 not in v1
    assert profile("vllm", "v1").graph_sizes("A100", 80 * GB)[-1] == 512  # 256 seqs x 2
    # SGLang: [1, 2, 4] + multiples of 8 up to cuda_graph_max_bs 160
    sg = profile("sglang").graph_sizes("H100", 80 * GB)
    assert sg[-1] == 160
    assert sg[:4] == (1, 2, 4, 8)
    # TensorRT-LLM perf overview's llm_options.yml: 1, 2, 4, ..., 256, 384, 512, 1024, ..., 8192
    trt = profile("trtllm").graph_sizes("H100", 80 * GB)
    assert trt == (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192)


def test_kv_memory_share_per_engine() -> None:
    hbm, weights = 80 * GB, 16 * GB
    assert profile("vllm").kv_budget_bytes(hbm, weights, 1) == pytest.approx(0.9 * hbm - weights)
    # SGLang mem_fraction_static 0.88 at TP1, 0.85 at TP4 (benchmark_vllm_060/README.md, "Notes")
    assert profile("sglang").kv_budget_bytes(hbm, weights, 1) == pytest.approx(0.88 * hbm - weights)
    assert profile("sglang").kv_budget_bytes(4 * hbm, weights, 4) == pytest.approx(0.85 * 4 * hbm - weights)
    # TensorRT-LLM: kv_cache_free_gpu_mem_fraction 0.9 of what the weights leave
    assert profile("trtllm").kv_budget_bytes(hbm, weights, 1) == pytest.approx(0.9 * (hbm - weights))


def test_every_behaviour_names_its_source_and_fitted_costs_say_so() -> None:
    for p in PROFILES.values():
        for key in (
            "max_batch_tokens",
            "max_num_seqs",
            "graphs",
            "kv",
            "mixed",
            "chunked_prefill",
            "api_s",
            "step_s",
        ):
            assert key in p.sources, (p.name, key)
        for key in ("api_s", "step_s", "admit_s"):
            assert "fitting half" in p.sources[key], (p.name, key)
        assert p.api_s == runtime.FIT[f"{p.name} api_s"]
        assert p.step_s == runtime.FIT[f"{p.name} step_s"]
    assert profile("vllm", "0.6").decode_block == 10  # --num-scheduler-steps 10, as benchmarked
    assert profile("trtllm").no_evict
    assert not profile("vllm").no_evict


def _node(engine: str, family: str | None = None) -> Loop:
    loop = Loop(node_spec("llama-8b", "H100"))
    loop.node = Node(
        "p/0",
        "p",
        node_spec("llama-8b", "H100"),
        loop.rec,
        loop._schedule,
        now=0.0,
        warm=True,
        runtime=profile(engine, family),
    )
    return loop


def test_prefill_first_engines_hold_decoders_during_a_prefill_step() -> None:
    for engine, mixed in (("sglang", False), ("vllm", True)):
        loop = _node(engine)
        loop.node.submit(Req(1, 100, 400, None, 0), 0.0)
        loop.run_until(0.2)  # request 1 is decoding
        assert loop.node.decoding
        loop.node.submit(Req(2, 4000, 10, None, 0), 0.2)
        cut = loop.node.run  # the decode run, cut at the step after the arrival
        assert cut is not None
        loop.run_until(cut.end)
        run = loop.node.run  # the step that starts request 2's prefill
        assert run is not None
        assert run.kind == "mixed"
        # SGLang and vLLM V0 run the prefill on its own; vLLM V1 adds the decoder's token to it
        assert run.batch == (1 if mixed else 0), engine


def test_engines_without_chunked_prefill_take_a_prompt_whole_or_leave_it_waiting() -> None:
    """TensorRT-LLM (LLM API enable_chunked_prefill off by default) and vLLM 0.6 (V0 chunks only
    past 32K context) put a prompt into a step whole, within the token budget, or leave it at the
    head of the queue; vLLM V1 and SGLang split it to fill the budget."""
    assert not profile("trtllm").chunked_prefill
    assert not profile("vllm", "0.6").chunked_prefill
    assert profile("vllm", "v1").chunked_prefill
    assert profile("sglang").chunked_prefill
    for engine, family, chunked in (("trtllm", None, False), ("vllm", "0.6", False), ("vllm", "v1", True)):
        loop = _node(engine, family)
        node = loop.node
        budget = node.max_batch_tokens
        prompt = budget * 5 // 8  # two do not fit one step
        node.submit(Req(9, 10, 50, None, 0), 0.0)
        loop.run_until(0.05)  # request 9 is decoding: the next two arrive while a run is on
        node.submit(Req(1, prompt, 10, None, 0), 0.05)
        node.submit(Req(2, prompt, 10, None, 0), 0.05)
        cut = node.run
        assert cut is not None
        loop.run_until(cut.end)
        run = node.run  # the step that takes the waiting prompts
        assert run is not None
        sizes = [c for _, c in run.chunks]
        if chunked:  # the second prompt's first chunk fills the rest of the budget (beside the decoder)
            assert sizes == [prompt, budget - run.batch - prompt], engine
        else:  # the second waits for the next step, then enters it whole
            assert sizes == [prompt], engine
            assert [r.rid for r in node.waiting] == [2]
            loop.run_until(run.end)
            assert node.run is not None
            assert [(r.rid, c) for r, c in node.run.chunks] == [(2, prompt)], engine
        loop.run_until()
        assert set(loop.rec.finish) == {1, 2, 9}


def test_a_prompt_past_the_whole_budget_still_runs_on_an_engine_that_does_not_chunk() -> None:
    """A prompt longer than the step budget could never enter a step whole: it runs chunked, with no
    other prompt beside it (a deployment serving such prompts enables chunking; trtllm-bench raises
    max_num_tokens instead), so it is neither lost nor left waiting for ever."""
    loop = _node("trtllm")
    node = loop.node
    long = node.max_batch_tokens * 2 + 100
    node.submit(Req(1, long, 10, None, 0), 0.0)
    node.submit(Req(2, 100, 10, None, 0), 0.0)
    run = node.run
    assert run is not None
    assert [(r.rid, c) for r, c in run.chunks] == [(1, node.max_batch_tokens)]
    loop.run_until()
    assert set(loop.rec.finish) == {1, 2}
    assert not loop.rec.lost
    assert loop.rec.first[2] >= loop.rec.first[1]  # FCFS: the short prompt waited behind it


def test_multi_step_blocks_make_a_new_request_wait_for_the_block() -> None:
    def ttft(family: str) -> float:
        loop = _node("vllm", family)
        loop.node.submit(Req(1, 100, 400, None, 0), 0.0)
        loop.run_until(0.02)  # the first request's prefill (its own step) is done
        at = loop.rec.first[1] + 0.0175  # two to three 7 ms steps into its first decode block
        loop.run_until(at)
        loop.node.submit(Req(2, 100, 10, None, 0), at)
        loop.run_until()
        return loop.rec.first[2] - at

    assert ttft("0.6") > ttft("v1") + 0.015  # several steps of a 10-step block, not one step


def test_decode_batch_pads_to_the_next_cuda_graph() -> None:
    graphs = _node("vllm", "v1").node._graphs
    assert padded_batch(graphs, 5) == 8
    assert padded_batch(graphs, 250) == 256
    assert padded_batch(graphs, 257) == 272
    assert padded_batch(graphs, 600) == 600  # past the largest graph: eager, unpadded


def test_served_requests_pay_the_engines_per_request_cost_outside_the_gpu_loop() -> None:
    def row(served: bool) -> Row:
        return Row(
            "t", "fit", "t", "t", "sglang", "0.3", served, "llama-8b", "H100", 1, "bf16", 200, 50,
            "concurrency", 1, 0.0, "ttft_ms", 1.0,
        )  # fmt: skip

    served, offline = simulate(row(True)), simulate(row(False))
    assert served - offline == pytest.approx(profile("sglang").api_s * 1000.0, rel=1e-6)


def test_short_requests_do_not_pay_a_per_request_cost_on_the_gpu() -> None:
    # 128 in / 128 out at max load admits dozens of requests a step: the 6 ms per admitted request
    # the model charged inside the GPU loop before the profiles held 8B at ~13k tokens/s on an
    # H100, half of TensorRT-LLM's published 28k (perf-overview.md, Llama 3.1 8B, 128/128).
    r = Row(
        "t", "fit", "t", "t", "trtllm", "1.0", False, "llama-8b", "H100", 1, "fp8", 128, 128,
        "offline", 3000, 0.0, "out_tok_s", 28312.0, 0.95,
    )  # fmt: skip
    assert simulate(r) > 0.8 * 28312


def test_scenario_pool_names_its_engine() -> None:
    base = {
        "name": "x",
        "duration_s": 10,
        "slo": {"ttft_ms": 1000, "tbt_ms": 100},
        "tenants": [{"id": "t", "priority": 0}],
        "workload": [
            {
                "kind": "chatbot",
                "tenant": "t",
                "rate_per_s": 1,
                "calls": [1, 1],
                "prompt_tokens": {"median": 100, "max": 200},
                "output_tokens": {"median": 100, "max": 200},
                "models": ["llama-8b"],
                "deadline_s": 30,
                "client": {"timeout_s": 10},
            }
        ],
    }
    pool = {"id": "p", "model": "llama-8b", "gpu": "H100", "nodes": 1}
    assert parse_scenario({**base, "pools": [pool]}).pools[0].runtime == profile("vllm", "v1")
    s = parse_scenario({**base, "pools": [{**pool, "engine": "sglang"}]})
    assert s.pools[0].runtime.engine == "sglang"
    old = parse_scenario({**base, "pools": [{**pool, "engine": "vllm", "engine_version": "0.6"}]})
    assert old.pools[0].runtime.decode_block == 10
    with pytest.raises(ScenarioError, match=r"pools\[0\].*trtllm has no profile '0.9'") as exc:
        parse_scenario({**base, "pools": [{**pool, "engine": "trtllm", "engine_version": "0.9"}]}, "s.yaml")
    assert "\n" not in str(exc.value)
    with pytest.raises(ScenarioError, match=r"pools\[0\]\.engine"):
        parse_scenario({**base, "pools": [{**pool, "engine": "tgi"}]}, "s.yaml")


def test_whatif_engine_argument() -> None:
    assert engine_arg("sglang") == ("*", ("sglang", None))
    assert engine_arg("big=vllm:0.6") == ("big", ("vllm", "0.6"))
    for bad, words in (("tgi", "unknown engine"), ("vllm:0.1", "no profile"), ("=vllm", "empty pool")):
        with pytest.raises(ValueError, match=words):
            engine_arg(bad)


def test_the_fleet_hands_a_request_to_its_engine_after_the_engines_per_request_cost() -> None:
    """A pool's engine profile reaches its nodes: every first token a client sees comes at least
    the engine's per-request cost after the send, and nothing is left in flight at the end."""
    from fleetloop.sim.fleet import FleetSim
    from fleetloop.sim.runner import EPOCH_MS
    from tests.sim.conftest import small_scenario_dict

    doc = small_scenario_dict()
    doc["faults"] = []
    for p in doc["pools"]:
        p.update(engine="vllm", engine_version="0.6")
    sc = parse_scenario(doc)
    api_ms = profile("vllm", "0.6").api_s * 1000.0
    assert api_ms > 1.0
    sim = FleetSim(sc, 1, start_ms=EPOCH_MS)
    assert all(n.runtime.name == "vllm 0.6" for n in sim.nodes.values())
    assert {n.max_num_seqs for n in sim.nodes.values()} == {256}
    t = EPOCH_MS
    ttfts: list[float] = []
    while not sim.done and t < EPOCH_MS + 600_000:
        t += 1000
        ttfts.extend(o.ttft_ms for o in sim.advance_to(t).outcomes if o.ttft_ms is not None)
    assert ttfts
    assert min(ttfts) >= api_ms - 1e-6
    assert all(n.inbound == 0 for n in sim.nodes.values())
