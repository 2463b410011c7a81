"""A serving node's steady state under a stream of calls, from the iteration physics of
:mod:`fleetloop.perf.step`: how long its iterations take, how many calls it holds, how much KV
they use and how long a call waits for its first token, at a given arrival rate; and the largest
rate at which a node still meets a latency target (what the capacity autoscaler sizes pools with).

The model (a fluid steady state of continuous batching; every figure a mean)::

    calls of p prompt tokens, k of them found in the prefix cache (u = p - k prefilled), and
    o output tokens, arriving at r calls/s on one node whose iterations take t seconds:

    B    = r (o - 1) t                      decoding calls (Little's law: o - 1 decode steps each;
                                            the first token comes with the prefill's last chunk)
    c    = r u t                            prefill tokens per iteration
    room = max_batch_tokens - B             the step's token budget left to prefill (decodes first)
    s    = max(1, u / room)                 iterations one call's prefill spans
    P    = r t s                            calls prefilling
    M    = B + c                            tokens per iteration
    ctx  = B (p + o / 2)                    context the decoders attend to
    t    = slow x (max(roofline(compute_s(M, A (ctx + r t (k u + u^2 / 2))),
                                memory_s(ctx + r t (s k + u (s + 1) / 2))), eager)
                   + overhead(B + P, M, r t))

  (``eager`` :func:`fleetloop.perf.step.eager_floor_s` for an iteration the engine runs without a
  CUDA graph, else 0; :func:`fleetloop.perf.step.compute_s`, :func:`~fleetloop.perf.step.memory_s`, ``A`` the
  attention FLOPs per query token and context position, ``overhead`` the engine's per-step,
  per-sequence and per-admitted-call CPU costs plus the tensor-parallel all-reduces,
  :meth:`fleetloop.perf.catalog.NodeSpec.overhead_s`). ``t`` is the least fixed point, found by
  iterating from the idle step; none exists (the node is overloaded) when the prefill outgrows the
  budget (``c > room``) or the iteration does not settle. An engine that runs prefill in steps of
  its own (SGLang, vLLM 0.6) pays for the prefill tokens in iterations of up to ``max_batch_tokens``
  tokens beside the decode step instead of inside it.

    running calls N = B + P           KV tokens = B (u + o / 2) + P u / 2   (or N x an observed
                                      figure per running call, which counts the prefix sharing)
    TTFT = api_s + t / 2 + s max(t, t_own)   (the wait for the next iteration, then the
                                      prefill's iterations, each at least one that carries its own
                                      chunk, min(u, room) tokens, beside the decoders)
    TBT  = t                          (one token per decoding call per iteration)

Limits (:func:`max_rate`): the largest ``r`` whose steady state, with the number of calls in the
node at its 99th percentile, still exists, keeps ``N`` within the engine's running-call cap and the
KV within the node's cache, and meets the TTFT target with its mean and the TBT target with its
median iteration (a chunk of a long prompt makes its iteration as long on an idle node as on a busy
one: the batching lever's chunk cap sets that tail, the batch sets the common iterations). With
calls arriving as a Poisson stream and served in parallel (continuous batching admits every call at
once while there is room: an infinite-server queue), the number in the node is Poisson with mean
``N``: its 99th percentile is about ``N + z sqrt(N)`` (z = 2.326, the normal approximation), and the
node is held to its targets at the rate that would give that many on average, ``r (1 + z /
sqrt(N))``.

What the model leaves out (each errs as stated): CUDA-graph padding of decode-only iterations
(the padded batch costs a little more: slightly optimistic at small batches), preemption (past
the KV limit, which the limit keeps it from), the spread of prompt and output sizes (a mix is its
means; the TTFT of a long prompt's own prefill is not a wait capacity can remove), multi-step
decode blocks (vLLM 0.6: a new call waits up to a block, not modelled in the TTFT), and whole-prompt
admission on the engines that do not chunk prompts (TensorRT-LLM, vLLM 0.6: a prompt that does not
fit the step's room waits for the next step, which the mean chunk arithmetic does not see: optimistic
on TTFT when prompts are long against the budget).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fleetloop.perf.catalog import GPUS, MODELS, NodeSpec, default_gpus_per_node
from fleetloop.perf.engines import FAMILIES, RuntimeProfile, profile
from fleetloop.perf.step import StepCosts, compute_s, eager_floor_s, kv_capacity_tokens, memory_s, roofline

Z99 = 2.326  # the standard normal's 99th percentile
MAX_ITERATIONS = 400  # of the fixed point; a node that has not settled by then is overloaded
SETTLED = 1e-9  # relative change of the iteration time at which the fixed point is taken
MAX_STEP_S = 60.0  # an iteration longer than this is no steady state


@dataclass(frozen=True, slots=True)
class NodeShape:
    """One node of a pool as the physics sees it: the model on its GPUs, the engine, the step
    budget. Built by :func:`node_shape` from what a node reports (model, GPU type, GPU count, its
    step budget) and what the operator states (engine, precision)."""

    spec: NodeSpec
    runtime: RuntimeProfile
    max_batch_tokens: int
    costs: StepCosts
    kv_tokens: int  # KV tokens the engine's cache holds
    max_seqs: int  # the engine's cap on running calls
    graph_top: int = 0  # the largest decode batch captured as a CUDA graph (0: none)


def node_shape(
    model: str,
    gpu_type: str,
    gpu_count: int,
    *,
    engine: str = "vllm",
    family: str | None = None,
    precision: str = "bf16",
    max_batch_tokens: int = 0,
) -> NodeShape | None:
    """The shape of a node, or None when the model, GPU, engine or family is not in the catalog (a
    caller must then not plan from physics). ``gpu_count`` < 1 takes the catalog's default
    tensor-parallel degree; ``max_batch_tokens`` <= 0 the engine's default for the GPU."""
    m = MODELS.get(model)
    g = GPUS.get(gpu_type)
    if m is None or g is None or engine not in FAMILIES or precision not in ("bf16", "fp8"):
        return None
    if family is not None and family not in FAMILIES[engine]:
        return None
    runtime = profile(engine, family)
    gpus = gpu_count if gpu_count >= 1 else default_gpus_per_node(m, g, precision)
    spec = NodeSpec(m, g, gpus, precision)
    per_gpu = g.hbm_gib * 1e9
    budget = max_batch_tokens if max_batch_tokens > 0 else runtime.max_batch_tokens(g.name, per_gpu)
    kv = kv_capacity_tokens(spec, runtime)
    if kv < 1:
        return None
    graphs = runtime.graph_sizes(g.name, per_gpu)
    return NodeShape(
        spec,
        runtime,
        budget,
        StepCosts.of(spec),
        kv,
        runtime.max_num_seqs(g.name, per_gpu),
        graphs[-1] if graphs else 0,
    )


@dataclass(frozen=True, slots=True)
class Mix:
    """The mean call a pool serves: prompt tokens, the part of them found in the prefix cache, and
    output tokens; ``kv_per_call`` the KV tokens one running call holds, when observed (None: from
    the sizes, as if no prefix were shared)."""

    prompt: float
    cached: float
    output: float
    kv_per_call: float | None = None

    @property
    def uncached(self) -> float:
        return max(0.0, self.prompt - self.cached)


@dataclass(frozen=True, slots=True)
class Steady:
    """A node's steady state at ``rate`` calls/s (see the module docstring)."""

    rate: float
    step_s: float  # the mean iteration time: the time between tokens a decoding call sees
    decoding: float  # B
    prefilling: float  # P
    tokens: float  # M, per iteration
    prefill_steps: float  # s
    ttft_s: float
    kv_tokens: float

    @property
    def running(self) -> float:
        return self.decoding + self.prefilling


POISSON_TAIL = 1e-7  # past the mean, terms of the arrivals' distribution below this are dropped
POISSON_EXACT = 30.0  # above this mean the arrivals per iteration are taken as normal


def _arrivals(a: float) -> list[tuple[float, float]]:
    """``(j, P(j))`` for the calls an iteration admits, Poisson with mean ``a``: every term up to
    where the tail past the mean falls below ``POISSON_TAIL``; above ``POISSON_EXACT`` (where
    ``exp(-a)`` underflows soon after) the normal approximation on 41 points within 5 standard
    deviations."""
    if a <= POISSON_EXACT:
        out = []
        pj = math.exp(-a)
        j = 0
        while True:
            out.append((float(j), pj))
            j += 1
            pj *= a / j
            if j > a and pj < POISSON_TAIL:
                return out
    sd = math.sqrt(a)
    points = [(a + (k / 4.0) * sd, math.exp(-((k / 4.0) ** 2) / 2.0)) for k in range(-20, 21)]
    norm = sum(w for _, w in points)
    return [(max(1.0, round(j)), w / norm) for j, w in points]


def _iteration_s(
    shape: NodeShape,
    mix: Mix,
    rate: float,
    t: float,
    slow: float,
    *,
    terms: list[tuple[float, float]] | None = None,
) -> float | None:
    """One evaluation of the right-hand side of the fixed point at mean iteration time ``t`` (None
    past the budget: the prefill cannot keep up). Calls arrive as a Poisson stream, so the number
    ``j`` of calls whose prefill an iteration starts is Poisson with mean ``a = r t``; their ``j u``
    tokens run in ``n = ceil(j u / room)`` iterations of ``j u / n`` tokens beside the decoders (an
    iteration's time is convex in its tokens, so the mean of the mixture, not the iteration of the
    mean, is the mean iteration). The sum stops past the mean where a term falls below
    ``POISSON_TAIL``. The arithmetic is :func:`fleetloop.perf.step.roofline`,
    :func:`~fleetloop.perf.step.compute_s`, :func:`~fleetloop.perf.step.memory_s` and
    :meth:`fleetloop.perf.catalog.NodeSpec.overhead_s`, called once per term. ``terms``, when
    given, receives the mixture: ``(share of iterations, iteration time)`` per term."""
    spec, rt, costs = shape.spec, shape.runtime, shape.costs
    u = mix.uncached
    k = mix.prompt - u
    o = max(1.0, mix.output)
    a = rate * t  # calls admitted per iteration
    b = a * (o - 1.0)
    room = shape.max_batch_tokens - b if rt.mixed else float(shape.max_batch_tokens)
    if room < 1.0 or (rt.mixed and a * u > room):
        return None
    ctx = b * (mix.prompt + o / 2.0)
    per_attn = k * u + u * u / 2.0  # one call's prefill attention (context positions x tokens)
    per_kv = k + u  # one call's prefill KV reads, as one chunk
    step_s, seq_s, admit_s = rt.step_s, rt.seq_s, rt.admit_s
    floor = eager_floor_s(spec)

    def iteration(dec: float, tokens: float, calls: float) -> float:
        m = dec + tokens
        c = ctx if dec else 0.0
        gpu = roofline(
            compute_s(costs, m, costs.attn * (c + calls * per_attn)), memory_s(costs, c + calls * per_kv)
        )
        if rt.runs_eager(m, prefill=tokens > 0.0, graph_top=shape.graph_top):
            gpu = max(gpu, floor)
        return gpu + spec.overhead_s(dec + calls, m, calls, step_s=step_s, seq_s=seq_s, admit_s=admit_s)

    decode = iteration(b, 0.0, 0.0)
    if u <= 0.0 or a <= 0.0:
        if terms is not None:
            terms.append((1.0, slow * decode))
        return slow * decode
    total = steps = 0.0
    for j, pj in _arrivals(a):
        if j == 0:
            total += pj * decode
            steps += pj
            if terms is not None:
                terms.append((pj, slow * decode))
            continue
        n = math.ceil(j * u / room)
        if rt.mixed:
            one = iteration(b, j * u / n, j / n)
            total += pj * n * one
            steps += pj * n
            if terms is not None:
                terms.append((pj * n, slow * one))
        else:  # prefill iterations of their own, then the decoders' iteration
            pre = iteration(0.0, j * u / n, j / n)
            total += pj * (n * pre + decode)
            steps += pj
            if terms is not None:  # the decoders wait out the prefill: one long gap between tokens
                terms.append((pj, slow * (n * pre + decode)))
    return slow * total / steps


def _fixed_point(f: Callable[[float], float | None], t: float) -> float | None:
    """The least fixed point of the increasing map ``f`` above ``t`` (``f(t) >= t``); None when
    ``f`` has no value there (past the budget), grows past ``MAX_STEP_S`` or does not settle.

    Plain iterates from below rise towards the least fixed point and never pass it, so each is a
    lower bound. Aitken's extrapolation of two plain steps proposes a point beyond; once one is
    found where ``f`` falls below the identity, the fixed point is bracketed and regula falsi
    (the Illinois variant) closes the bracket."""

    def g(x: float) -> float | None:
        y = f(x)
        return None if y is None or y > MAX_STEP_S else y - x

    lo, g_lo = t, g(t)
    if g_lo is None:
        return None
    hi = g_hi = None
    for _ in range(MAX_ITERATIONS):
        if g_lo <= SETTLED * lo:
            return lo + g_lo
        t1 = lo + g_lo
        g1 = g(t1)
        if g1 is None:
            return None
        if g1 <= SETTLED * t1:
            return t1 + g1
        t2 = t1 + g1
        denom = g1 - g_lo  # (t2 - t1) - (t1 - t0)
        guess = t1 - g1 * g1 / denom if denom < 0.0 else 2.0 * t2 - t1
        lo, g_lo = t1, g1  # t2 is a plain iterate too, but unevaluated: t1 is the last bound
        g_guess = g(guess) if math.isfinite(guess) and guess > t2 else None
        if g_guess is not None and g_guess < 0.0:
            hi, g_hi = guess, g_guess
            break
        if g_guess is not None:
            lo, g_lo = guess, g_guess
    if hi is None or g_hi is None:
        return None
    side = 0
    for _ in range(MAX_ITERATIONS):
        x = (lo * g_hi - hi * g_lo) / (g_hi - g_lo)
        gx = g(x)
        if gx is None:
            return None
        if abs(gx) <= SETTLED * x or hi - lo <= SETTLED * lo:
            return x + gx
        if gx > 0.0:
            lo, g_lo = x, gx
            if side == -1:
                g_hi /= 2.0
            side = -1
        else:
            hi, g_hi = x, gx
            if side == 1:
                g_lo /= 2.0
            side = 1
    return None


def steady(
    shape: NodeShape, mix: Mix, rate: float, *, slow: float = 1.0, below: float = 0.0
) -> Steady | None:
    """The node's steady state at ``rate`` calls/s, or None when it is overloaded. ``slow``
    stretches every iteration (a node measured slower than its physics, e.g. degraded); ``below``
    is an iteration time known to be at most this rate's (the one at a lower rate), where the
    search may start."""
    if rate < 0.0 or not slow > 0.0:
        return None
    t = _iteration_s(shape, mix, 0.0, 0.0, slow)
    if t is None:
        return None
    t = max(t, below)
    if rate > 0.0:
        found = _fixed_point(lambda x: _iteration_s(shape, mix, rate, x, slow), t)
        if found is None:
            return None
        t = found
    return _state(shape, mix, rate, t, slow)


def _state(shape: NodeShape, mix: Mix, rate: float, t: float, slow: float) -> Steady:
    u = mix.uncached
    o = max(1.0, mix.output)
    admitted = rate * t
    b = admitted * (o - 1.0)
    room = shape.max_batch_tokens - b if shape.runtime.mixed else float(shape.max_batch_tokens)
    s = max(1.0, u / max(room, 1.0))
    pf = admitted * s
    kv = (b + pf) * mix.kv_per_call if mix.kv_per_call is not None else b * (u + o / 2.0) + pf * u / 2.0
    # A call's own prefill runs in iterations that carry its chunk (up to the room left) beside the
    # decoders: at light load far longer than the mean iteration, which averages it over many.
    chunk = min(u, max(room, 1.0))
    spec, rt, costs = shape.spec, shape.runtime, shape.costs
    ctx = b * (mix.prompt + o / 2.0) if rt.mixed else 0.0
    k = mix.prompt - u
    m = (b if rt.mixed else 0.0) + chunk
    gpu = roofline(
        compute_s(costs, m, costs.attn * (ctx + chunk * k + chunk * chunk / 2.0)),
        memory_s(costs, ctx + k + chunk),
    )
    if rt.runs_eager(m, prefill=chunk > 0.0, graph_top=shape.graph_top):
        gpu = max(gpu, eager_floor_s(spec))
    own = slow * (
        gpu
        + spec.overhead_s(
            (b if rt.mixed else 0.0) + 1.0, m, 1.0, step_s=rt.step_s, seq_s=rt.seq_s, admit_s=rt.admit_s
        )
    )
    ttft = rt.api_s + t / 2.0 + s * max(t, own)
    return Steady(rate, t, b, pf, b + admitted * u, s, ttft, kv)


def median_step_s(shape: NodeShape, mix: Mix, rate: float, *, slow: float = 1.0) -> float | None:
    """The median iteration time a decoding call sees at ``rate`` calls/s (every decoding call
    gets one token per iteration, so iterations count alike): what a node's ``tbt_p50_ms`` reports
    (the token-weighted median of its iteration times). None when the node is overloaded."""
    st = steady(shape, mix, rate, slow=slow)
    med = None if st is None else _median_iteration(shape, mix, st, slow)
    return None if med is None or math.isinf(med) else med


def _median_iteration(shape: NodeShape, mix: Mix, st: Steady, slow: float) -> float:
    """The token-weighted median of the iteration mixture at ``st``; infinite when the mixture has
    no value there (a fixed point settled within its tolerance just past the step budget)."""
    terms: list[tuple[float, float]] = []
    if _iteration_s(shape, mix, st.rate, st.step_s, slow, terms=terms) is None or not terms:
        return math.inf
    terms.sort(key=lambda x: x[1])
    half = sum(w for w, _ in terms) / 2.0
    seen = 0.0
    for w, x in terms:
        seen += w
        if seen >= half:
            return x
    return terms[-1][1]


@dataclass(frozen=True, slots=True)
class Targets:
    """What a node must meet: the time between tokens and to a first token (seconds), and the
    share of its KV cache calls may hold (1.0: all of it)."""

    tbt_s: float
    ttft_s: float
    kv_frac: float = 1.0


def meets(
    shape: NodeShape, mix: Mix, rate: float, targets: Targets, *, slow: float = 1.0, idle_ttft_s: float = 0.0
) -> bool:
    """Whether one node meets ``targets`` at ``rate`` calls/s with the calls in it at their 99th
    percentile (see the module docstring). The TBT target holds the median iteration: an iteration
    that carries a long prompt's chunk takes as long on an idle node as on a busy one (its length is
    the batching lever's, the chunk cap), so only the iterations the batch makes longer are
    capacity's to keep short, and those are the common ones. A TTFT the idle node already misses (a
    prompt whose own prefill is longer: ``idle_ttft_s``) holds it to that TTFT instead: capacity
    cannot remove it."""
    base = steady(shape, mix, rate, slow=slow)
    if base is None:
        return False
    if rate <= 0.0:
        return True
    n = base.running
    hi_rate = rate * (1.0 + Z99 / math.sqrt(n)) if n > 0 else rate
    hi = steady(shape, mix, hi_rate, slow=slow, below=base.step_s)
    if hi is None:
        return False
    ttft_cap = max(targets.ttft_s, idle_ttft_s)
    return (
        hi.running <= shape.max_seqs
        and hi.kv_tokens <= targets.kv_frac * shape.kv_tokens
        and hi.ttft_s <= ttft_cap
        and _median_iteration(shape, mix, hi, slow) <= targets.tbt_s
    )


def max_rate(shape: NodeShape, mix: Mix, targets: Targets, *, slow: float = 1.0, rel: float = 0.01) -> float:
    """The largest arrival rate (calls/s) one node serves while it :func:`meets` ``targets``, to a
    relative precision ``rel`` (a bracket by doubling or halving, then bisection); 0 when even a
    trickle misses."""
    idle = steady(shape, mix, 0.0, slow=slow)
    if idle is None:
        return 0.0
    idle_ttft = idle.ttft_s

    def ok(r: float) -> bool:
        return meets(shape, mix, r, targets, slow=slow, idle_ttft_s=idle_ttft)

    # A first guess: the rate at which the decoders alone would fill the idle iteration's tokens.
    guess = max(1e-6, min(1e6, 64.0 / (max(1.0, mix.output) * idle.step_s)))
    if ok(guess):
        lo, hi = guess, guess * 2.0
        while ok(hi):
            lo, hi = hi, hi * 2.0
            if hi > 1e7:
                return lo
    else:
        lo, hi = guess / 2.0, guess
        while not ok(lo):
            lo, hi = lo / 2.0, lo
            if lo < 1e-6:
                return 0.0
    while hi - lo > rel * lo:
        mid = (lo + hi) / 2.0
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
