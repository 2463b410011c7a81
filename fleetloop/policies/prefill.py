"""What a prompt's prefill costs on a node by itself: the part of TTFT no amount of capacity removes.

A prefill of ``n`` uncached prompt tokens is one forward pass over them, compute bound (a large
GEMM); its floor is its FLOPs over the node's achieved FLOP/s::

    flops(n)  = 2 * params * n                 (weights: one multiply-add per parameter per token)
              + 2 * layers * hidden * n**2     (causal attention: QK^T and AV over the half-triangle)
    seconds   = flops(n) / (gpu_count * peak_bf16_flops * efficiency)

A queue in front of it, or a batch it shares, only adds to that. Adding nodes shortens the queue,
not the pass: a 30k-token llama-70b prompt takes ~2.7 s on four H100s at half of peak, idle or not.

Inputs: the model name and GPU type a node reports, its ``gpu_count``, and the prompt size.
Data: :mod:`fleetloop.perf.catalog` (public datasheets and model cards, each with its source),
the one copy. Peak dense BF16 tensor FLOP/s per GPU: A100 312e12, H100 989e12, H200 989e12, L40S
362e12, MI300X 1307.4e12; Qwen2.5 7B: 7.62e9 parameters, 28 layers, hidden 3584; Llama 3.1 8B:
8.03e9, 32 layers, hidden 4096; Llama 3.1 70B: 70.6e9, 80 layers, hidden 8192; Llama 3.1 405B:
405.9e9, 126 layers, hidden 16384 (an 8k-token prompt: ~1.7 s on eight H200s). ``efficiency`` 0.5 by
default: serving engines reach about half of dense peak in prefill (attention, norms and sampling
are not GEMMs); a lower value predicts longer prefills and so treats more latency as unfixable.

The longest prompt a node prefills within a time (:func:`prompt_tokens_within`, for a TTFT SLO) is
the positive root of ``flops(n) = ms x F / 1000``, rounded down.

The longest prompt a node can take (:func:`max_prompt_tokens`): a prompt's KV must fit the node's
KV cache whole before its first token, and the cache is what HBM holds beside the weights::

    kv_tokens = (gpu_count * hbm_bytes * memory_util - 2 * params) / kv_bytes_per_token

(BF16 weights and KV; ``memory_util`` 0.9 is vLLM's default ``gpu_memory_utilization``;
``kv_bytes_per_token = 2 * layers * kv_heads * head_dim * 2``). HBM per GPU (datasheets, decimal
GB): A100 80, H100 80, H200 141, L40S 48, MI300X 192; KV bytes per token: Llama 3.1 8B 131,072
(32 layers, 8 KV heads of 128), 70B 327,680 (80 layers, 8 KV heads of 128). llama-70b on one
MI300X holds ~96k tokens: a 100k-token prompt fails on every node of such a pool, whatever its load.

Failure mode: an unknown GPU or model gives no prediction (``None``): the caller must then treat
all latency as fixable (today's behaviour), never guess (a model missing from the data read a
405B pool's long prefills as queueing and doubled it); with no KV figure a pool is taken to fit
every prompt. FP8 weights or KV cache, another ``gpu_memory_utilization`` or a ``max_model_len``
set below the cache change what a node holds: the prediction is then off (FP8 holds about twice
the tokens, so such a pool is under-rated and only loses the prompts another pool also takes). A
prediction from the pool's *mean* prompt overstates the median call's prefill when prompts are
heavy-tailed (the mean of a lognormal sits ``exp(sigma^2 / 2)`` above its median), which reads a
little queueing as compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetloop.perf.catalog import GPUS, MODELS
from fleetloop.perf.serving import Mix
from fleetloop.policies.physics import default_shape, median_step

# The data is the shared catalog's (fleetloop.perf.catalog, each number with its source), so every
# model and GPU it lists has a prediction here: a model missing from a copy of it read all of its
# prompts' compute time as queueing (a 405B pool of long prompts grew for latency no node removes).
PEAK_BF16_FLOPS: dict[str, float] = {name: g.bf16_flops for name, g in GPUS.items()}
HBM_BYTES: dict[str, float] = {name: g.hbm_gib * 1e9 for name, g in GPUS.items()}


@dataclass(frozen=True, slots=True)
class ModelShape:
    params: float
    layers: int
    hidden: int
    kv_bytes_per_token: int  # BF16 K and V over every layer


MODEL_SHAPES: dict[str, ModelShape] = {
    name: ModelShape(m.params, m.layers, m.hidden, m.kv_bytes_per_token) for name, m in MODELS.items()
}
DEFAULT_EFFICIENCY = 0.5
MEMORY_UTIL = 0.9  # vLLM's default gpu_memory_utilization


def prefill_ms(
    model: str, gpu_type: str, gpu_count: int, prompt_tokens: float, efficiency: float = DEFAULT_EFFICIENCY
) -> float | None:
    """Milliseconds one node needs to prefill ``prompt_tokens`` on its own; None when unknown."""
    shape = MODEL_SHAPES.get(model)
    peak = PEAK_BF16_FLOPS.get(gpu_type)
    if shape is None or peak is None or gpu_count < 1 or efficiency <= 0:
        return None
    return _prefill_ms(shape, peak, gpu_count, max(0.0, prompt_tokens), efficiency)


def _prefill_ms(shape: ModelShape, peak: float, gpu_count: int, n: float, efficiency: float) -> float:
    flops = 2.0 * shape.params * n + 2.0 * shape.layers * shape.hidden * n * n
    return 1000.0 * flops / (gpu_count * peak * efficiency)


def prompt_tokens_within(
    model: str, gpu_type: str, gpu_count: int, ms: float, efficiency: float = DEFAULT_EFFICIENCY
) -> int | None:
    """The longest prompt one node prefills on its own within ``ms`` milliseconds (the inverse of
    :func:`prefill_ms`: the positive root of ``2 L d n^2 + 2 P n = ms x F / 1000``, rounded down);
    None when the model or GPU is unknown."""
    shape = MODEL_SHAPES.get(model)
    peak = PEAK_BF16_FLOPS.get(gpu_type)
    if shape is None or peak is None or gpu_count < 1 or efficiency <= 0 or not ms > 0:
        return None
    budget = min(ms, 1e9) * gpu_count * peak * efficiency / 1000.0  # FLOPs; 1e9 ms bounds the root
    a, b = 2.0 * shape.layers * shape.hidden, 2.0 * shape.params
    n = int(2.0 * budget / (b + math.sqrt(b * b + 4.0 * a * budget)))  # the stable form of the root
    while n > 0 and _prefill_ms(shape, peak, gpu_count, n, efficiency) > ms:  # rounding
        n -= 1
    return n


def max_prompt_tokens(model: str, gpu_type: str, gpu_count: int) -> int | None:
    """The most tokens one node's KV cache holds (the longest prompt it can prefill); None when
    the model or GPU is unknown."""
    shape = MODEL_SHAPES.get(model)
    hbm = HBM_BYTES.get(gpu_type)
    if shape is None or hbm is None or gpu_count < 1:
        return None
    free = gpu_count * hbm * MEMORY_UTIL - 2.0 * shape.params
    return max(0, int(free // shape.kv_bytes_per_token))


def decode_floor_ms(model: str, gpu_type: str, gpu_count: int) -> float | None:
    """The time between tokens of a node with nothing else to do: its decode iteration at no load
    (the weights streamed once, the tensor-parallel all-reduces, the engine's fixed costs), from
    :mod:`fleetloop.perf.serving`, the physics the simulated nodes run, on vLLM (the default
    engine). No node count makes a pool's TBT lower. None when the model or GPU is unknown.

    From the physics: llama-8b on one H100 8.2 ms, on one A100 12.5 ms, on one L40S 27.3 ms;
    llama-70b on four H100s 20.2 ms, on two H200s 25.4 ms, on four L40S 68.3 ms (PCIe all-reduces).
    The floor does not depend on the calls' sizes (a batch of one at no load)."""
    if gpu_count < 1:
        return None
    step = median_step(default_shape(model, gpu_type, gpu_count), _IDLE, 0.0)
    return None if step is None else 1000.0 * step


_IDLE = Mix(1.0, 0.0, 1.0)  # one token in, one out: the mix does not move the step at no load
