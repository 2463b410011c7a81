"""One iteration of a serving node: its compute and memory times, the smooth roofline that joins
them, the engine's fixed costs, the CUDA-graph padding of a decode batch, and the KV cache a node
holds. The simulator's node (:mod:`fleetloop.sim.node`) prices every iteration with these, and the
capacity policy (:mod:`fleetloop.perf.serving`) plans with the same functions: one implementation
of the physics.

For an iteration over ``M`` tokens (decode tokens plus prefill chunk tokens) whose attention reads
``A`` FLOPs' worth of context and whose KV reads cover ``K`` context tokens (``spec`` a
:class:`fleetloop.perf.catalog.NodeSpec`: P params, W weight bytes, kvb KV bytes per token, F
achieved FLOP/s, BW and BWkv the weight and paged-KV bandwidths)::

    compute_s = (2 P M / g(M) + A) / F          g(M) = M / (M + 64), the GEMM share of a small batch
    memory_s  = W / BW + kvb K / BWkv
    t         = degrade x (max(roofline(compute_s, memory_s), eager) + overhead)

``overhead`` is :meth:`fleetloop.perf.catalog.NodeSpec.overhead_s` with the engine's CPU costs
(:mod:`fleetloop.perf.engines`); ``eager`` is :func:`eager_floor_s` for an iteration the engine
runs without a CUDA graph (:meth:`fleetloop.perf.engines.RuntimeProfile.runs_eager`), else 0.
Attention FLOPs per (query token x context position) are
``spec.attn_flops_per_ctx`` (4 L d): a decode token over a context of ``C`` costs ``4 L d C``, a
prefill chunk of ``c`` tokens starting at position ``pos`` costs ``4 L d (c pos + c^2 / 2)``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from fleetloop.perf import catalog
from fleetloop.perf.catalog import NodeSpec
from fleetloop.perf.engines import RuntimeProfile


def roofline(a: float, b: float) -> float:
    """A step's time from its memory and compute times: a smooth maximum, ``(a^p + b^p)^(1/p)`` with
    ``p`` :data:`fleetloop.perf.catalog.ROOF_P`. Far from the ridge it is the larger one (the
    roofline); near it (a mid-sized decode batch) kernels reach neither peak and it is more."""
    p = catalog.ROOF_P
    hi = max(a, b)
    if hi <= 0.0:
        return 0.0
    lo = min(a, b)
    return hi * float((1.0 + (lo / hi) ** p) ** (1.0 / p))


@dataclass(frozen=True, slots=True)
class StepCosts:
    """The constants of one node's iterations, read once from its :class:`NodeSpec` (the
    simulator's node prices every iteration from them; a property of the spec recomputes)."""

    two_p: float  # 2 x parameters: dense FLOPs per token
    attn: float  # attention FLOPs per (query token x context position)
    weight_bytes: float
    kvb: float  # KV bytes per token
    flops: float  # achieved FLOP/s on large GEMMs
    bw: float  # weight-streaming bytes/s
    bw_kv: float  # paged-KV bytes/s

    @classmethod
    def of(cls, spec: NodeSpec) -> StepCosts:
        return cls(
            two_p=2.0 * spec.model.params,
            attn=spec.attn_flops_per_ctx,
            weight_bytes=spec.weight_bytes,
            kvb=float(spec.kv_bytes_per_token),
            flops=spec.flops,
            bw=spec.bytes_per_s,
            bw_kv=spec.kv_bytes_per_s,
        )


def compute_s(c: StepCosts, tokens: float, attn_flops: float) -> float:
    """The compute time of an iteration over ``tokens`` tokens with ``attn_flops`` of attention."""
    return (c.two_p * tokens / NodeSpec.gemm_share(tokens) + attn_flops) / c.flops


def memory_s(c: StepCosts, kv_tokens: float) -> float:
    """The memory time of an iteration that streams the weights and ``kv_tokens`` tokens of KV."""
    return c.weight_bytes / c.bw + c.kvb * kv_tokens / c.bw_kv


def eager_floor_s(spec: NodeSpec) -> float:
    """The least time an iteration that runs eagerly takes: its layers' kernel launches
    (:data:`fleetloop.perf.catalog.EAGER_LAYER_S` each; which iterations run eagerly:
    :meth:`fleetloop.perf.engines.RuntimeProfile.runs_eager`). The GPU's time is the larger of this
    and its roofline time: launches run ahead of the kernels, and the kernels wait for them."""
    return spec.model.layers * catalog.EAGER_LAYER_S


def padded_batch(graphs: tuple[int, ...], batch: int) -> int:
    """A decode batch as its CUDA graph runs it: padded up to the next captured size (a batch past
    the largest runs eagerly, as it is)."""
    if not graphs or batch > graphs[-1]:
        return batch
    return graphs[bisect.bisect_left(graphs, batch)]


def kv_capacity_tokens(spec: NodeSpec, runtime: RuntimeProfile) -> int:
    """The KV tokens one node's engine holds: its KV memory share (:meth:`RuntimeProfile.kv_budget_bytes`)
    over the KV bytes per token."""
    kv_bytes = runtime.kv_budget_bytes(spec.hbm_bytes, spec.weight_bytes, spec.gpus)
    return max(0, int(kv_bytes // spec.kv_bytes_per_token))
