"""A pool's physics as the policies ask for it: one node's shape from what its nodes report and the
operator states, the calls/s one node serves within the SLO (the ``capacity`` autoscaler), and the
median iteration time the physics predicts (what a node's TBT p50 is compared with; at no load, the
TBT floor :func:`fleetloop.policies.prefill.decode_floor_ms` that ``slo-predictive`` reads). The
figures come from :mod:`fleetloop.perf.serving`, the model the simulated nodes run; the search behind
a rate takes milliseconds, so each is kept per shape and per mix rounded to ``STEP`` (2%: a node
count moves by less than that), in a bounded cache of a pure function (the same inputs give the same
figure)."""

from __future__ import annotations

import math
from functools import lru_cache

from fleetloop.perf.serving import Mix, NodeShape, Targets, max_rate, median_step_s, node_shape

STEP = 0.02  # relative rounding of the mix before a rate is looked up
_LOG_STEP = math.log1p(STEP)

ShapeKey = tuple[
    str, str, int, str, str | None, str, int
]  # model, GPU, count, engine, family, precision, budget


def shape_of(key: ShapeKey) -> NodeShape | None:
    return _shape(key)


@lru_cache(maxsize=1024)
def _shape(key: ShapeKey) -> NodeShape | None:
    model, gpu, count, engine, family, precision, budget = key
    return node_shape(
        model, gpu, count, engine=engine, family=family, precision=precision, max_batch_tokens=budget
    )


def _q(x: float) -> int:
    """``x`` (> 0) on the logarithmic grid of ``STEP``; 0 and below map to a sentinel."""
    return round(math.log(x) / _LOG_STEP) if x > 0.0 else -(10**9)


def _v(q: int) -> float:
    return math.exp(q * _LOG_STEP) if q > -(10**9) else 0.0


MixKey = tuple[int, int, int, int]


def mix_key(mix: Mix) -> MixKey:
    kv = mix.kv_per_call
    return (_q(mix.prompt), _q(mix.uncached), _q(mix.output), _q(kv) if kv is not None else -1)


def _mix(key: MixKey) -> Mix:
    prompt, uncached, output, kv = (_v(key[0]), _v(key[1]), _v(key[2]), key[3])
    uncached = min(uncached, prompt)
    return Mix(prompt, prompt - uncached, output, _v(kv) if kv != -1 else None)


def node_rate(shape: ShapeKey, mix: Mix, targets: Targets, slow: float) -> float:
    """Calls/s one node serves within ``targets`` (:func:`fleetloop.perf.serving.max_rate`)."""
    return _node_rate(shape, mix_key(mix), targets, _q(slow))


@lru_cache(maxsize=65536)
def _node_rate(shape: ShapeKey, mix: MixKey, targets: Targets, slow: int) -> float:
    found = _shape(shape)
    if found is None:
        return 0.0
    return max_rate(found, _mix(mix), targets, slow=_v(slow))


def default_shape(model: str, gpu_type: str, gpu_count: int) -> ShapeKey:
    """The key of a node of ``model`` on ``gpu_count`` ``gpu_type`` GPUs with every other field at
    :func:`fleetloop.perf.serving.node_shape`'s default (vLLM, bf16, the engine's batch budget)."""
    return (model, gpu_type, gpu_count, "vllm", None, "bf16", 0)


def median_step(shape: ShapeKey, mix: Mix, rate: float) -> float | None:
    """The physics' median iteration time (seconds) at ``rate`` calls/s per node, at full speed."""
    return _median_step(shape, mix_key(mix), _q(rate))


@lru_cache(maxsize=65536)
def _median_step(shape: ShapeKey, mix: MixKey, rate: int) -> float | None:
    found = _shape(shape)
    if found is None:
        return None
    return median_step_s(found, _mix(mix), _v(rate))
