"""Serving-engine runtime profiles: what the engine adds to the GPU's own time, per engine and release.

The node model (:mod:`fleetloop.perf.step`, which the simulator's nodes run) prices an iteration
from the GPU's FLOPs and bytes (:mod:`fleetloop.perf.catalog`). The engine decides what an
iteration holds and what it costs on top: how prefill shares a step with decode, how many
sequences and tokens a step may take, which batch sizes run as captured CUDA graphs, how long a
request spends outside the GPU loop (HTTP, tokenization, the hop to the engine core,
detokenization and streaming back), and the CPU work of every step. A :class:`RuntimeProfile`
holds those, one per engine and release family, each number with its source in
:attr:`RuntimeProfile.sources` (a file of the engine's public source at a named place, or a
published measurement). The CPU costs no source states as a number are fitted, on the
fitting half of the calibration rows only (:mod:`fleetloop.sim.calibrate`, ``--fit``), and say so.

Profiles (``engine`` / ``family``):

- ``vllm`` / ``v1``: vLLM with the V1 engine (0.8 on, the default). Chunked prefill is always on:
  decodes first, then prefill chunks fill the step's token budget. Budget and running-sequence cap
  by GPU (``EngineArgs.get_batch_defaults`` in vllm/engine/arg_utils.py: GPUs with >= 70 GiB
  that are not an A100 get 8192 tokens and 1024 sequences for ``vllm serve``, 16384 tokens for the
  offline ``LLM`` class; others 2048 / 256, and 8192 for ``LLM``; the A100 exception is vLLM PR
  #17885). CUDA graphs for decode batches ``[1, 2, 4] + range(8, 256, 8) + range(256, max + 1,
  16)`` with max = min(2 x max_num_seqs, 512) (``CompilationConfig.max_cudagraph_capture_size``,
  vllm/config/compilation.py). KV cache: ``gpu_memory_utilization`` 0.9 of the GPU's memory, less
  the weights.
- ``vllm`` / ``0.6``: vLLM 0.6 (V0 engine) as its 0.6 performance posts and the SGLang comparison
  ran it, with ``--num-scheduler-steps 10`` (sgl-project/sglang benchmark/benchmark_vllm_060/
  README.md, "Notes"; blog.vllm.ai/2024/09/05/perf-update.html, "Serving engines"): prefill runs in
  steps of its own (chunked prefill is off below 32K context in V0, so a prompt enters a prefill
  step whole or waits: ``Scheduler._schedule_prefills``, vllm/core/scheduler.py), decode runs in
  blocks of 10 steps that a new request waits out, 256 sequences (V0's ``max_num_seqs``), graphs up
  to 256.
- ``sglang`` / ``0.3``: SGLang 0.3 and later. Prefill batches run on their own (mixed chunks are
  off by default), up to ``chunked_prefill_size`` 8192 tokens; ``mem_fraction_static`` 0.88 of the
  GPU's memory at TP1 and 0.85 at TP4 and up holds weights and KV (benchmark_vllm_060/README.md,
  "Notes"); CUDA graphs ``[1, 2, 4] + range(8, max + 1, 8)`` with max 160, 256 with more than 80
  GiB free (``_determine_cuda_graph_bs``, sgl-project/mini-sglang python/minisgl/engine/graph.py,
  the same rule as SGLang's ``cuda_graph_max_bs``).
- ``trtllm`` / ``1.0``: TensorRT-LLM 1.0, PyTorch backend. In-flight batching (context and
  generation in one step), ``max_batch_size`` 2048 and ``max_num_tokens`` 8192 (the LLM API
  defaults), the ``GUARANTEED_NO_EVICT`` scheduler (a request starts only when KV for its whole
  output is free; nothing is preempted), chunked prefill off (``enable_chunked_prefill`` False,
  tensorrt_llm/llmapi/llm_args.py: a context request enters a step whole, its prompt counted
  against ``max_num_tokens`` beside the generation tokens, or waits at the head of the queue for a
  step with room), KV from ``kv_cache_free_gpu_mem_fraction`` 0.9 of the memory left after the
  weights; CUDA graphs padded to 1, 2, 4, ..., 8192 as the perf overview's
  ``llm_options.yml`` sets them (NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md at
  00f37686aa854010d68bcbd0f4ab000221541ca6, "Running the Benchmark").

Per-request cost. What a request spends outside the GPU loop (``api_s``) delays its first token and
its end by a constant, so a node sees it as a later arrival: the fleet hands a request to the node
``api_s`` after the client sent it. Offline harnesses (``trtllm-bench``, vLLM's ``LLM`` class) feed
token ids straight to the engine and pay none of it. What the engine spends per request inside the
loop (``admit_s``: scheduling, KV block allocation) is paid on the step that admits it. Before the
runtime profiles the model charged 6 ms per admitted request inside the loop; that cost 40-50% of
the throughput of short requests (128 in / 128 out admits tens of requests a step), while the
engines run tokenization and detokenization in processes of their own (vLLM's API server talks to
the engine core over ZMQ since 0.6: perf-update post, "Separating API server and inference engine
into different processes"; SGLang's tokenizer and detokenizer managers are separate processes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Engine = Literal["vllm", "sglang", "trtllm"]
ENGINES: tuple[str, ...] = ("vllm", "sglang", "trtllm")
DEFAULT_ENGINE: Engine = "vllm"

# vLLM's big-GPU defaults apply to GPUs with at least 70 GiB that are not an A100 (GiB = 2**30).
_BIG_GPU_BYTES = 70 * 2**30

_FITTED = "fitted on the calibration's fitting half (python -m fleetloop.sim.calibrate --fit)"


# TensorRT-LLM's perf overview pads decode batches to these CUDA graphs (llm_options.yml).
_TRT_GRAPHS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192)


def _vllm_v1_graphs(max_num_seqs: int) -> tuple[int, ...]:
    top = min(2 * max_num_seqs, 512)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
    return tuple(s for s in sizes if s <= top)


@dataclass(frozen=True, slots=True)
class RuntimeProfile:
    """One engine release family's behaviour and CPU costs (see the module docstring)."""

    engine: str
    family: str
    api_s: float  # per request, outside the GPU loop (served requests only)
    admit_s: float  # per request admitted, on that step
    step_s: float  # per step (scheduling, input preparation, launch, sampling's fixed part)
    seq_s: float  # per running sequence per step
    mixed: bool  # prefill chunks share a step with decodes (else prefill steps of their own)
    decode_block: int  # decode steps per scheduling round (V0 multi-step); a new request waits
    big_batch_tokens: int  # step token budget, served, on a GPU with >= 70 GiB (not an A100)
    small_batch_tokens: int  # the same on other GPUs
    offline_batch_tokens: tuple[int, int]  # (big, small) for an offline harness
    big_max_seqs: int
    small_max_seqs: int
    graph_max: tuple[int, int]  # (big, small) largest captured decode batch
    kv_share: tuple[float, float]  # (TP1, TP>1) share of memory for weights + KV, or of the free rest
    kv_of_free: bool  # True: the share is of the memory left after the weights (TensorRT-LLM)
    no_evict: bool  # a request is admitted only with KV for its whole output (no preemption)
    chunked_prefill: bool  # a prompt may be split over steps (else it enters a step whole)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.engine} {self.family}"

    @staticmethod
    def big_gpu(gpu_name: str, hbm_bytes_per_gpu: float) -> bool:
        return hbm_bytes_per_gpu >= _BIG_GPU_BYTES and "A100" not in gpu_name.upper()

    def max_batch_tokens(self, gpu_name: str, hbm_bytes_per_gpu: float, *, offline: bool = False) -> int:
        big = self.big_gpu(gpu_name, hbm_bytes_per_gpu)
        if offline:
            return self.offline_batch_tokens[0 if big else 1]
        return self.big_batch_tokens if big else self.small_batch_tokens

    def max_num_seqs(self, gpu_name: str, hbm_bytes_per_gpu: float) -> int:
        return self.big_max_seqs if self.big_gpu(gpu_name, hbm_bytes_per_gpu) else self.small_max_seqs

    def graph_sizes(self, gpu_name: str, hbm_bytes_per_gpu: float) -> tuple[int, ...]:
        """Decode batch sizes captured as CUDA graphs (a batch pads up to the next one; larger run
        eagerly, unpadded)."""
        big = self.big_gpu(gpu_name, hbm_bytes_per_gpu)
        top = self.graph_max[0 if big else 1]
        if self.engine == "vllm" and self.family == "v1":
            return _vllm_v1_graphs(self.max_num_seqs(gpu_name, hbm_bytes_per_gpu))
        if self.engine == "vllm":
            return (1, 2, 4, *range(8, top + 1, 8))
        if self.engine == "sglang":
            return (1, 2, 4, *range(8, top + 1, 8))
        return tuple(s for s in _TRT_GRAPHS if s <= top)

    def runs_eager(self, tokens: float, *, prefill: bool, graph_top: int) -> bool:
        """Whether an iteration of ``tokens`` tokens runs eagerly (no captured CUDA graph), its
        kernels launched one by one (``graph_top``: the largest captured decode batch). A decode
        batch past the largest graph does on every engine. A step that carries prefill tokens does on
        the engines that capture decode batches only (vLLM V0: a graph runs decode-only batches,
        vllm 0.6 worker/model_runner.py; SGLang 0.3: ``ModelRunner.forward`` replays its
        ``CudaGraphRunner`` for decode batches, python/sglang/srt/model_executor/model_runner.py;
        TensorRT-LLM's PyTorch backend: ``cuda_graph_config`` captures generation-only iterations,
        context and mixed ones need the piecewise graphs of ``torch_compile_config``, off by default,
        nvidia.github.io/TensorRT-LLM features/torch_compile_and_piecewise_cuda_graph.html), and on
        vLLM V1 only past its largest capture size: V1's
        piecewise CUDA graphs cover any batch of up to that many tokens, prefill and mixed ones
        included, attention excepted (vllm-project/vllm docs/design/cuda_graphs.md, "Motivation")."""
        if tokens > graph_top:
            return True
        if not prefill:
            return False
        return not (self.engine == "vllm" and self.family == "v1")

    def kv_budget_bytes(self, hbm_bytes: float, weight_bytes: float, gpus: int) -> float:
        """Bytes for the KV cache on a node of ``gpus`` GPUs with ``hbm_bytes`` in all."""
        share = self.kv_share[0 if gpus <= 1 else 1]
        if self.kv_of_free:
            return share * (hbm_bytes - weight_bytes)
        return share * hbm_bytes - weight_bytes


# Fitted CPU costs (see ``_FITTED``); the fit writes these lines (calibrate --fit prints them).
FIT: dict[str, float] = {
    "vllm v1 api_s": 1e-05,
    "vllm v1 step_s": 0.0008025,
    "vllm 0.6 api_s": 0.004311,
    "vllm 0.6 step_s": 0.0015,
    "sglang 0.3 api_s": 6.921e-05,
    "sglang 0.3 step_s": 0.001458,
    "trtllm 1.0 api_s": 0.001602,
    "trtllm 1.0 step_s": 2.567e-05,
    "admit_s": 0.0008498,
}

SEQ_S = 15e-6  # per running sequence per step; vLLM perf-update post (CPU-side input preparation)

_VLLM_SRC = {
    "max_batch_tokens": "vllm/engine/arg_utils.py EngineArgs.get_batch_defaults (A100 exception: PR #17885)",
    "max_num_seqs": "vllm/engine/arg_utils.py EngineArgs.get_batch_defaults",
    "graphs": "vllm/config/compilation.py CompilationConfig.max_cudagraph_capture_size",
    "kv": "vllm gpu_memory_utilization default 0.9 (vllm/config/cache.py CacheConfig)",
    "mixed": "vllm/engine/arg_utils.py _set_default_args_v1: 'V1 always uses chunked prefills'",
    "chunked_prefill": "vllm/engine/arg_utils.py _set_default_args_v1: 'V1 always uses chunked prefills'",
    "seq_s": "blog.vllm.ai/2024/09/05/perf-update.html (CPU input preparation scales with the batch)",
    "api_s": _FITTED,
    "step_s": _FITTED,
    "admit_s": _FITTED,
}


# The profiles, one per engine release family: each number's source is in its ``sources`` (see the
# module docstring); the CPU costs no source states come from ``FIT``.
_VLLM_V1 = RuntimeProfile(
    "vllm",
    "v1",
    api_s=FIT["vllm v1 api_s"],
    admit_s=FIT["admit_s"],
    step_s=FIT["vllm v1 step_s"],
    seq_s=SEQ_S,
    mixed=True,
    decode_block=1,
    big_batch_tokens=8192,
    small_batch_tokens=2048,
    offline_batch_tokens=(16384, 8192),
    big_max_seqs=1024,
    small_max_seqs=256,
    graph_max=(512, 512),
    kv_share=(0.9, 0.9),
    kv_of_free=False,
    no_evict=False,
    chunked_prefill=True,
    sources=dict(_VLLM_SRC),
)

_VLLM_06 = RuntimeProfile(
    "vllm",
    "0.6",
    api_s=FIT["vllm 0.6 api_s"],
    admit_s=FIT["admit_s"],
    step_s=FIT["vllm 0.6 step_s"],
    seq_s=SEQ_S,
    mixed=False,
    decode_block=10,
    big_batch_tokens=4096,
    small_batch_tokens=4096,
    offline_batch_tokens=(8192, 8192),
    big_max_seqs=256,
    small_max_seqs=256,
    graph_max=(256, 256),
    kv_share=(0.9, 0.9),
    kv_of_free=False,
    no_evict=False,
    chunked_prefill=False,
    sources={
        **_VLLM_SRC,
        "decode_block": "--num-scheduler-steps 10 (sgl-project/sglang benchmark/benchmark_vllm_060)",
        "mixed": "V0 enables chunked prefill only past 32K context (vllm 0.6 engine/arg_utils.py)",
        "chunked_prefill": "V0 without chunked prefill: Scheduler._schedule_prefills takes a prompt whole "
        "within the token budget or leaves it waiting (vllm 0.6 core/scheduler.py)",
        "max_batch_tokens": "V0 without chunked prefill: max(max_model_len 4096, 2048), as benchmarked",
        "max_num_seqs": "V0 default max_num_seqs 256 (vllm 0.6 engine/arg_utils.py)",
        "graphs": "V0 _BATCH_SIZES_TO_CAPTURE [1, 2, 4] + 8..256 (vllm 0.6 worker/model_runner.py)",
    },
)

_SGLANG_03 = RuntimeProfile(
    "sglang",
    "0.3",
    api_s=FIT["sglang 0.3 api_s"],
    admit_s=FIT["admit_s"],
    step_s=FIT["sglang 0.3 step_s"],
    seq_s=SEQ_S,
    mixed=False,
    decode_block=1,
    big_batch_tokens=8192,
    small_batch_tokens=8192,
    offline_batch_tokens=(8192, 8192),
    big_max_seqs=4096,
    small_max_seqs=4096,
    graph_max=(160, 160),
    kv_share=(0.88, 0.85),
    kv_of_free=False,
    no_evict=False,
    chunked_prefill=True,
    sources={
        "max_batch_tokens": "SGLang server_args chunked_prefill_size 8192",
        "mixed": "SGLang server_args enable_mixed_chunk off by default",
        "chunked_prefill": "SGLang server_args chunked_prefill_size 8192: a longer prompt is split",
        "max_num_seqs": "SGLang max_running_requests: bounded by the KV pool (4096 here)",
        "graphs": "sgl-project/mini-sglang python/minisgl/engine/graph.py _determine_cuda_graph_bs",
        "kv": "mem_fraction_static 0.88 TP1, 0.85 TP4: sglang benchmark/benchmark_vllm_060/README.md",
        "seq_s": _VLLM_SRC["seq_s"],
        "api_s": _FITTED,
        "step_s": _FITTED,
        "admit_s": _FITTED,
    },
)

_TRTLLM_10 = RuntimeProfile(
    "trtllm",
    "1.0",
    api_s=FIT["trtllm 1.0 api_s"],
    admit_s=FIT["admit_s"],
    step_s=FIT["trtllm 1.0 step_s"],
    seq_s=0.0,
    mixed=True,
    decode_block=1,
    big_batch_tokens=8192,
    small_batch_tokens=8192,
    offline_batch_tokens=(8192, 8192),
    big_max_seqs=2048,
    small_max_seqs=2048,
    graph_max=(8192, 8192),
    kv_share=(0.9, 0.9),
    kv_of_free=True,
    no_evict=True,
    chunked_prefill=False,
    sources={
        "max_batch_tokens": "TensorRT-LLM LLM API default max_num_tokens 8192 (llmapi/llm_args.py)",
        "max_num_seqs": "TensorRT-LLM LLM API default max_batch_size 2048 (llmapi/llm_args.py)",
        "graphs": "NVIDIA/TensorRT-LLM perf-overview.md @00f37686, llm_options.yml cuda_graph_config",
        "kv": "kv_cache_free_gpu_mem_fraction default 0.9 (perf-overview.md @00f37686)",
        "no_evict": "CapacitySchedulerPolicy GUARANTEED_NO_EVICT, the default",
        "mixed": "in-flight batching: context and generation requests in one step (docs, overview)",
        "chunked_prefill": "LLM API enable_chunked_prefill default False (tensorrt_llm/llmapi/llm_args.py): "
        "a context request enters a step whole, its prompt counted against max_num_tokens",
        "seq_s": "C++ batch manager: per-sequence Python work of vLLM/SGLang does not apply (0)",
        "api_s": _FITTED,
        "step_s": _FITTED,
        "admit_s": _FITTED,
    },
)

PROFILES: dict[tuple[str, str], RuntimeProfile] = {
    (p.engine, p.family): p for p in (_VLLM_V1, _VLLM_06, _SGLANG_03, _TRTLLM_10)
}
DEFAULT_FAMILY: dict[str, str] = {"vllm": "v1", "sglang": "0.3", "trtllm": "1.0"}
FAMILIES: dict[str, tuple[str, ...]] = {
    e: tuple(sorted(f for (eng, f) in PROFILES if eng == e)) for e in ENGINES
}


def check_family(engine: str, family: str | None) -> None:
    """Raise ValueError naming the known releases when ``engine`` has no profile ``family`` (None:
    the engine's current release, always known): what a scenario's pool and a policy's pool spec
    both check."""
    known = FAMILIES[engine]
    if family is not None and family not in known:
        raise ValueError(f"engine_version: {engine} has no profile {family!r} (known: {', '.join(known)})")


def profile(engine: str = DEFAULT_ENGINE, family: str | None = None) -> RuntimeProfile:
    """The profile of ``engine`` at ``family`` (its default family when None). KeyError if unknown."""
    fam = family if family is not None else DEFAULT_FAMILY[engine]
    return PROFILES[(engine, fam)]


DEFAULT_PROFILE = profile()
