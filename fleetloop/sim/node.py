"""A serving node: one model replica on one or more GPUs, with iteration-level continuous batching.

Physics (per iteration, ``spec`` from :mod:`fleetloop.perf.catalog`; P params, L layers, d hidden,
W weight bytes, kvb KV bytes per token (both at the pool's precision), F achieved FLOP/s on large
GEMMs, g(M) = M / (M + 64) the GEMM share a batch of M tokens gets, BW the weight-streaming and
BWkv the paged-KV bandwidth, o(B, M, A) the iteration's fixed costs for B sequences, M tokens and A
newly admitted requests: per step, per sequence, per request, and the tensor-parallel all-reduces
of M tokens, :meth:`fleetloop.perf.catalog.NodeSpec.overhead_s`):

- a **mixed iteration** (prefill chunks plus one token for each decoding request), capped at
  ``max_batch_tokens`` tokens, decode tokens first (vLLM's chunked-prefill scheduler)::

      flops = 2 P M / g(M) + 4 L d (sum(chunk x pos + chunk^2 / 2) + ctx_decode)
      t     = degrade x (R(flops / F, W / BW + kvb (ctx_decode + sum(pos + chunk)) / BWkv) + o)

  with ``R`` the smooth roofline :func:`roofline` (the larger of the two far from the ridge, more
  near it), raised to :func:`fleetloop.perf.step.eager_floor_s` (``L x EAGER_LAYER_S``) when the
  engine runs the iteration without a CUDA graph (a prefill on an engine that captures decode
  batches only, any batch past its largest graph:
  :meth:`fleetloop.perf.engines.RuntimeProfile.runs_eager`);

  ``2 P`` FLOPs per token is the dense forward pass; attention costs ``2 x 2 L d`` per query token
  and context position (QK^T and AV, each a multiply-add over d), with causal masking averaging the
  context over the chunk;
- a **decode run** (no prefill pending): every step reads all weights and the batch's KV once, so
  step ``k`` of a run that starts with context ``C`` over ``B`` requests takes
  ``degrade x (R(W / BW + kvb (C + B k) / BWkv, (2 P B' / g(B') + 4 L d (C + B k)) / F) + o)``
  (``B'`` the batch padded to its CUDA graph; a batch past the largest graph runs eagerly, its
  step at least the eager floor). Between events nothing changes but the context, so
  a run of ``n`` steps is summed in closed form, ``T(n) = degrade x (n (a + o) + b n (n - 1) / 2)``
  with ``a`` the first step and ``b`` the chord of the step time from the first step to the
  planned last one, and the node jumps to the next completion (or KV limit) in one event. An
  arrival, cancellation or fault truncates the run at the step boundary after it (the quadratic is
  solved for the step).

The serving engine (``runtime``, a :class:`fleetloop.perf.engines.RuntimeProfile`) sets the step's
token budget, the running-request cap, the KV memory share, the CUDA-graph batch sizes (a decode
batch's GEMMs run padded to the next captured size), the CPU costs ``o``, whether prefill shares a
step with decodes (vLLM V1, TensorRT-LLM) or runs in steps of its own (SGLang, vLLM V0: decoders
wait), and V0's multi-step decode blocks (a request arriving mid-block waits for the block's end).

State: FCFS waiting queue; running requests up to the engine's cap; KV capacity from HBM minus
weights; a waiting request joins the batch when the iteration's token budget has room for its
first chunk (for its whole uncached prompt on an engine that does not chunk prompts, TensorRT-LLM
and vLLM 0.6: the head of the queue waits for a step with room; a prompt past the whole budget runs
chunked, alone) and its prompt's KV fits (its cached prefix is shared), so ``queue_depth`` is work
not yet started, as in vLLM. When the
growing KV would overflow, the newest decoding request is preempted (recompute: back to the head of
the queue with prompt + generated tokens to prefill again), as vLLM does. Prefix cache: an LRU over
prefix digests whose entries occupy free KV; a hit skips that prefill. A request's prefix blocks
are counted once: when the request that computed a prefix finishes its prefill, those blocks move
from its own KV into the cache entry (shared from then on), and an entry that running requests
use is pinned: eviction skips it until the last of them leaves. Weights: cold -> loading ->
warm over a cold start the fleet draws (:func:`fleetloop.sim.catalog.sample_cold_start`). Cost:
the node's $/s for the iteration's time, split over the iteration's tokens; idle time is paid but
not attributed.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from fleetloop.perf.catalog import NodeSpec
from fleetloop.perf.engines import DEFAULT_PROFILE, RuntimeProfile
from fleetloop.perf.step import (
    StepCosts,
    compute_s,
    eager_floor_s,
    kv_capacity_tokens,
    memory_s,
    padded_batch,
    roofline,
)

HOT_PREFIXES = 16


class NodeListener(Protocol):
    """What a node tells the world (the fleet routes these to the clients)."""

    def on_first_token(self, req: Req, t: float) -> None: ...
    def on_finish(self, req: Req, t: float) -> None: ...
    def on_lost(self, req: Req, t: float) -> None: ...
    def on_waste(self, req: Req, usd: float) -> None: ...


@dataclass(slots=True, eq=False)
class Req:
    """One attempt as the node sees it. ``p_len`` tokens must be in context before the next token;
    ``out_left`` tokens remain to generate (both change on preemption)."""

    rid: int
    prompt: int
    output: int
    prefix_digest: str | None
    prefix_tokens: int
    owner: object = None  # the client's attempt
    p_len: int = 0
    out_left: int = 0
    cached: int = 0
    prefill_left: int = 0
    pos: int = 0
    generated: int = 0  # tokens generated before the current decode stint
    join_counter: int = 0
    join_acc: float = 0.0
    done_at: int = 0
    admitted_seq: int = 0
    state: str = "new"  # new | waiting | prefill | decode | done
    submit_t: float = 0.0
    first_token_t: float | None = None
    cost: float = 0.0
    reported_cost: float = 0.0
    cancelled: bool = False
    orphaned: bool = False  # the client left but the engine was not told: it runs on, as waste


@dataclass(slots=True)
class _Run:
    kind: str  # "decode" | "mixed"
    start: float
    end: float
    steps: int = 1
    a: float = 0.0  # decode: first step's time before degrade (without overhead)
    b: float = 0.0  # decode: growth per step
    o: float = 0.0
    degrade: float = 1.0
    batch: int = 0
    chunks: list[tuple[Req, int]] = field(default_factory=list)
    tokens: int = 0


@dataclass(slots=True)
class IntervalStats:
    ttft_ms: list[float] = field(default_factory=list)
    tbt: list[tuple[float, float]] = field(default_factory=list)  # (step ms, tokens)
    errors: int = 0
    timeouts: int = 0
    preemptions: int = 0
    completed: int = 0
    # Whole prompts (cached tokens included) of calls whose first prefill ended in the interval, as
    # vLLM counts ``prompt_tokens_total`` (v1 ``IterationStats``: ``prompt_len`` at the call's first
    # output); a prefill redone after a preemption is not counted again.
    prompt_tokens: int = 0
    output_tokens: int = 0
    prefix_lookups: int = 0
    prefix_hits: int = 0
    busy_s: float = 0.0


class Node:
    """One replica. The fleet calls :meth:`submit`, :meth:`cancel`, :meth:`on_event` (with the
    version it was scheduled under), :meth:`set_weights_state`, :meth:`crash` and :meth:`set_degrade`;
    the node asks the fleet to call it back at a time through ``schedule(t, node, version)``."""

    def __init__(
        self,
        node_id: str,
        pool_id: str,
        spec: NodeSpec,
        listener: NodeListener,
        schedule: Callable[[float, Node, int], None],
        *,
        now: float,
        warm: bool,
        max_batch_tokens: int | None = None,
        runtime: RuntimeProfile = DEFAULT_PROFILE,
        offline: bool = False,
    ) -> None:
        self.node_id = node_id
        self.pool_id = pool_id
        self.spec = spec
        self.listener = listener
        self._schedule = schedule
        gpu, per_gpu = spec.gpu.name, spec.gpu.hbm_gib * 1e9
        self.runtime = runtime
        self.max_batch_tokens = (
            max_batch_tokens
            if max_batch_tokens is not None
            else runtime.max_batch_tokens(gpu, per_gpu, offline=offline)
        )
        self.max_num_seqs = runtime.max_num_seqs(gpu, per_gpu)  # the engine's cap on running requests
        # Whether a request is admitted only when KV for its whole output is free too (TensorRT-LLM's
        # GUARANTEED_NO_EVICT scheduler: no preemption) instead of optimistically (vLLM: preempt).
        self.no_evict = runtime.no_evict
        self._graphs = runtime.graph_sizes(gpu, per_gpu)
        self._graph_top = self._graphs[-1] if self._graphs else 0
        self._eager_s = eager_floor_s(spec)  # the least time of an iteration without a CUDA graph
        self._step_s = runtime.step_s
        self._seq_s = runtime.seq_s
        self._admit_s = runtime.admit_s
        self._mixed = runtime.mixed
        self._chunked = runtime.chunked_prefill
        self._block = max(1, runtime.decode_block)
        self._sum_done_at = 0  # sum of done_at over decoding requests (outputs still to come)
        self.inbound = 0  # requests sent to this node that have not reached the engine yet (api_s)
        self.weights_state = "warm" if warm else "cold"
        self.alive = True
        self.draining = False
        self.degrade = 1.0
        self.provisioned_at = now
        self.removed_at: float | None = None
        self.version = 0
        self.boot = 0  # bumps on every (re)boot, so stale weight-state events are ignored
        self.degrade_gen = 0
        self.last_report = now
        self._guard = False
        self.run: _Run | None = None
        self.waiting: deque[Req] = deque()
        self.queued_tokens = 0
        self.prefilling: list[Req] = []
        self.decoding: dict[int, Req] = {}
        self._done_heap: list[tuple[int, int, int]] = []
        # Fast forms (each keeps its plain statement; tests/sim/test_node_fast.py holds them equal):
        # _cancelled_hint is 0 only when no running request is cancelled, so _sweep_cancelled can
        # skip its scans (it counts cancellations of running requests and admissions of cancelled
        # ones, and is reset by a full sweep or a crash); _newest_heap holds (-admitted_seq, rid)
        # of every decoding request (stale entries skipped lazily), so the preemption victim (the
        # newest admitted) is found without a scan of every decoding request.
        self._cancelled_hint = 0
        self._newest_heap: list[tuple[int, int]] = []
        self.counter = 0
        self.acc = 0.0  # cumulative cost per decode slot
        self.ctx_decode = 0  # context tokens of decoding requests (read every step)
        self.kv_used = 0  # own KV tokens of running requests
        self.cache: OrderedDict[str, int] = OrderedDict()
        self.cache_tokens = 0
        self._admit_seq = 0
        self.stats = IntervalStats()
        self._busy_mark = now  # busy time counted up to here
        # constants of the physics (fleetloop.perf.step prices every iteration from them)
        self._costs = costs = StepCosts.of(spec)
        self._attn = costs.attn
        self._kvb = costs.kvb
        self._f = costs.flops
        self._bw_kv = costs.bw_kv
        self._pins: dict[str, int] = {}  # prefix digest -> running requests that use its blocks
        self._usd_s = spec.usd_per_s
        self.capacity = kv_capacity_tokens(spec, runtime)

    # -- queries ----------------------------------------------------------------------------------

    @property
    def warm(self) -> bool:
        return self.weights_state == "warm"

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def idle(self) -> bool:
        return (
            self.run is None
            and not self.waiting
            and not self.prefilling
            and not self.decoding
            and not self.inbound
        )

    def hot_prefixes(self) -> tuple[str, ...]:
        out: list[str] = []
        for digest in reversed(self.cache):
            out.append(digest)
            if len(out) == HOT_PREFIXES:
                break
        return tuple(out)

    def billed_s(self, end: float, start: float = 0.0) -> float:
        """Seconds this node is billed within ``[start, end]``: from its provisioning to its removal
        (a node is paid for while it boots, serves, drains or sits idle)."""
        stop = self.removed_at if self.removed_at is not None else end
        return max(0.0, min(stop, end) - max(self.provisioned_at, start))

    def cost_so_far(self, req: Req) -> float:
        """The attempt's attributed cost up to the last iteration boundary."""
        if req.state == "decode":
            return req.cost + (self.acc - req.join_acc)
        return req.cost

    # -- inputs -----------------------------------------------------------------------------------

    def submit(self, req: Req, now: float) -> None:
        req.submit_t = now
        req.p_len = req.prompt
        req.out_left = max(1, req.output)
        req.state = "waiting"
        self.waiting.append(req)
        self.queued_tokens += req.p_len
        self._kick(now)

    def cancel(self, req: Req, now: float) -> None:
        """The client gave up on ``req`` (timeout or deadline): stop spending on it."""
        if req.state in ("done", "new") or req.cancelled:
            return
        req.reported_cost = self.cost_so_far(req)
        req.cancelled = True
        if req.state == "waiting":
            self.waiting.remove(req)
            self.queued_tokens -= req.p_len
            req.state = "done"
            self.stats.timeouts += 1
            return
        self.stats.timeouts += 1
        self._cancelled_hint += 1  # a running request (prefill or decode) is now cancelled
        if self.run is None:
            self._sweep_cancelled()
        elif self.run.kind == "decode":
            self._truncate(now)

    def abandon(self, req: Req) -> bool:
        """The client left without the engine being told (a non-streaming call): the request runs
        on, and what it costs from here is settled as waste. False if it had already ended."""
        if req.state in ("done", "new") or req.cancelled or req.orphaned:
            return False
        req.reported_cost = self.cost_so_far(req)
        req.orphaned = True
        return True

    def set_degrade(self, factor: float, now: float) -> None:
        self.degrade = factor
        if self.run is not None and self.run.kind == "decode":
            self._truncate(now)

    def set_weights_state(self, state: str, now: float) -> None:
        self.weights_state = state
        if state == "warm":
            self._kick(now)

    def crash(self, now: float, *, keep_alive: bool = False) -> None:
        """Lose every request in flight. ``keep_alive``: the node comes back cold (preemption)."""
        self._account_busy(now)
        lost = sorted([*self.waiting, *self.prefilling, *self.decoding.values()], key=lambda r: r.rid)
        for r in lost:
            if r.cancelled:
                continue
            if r.state == "decode":
                r.cost += self.acc - r.join_acc
            r.state = "done"
            self.stats.errors += 1
            self._settle_abandoned(r)
            self.listener.on_lost(r, now)
        self.waiting.clear()
        self.queued_tokens = 0
        self.prefilling.clear()
        self.decoding.clear()
        self._sum_done_at = 0
        self._done_heap.clear()
        self._newest_heap.clear()
        self._cancelled_hint = 0
        self.ctx_decode = 0
        self.kv_used = 0
        self.cache.clear()
        self.cache_tokens = 0
        self._pins.clear()
        self.run = None
        self.version += 1
        if keep_alive:
            self.weights_state = "cold"
        else:
            self.alive = False
            self.removed_at = now

    def on_event(self, now: float, version: int) -> None:
        if version != self.version or self.run is None or not self.alive:
            return
        run = self.run
        self._account_busy(now)  # before clearing the run: its busy tail belongs to this interval
        self.run = None
        # Listeners may submit new work to this node while we settle the iteration: hold planning
        # until the books are consistent, then plan once.
        self._guard = True
        try:
            if run.kind == "decode":
                self._finish_decode(run, now)
            else:
                self._finish_mixed(run, now)
            self._sweep_cancelled()
        finally:
            self._guard = False
        self._plan(now)

    # -- telemetry helpers ------------------------------------------------------------------------

    def take_stats(self, now: float) -> IntervalStats:
        self._account_busy(now)
        s = self.stats
        self.stats = IntervalStats()
        return s

    def _account_busy(self, now: float) -> None:
        if self.run is not None:
            self.stats.busy_s += max(0.0, min(now, self.run.end) - max(self._busy_mark, self.run.start))
        self._busy_mark = now

    # -- scheduling -------------------------------------------------------------------------------

    def _kick(self, now: float) -> None:
        if not self.alive or not self.warm or self._guard:
            return
        if self.run is None:
            self._plan(now)
        elif self.run.kind == "decode":
            self._truncate(now)

    def _evict_cache(self, need: int, keep: str | None = None) -> None:
        """Evict LRU prefixes until ``need`` more KV tokens fit (never ``keep``, never a pinned one:
        a prefix that running requests read is never evicted under them). The victims are chosen in
        one pass over the LRU order with the fit tested before each, then removed, without copying
        the cache's keys (thousands of prefixes on a busy node, while eviction usually stops after
        a few)."""
        kv = self.kv_used + need  # token counts: integers, so the sums are exact in any order
        left = self.cache_tokens
        if kv + left <= self.capacity:
            return
        pins = self._pins
        victims: list[str] = []
        for digest, tokens in self.cache.items():
            if kv + left <= self.capacity:
                break
            if digest == keep or pins.get(digest, 0) > 0:
                continue
            victims.append(digest)
            left -= tokens
        cache = self.cache
        for digest in victims:
            del cache[digest]
        self.cache_tokens = left

    def _admit(self, now: float) -> None:
        """Move waiting requests into the batch while this iteration's token budget has room for
        their first chunk (vLLM V1: decodes first, then waiting requests take what budget is left)."""
        decode_tokens = len(self.decoding) if self._mixed else 0  # prefill-only steps leave decoders out
        budget = self.max_batch_tokens - decode_tokens - sum(r.prefill_left for r in self.prefilling)
        while self.waiting and self.running < self.max_num_seqs and budget > 0:
            r = self.waiting[0]
            cached = 0
            hit = False
            if r.prefix_digest is not None and r.generated == 0:
                self.stats.prefix_lookups += 1
                entry = self.cache.get(r.prefix_digest)
                if entry is not None:
                    cached = min(entry, r.prefix_tokens, r.p_len - 1)
                    hit = cached > 0
            need = r.p_len - cached
            if not self._chunked and need > budget and (need <= self.max_batch_tokens or self.prefilling):
                # An engine that does not chunk prompts takes one whole into a step or leaves it at
                # the head of the queue for a step with room (FCFS). A prompt past the whole budget
                # (a deployment would have to enable chunking for it) runs chunked, with no other.
                return
            if self.no_evict:  # reserve the whole output too, and what running requests will grow
                need += r.out_left + self._reserved()
            elif not self._mixed and self.decoding:
                # Prefill-first engines admit with headroom for the decoders' next tokens and a 1%
                # watermark (vLLM V0's BlockSpaceManager watermark 0.01; SGLang reserves for the
                # running requests' new tokens): exact-fit admission would preempt a decoder right
                # after every prefill step and never decode.
                need += len(self.decoding) + self.capacity // 100
            if self.kv_used + self.cache_tokens + need > self.capacity:
                self._evict_cache(need, keep=r.prefix_digest if hit else None)
            if self.kv_used + self.cache_tokens + need > self.capacity:
                if self.running == 0 and need > self.capacity - self.cache_tokens:
                    # Can never fit (prompt longer than the KV cache): reject it.
                    self.waiting.popleft()
                    self.queued_tokens -= r.p_len
                    r.state = "done"
                    self.stats.errors += 1
                    self.listener.on_lost(r, now)
                    continue
                return  # FCFS: head-of-line waits for KV to free
            self.waiting.popleft()
            self.queued_tokens -= r.p_len
            if hit and r.prefix_digest is not None:
                self.stats.prefix_hits += 1
                self.cache.move_to_end(r.prefix_digest)
                self._pin(r.prefix_digest)
            r.cached = cached
            r.pos = cached
            r.prefill_left = r.p_len - cached
            r.state = "prefill"
            if r.cancelled:  # a cancelled request preempted back to the queue runs again
                self._cancelled_hint += 1
            self._admit_seq += 1
            r.admitted_seq = self._admit_seq
            self.kv_used += r.p_len - cached
            self.prefilling.append(r)
            budget -= r.prefill_left

    def _reserved(self) -> int:
        """KV tokens running requests will still add (their outputs to come)."""
        return (
            self._sum_done_at - len(self.decoding) * self.counter + sum(r.out_left for r in self.prefilling)
        )

    def _next_done(self) -> int | None:
        heap = self._done_heap
        while heap:
            done_at, _, rid = heap[0]
            r = self.decoding.get(rid)
            if r is None or r.done_at != done_at:
                heapq.heappop(heap)
                continue
            return done_at
        return None

    def _newest_decoding(self) -> Req:
        """The decoding request admitted last (``decoding`` is not empty; admission numbers are
        unique, so there are no ties): the top of ``_newest_heap`` once entries of requests that
        left decoding (or were admitted again since) are dropped."""
        heap = self._newest_heap
        decoding = self.decoding
        while True:
            neg_seq, rid = heap[0]
            r = decoding.get(rid)
            if r is not None and r.admitted_seq == -neg_seq:
                return r
            heapq.heappop(heap)

    def _preempt_newest(self, now: float) -> bool:
        if not self.decoding:
            return False
        victim = self._newest_decoding()
        gen_since = self.counter - victim.join_counter
        victim.cost += self.acc - victim.join_acc
        del self.decoding[victim.rid]
        self._sum_done_at -= victim.done_at
        ctx = victim.p_len + 1 + gen_since
        self.ctx_decode -= ctx
        self.kv_used -= ctx - victim.cached
        victim.generated += 1 + gen_since
        victim.out_left = victim.done_at - self.counter
        victim.p_len = ctx
        self._unpin(victim)
        victim.cached = 0
        victim.state = "waiting"
        self.waiting.appendleft(victim)
        self.queued_tokens += victim.p_len
        self.stats.preemptions += 1
        return True

    def _plan(self, now: float) -> None:
        if not self.alive or not self.warm or self.run is not None or self._guard:
            return
        self._guard = True
        try:
            self._admit(now)
        finally:
            self._guard = False
        n_dec = len(self.decoding)
        if not self.prefilling and n_dec == 0:
            return
        if self.prefilling and not self._mixed:  # a prefill step of its own: decoders wait (no growth)
            self._start_mixed(now, 0, self.max_batch_tokens, with_decode=False)
            return
        # KV room for this iteration's growth (one token per decoder, plus first tokens).
        while n_dec and self.kv_used + self.cache_tokens + n_dec > self.capacity:
            self._evict_cache(n_dec)
            if self.kv_used + self.cache_tokens + n_dec <= self.capacity:
                break
            self._preempt_newest(now)
            n_dec = len(self.decoding)
        budget = self.max_batch_tokens - n_dec
        if self.prefilling and budget > 0:
            self._start_mixed(now, n_dec, budget)
        elif n_dec:
            self._start_decode(now, n_dec)
        elif self.prefilling:  # max_batch_tokens < 1 cannot happen; keep the loop safe
            self._start_mixed(now, 0, max(1, self.max_batch_tokens))

    def _start_mixed(self, now: float, n_dec: int, budget: int, *, with_decode: bool = True) -> None:
        chunks: list[tuple[Req, int]] = []
        ctx = self.ctx_decode if with_decode else 0
        attn = self._attn * ctx
        kv_read = float(ctx)
        total = n_dec
        admitted = 0
        for r in self.prefilling:
            if budget <= 0:
                break
            c = min(r.prefill_left, budget)
            budget -= c
            chunks.append((r, c))
            total += c
            if r.pos == r.cached:
                admitted += 1  # its first chunk: the request enters the engine's batch now
            attn += self._attn * (c * r.pos + c * c / 2.0)
            kv_read += r.pos + c
        spec = self.spec
        comp = compute_s(self._costs, total, attn)
        mem = memory_s(self._costs, kv_read)
        o = spec.overhead_s(
            n_dec + len(chunks),
            total,
            admitted,
            step_s=self._step_s,
            seq_s=self._seq_s,
            admit_s=self._admit_s,
        )
        gpu = roofline(comp, mem)
        if self.runtime.runs_eager(total, prefill=bool(chunks), graph_top=self._graph_top):
            gpu = max(gpu, self._eager_s)
        t = self.degrade * (gpu + o)
        self.run = _Run("mixed", now, now + t, batch=n_dec, chunks=chunks, tokens=total)
        self.version += 1
        self._schedule(now + t, self, self.version)

    def _decode_time(self, run: _Run, n: int) -> float:
        return run.degrade * (n * (run.a + run.o) + run.b * n * (n - 1) / 2.0)

    def _start_decode(self, now: float, n_dec: int) -> None:
        next_done = self._next_done()
        steps = (next_done - self.counter) if next_done is not None else 1
        room = self.capacity - self.kv_used - self.cache_tokens
        if room < n_dec * steps:
            self._evict_cache(n_dec * steps)
            room = self.capacity - self.kv_used - self.cache_tokens
        steps = max(1, min(steps, room // n_dec))
        spec = self.spec
        mem = memory_s(self._costs, self.ctx_decode)
        padded = padded_batch(self._graphs, n_dec)
        comp = compute_s(self._costs, padded, self._attn * self.ctx_decode)
        # A batch past the largest CUDA graph runs eagerly: no step shorter than its launches.
        floor = self._eager_s if n_dec > self._graph_top else 0.0
        first = max(roofline(mem, comp), floor)
        # Every step adds a token to each context: the KV read and the attention FLOPs grow by a
        # fixed amount a step. The run is summed with the chord of the step time from its first to
        # its last step (exact at both ends; the roofline is all but straight in between).
        grow_mem = self._kvb * n_dec / self._bw_kv
        grow_comp = self._attn * n_dec / self._f
        if steps > 1:
            last = max(roofline(mem + grow_mem * (steps - 1), comp + grow_comp * (steps - 1)), floor)
            slope = (last - first) / (steps - 1)
        else:
            slope = max(roofline(mem + grow_mem, comp + grow_comp), floor) - first
        run = _Run(
            "decode",
            now,
            now,
            steps=steps,
            a=first,
            b=slope,
            o=spec.overhead_s(n_dec, n_dec, 0, step_s=self._step_s, seq_s=self._seq_s, admit_s=0.0),
        )
        run.degrade = self.degrade
        run.batch = n_dec
        run.end = now + self._decode_time(run, steps)
        self.run = run
        self.version += 1
        self._schedule(run.end, self, self.version)

    def _truncate(self, now: float) -> None:
        """Cut the current decode run at the first step boundary at or after ``now``."""
        run = self.run
        if run is None or run.kind != "decode" or run.steps <= 1 or now >= run.end:
            return
        elapsed = max(0.0, now - run.start) / run.degrade
        # Solve b/2 n^2 + (a + o - b/2) n = elapsed for n.
        qa = run.b / 2.0
        qb = run.a + run.o - run.b / 2.0
        if qa > 1e-18:
            n_float = (-qb + math.sqrt(qb * qb + 4.0 * qa * elapsed)) / (2.0 * qa)
        else:
            n_float = elapsed / qb if qb > 0 else 0.0
        n_done = max(0, math.floor(n_float + 1e-9))
        steps = min(run.steps, n_done + 1)
        while steps < run.steps and run.start + self._decode_time(run, steps) < now:
            steps += 1
        block = self._block
        if block > 1:  # multi-step scheduling: the engine looks again only at a block's end
            steps = min(run.steps, -(-steps // block) * block)
        if steps >= run.steps:
            return
        run.steps = steps
        run.end = run.start + self._decode_time(run, steps)
        self.version += 1
        self._schedule(run.end, self, self.version)

    # -- completing iterations --------------------------------------------------------------------

    def _finish_decode(self, run: _Run, now: float) -> None:
        n = run.steps
        batch = run.batch
        t = run.end - run.start
        self.counter += n
        self.ctx_decode += batch * n
        self.kv_used += batch * n
        self.acc += t * self._usd_s / batch
        self.stats.output_tokens += batch * n
        self.stats.tbt.append((t / n * 1000.0, float(batch * n)))
        self._complete_due(now)

    def _finish_mixed(self, run: _Run, now: float) -> None:
        t = run.end - run.start
        usd_per_token = t * self._usd_s / run.tokens
        if run.batch:
            self.counter += 1
            self.ctx_decode += run.batch
            self.kv_used += run.batch
            self.acc += usd_per_token
            self.stats.output_tokens += run.batch
            self.stats.tbt.append((t * 1000.0, float(run.batch)))
        for r, c in run.chunks:
            r.cost += usd_per_token * c
            r.prefill_left -= c
            r.pos += c
        self._complete_due(now)
        finished_prefill = [r for r, _ in run.chunks if r.prefill_left == 0 and r.state == "prefill"]
        if finished_prefill:
            ids = {id(r) for r in finished_prefill}
            self.prefilling = [r for r in self.prefilling if id(r) not in ids]
        for r in finished_prefill:
            self.stats.output_tokens += 1
            if r.prefix_digest is not None and r.prefix_tokens > 0 and r.generated == 0 and r.cached == 0:
                self._cache_insert(r, min(r.prefix_tokens, r.p_len))
            r.out_left -= 1
            if r.cancelled:
                self._remove_running(r, now)
                continue
            if r.first_token_t is None:
                r.first_token_t = now
                self.stats.prompt_tokens += r.prompt
                self.stats.ttft_ms.append((now - r.submit_t) * 1000.0)
                self.listener.on_first_token(r, now)
            if r.out_left <= 0:
                self.kv_used -= r.p_len - r.cached
                self._unpin(r)
                r.generated += 1
                r.state = "done"
                self.stats.completed += 1
                self.listener.on_finish(r, now)
                continue
            r.state = "decode"
            r.join_counter = self.counter
            r.join_acc = self.acc
            r.done_at = self.counter + r.out_left
            self.kv_used += 1
            self.ctx_decode += r.p_len + 1
            self.decoding[r.rid] = r
            self._sum_done_at += r.done_at
            heapq.heappush(self._done_heap, (r.done_at, r.admitted_seq, r.rid))
            newest = self._newest_heap
            if len(newest) > 2 * len(self.decoding) + 64:  # mostly stale: rebuild it
                newest[:] = [(-q.admitted_seq, q.rid) for q in self.decoding.values()]
                heapq.heapify(newest)
            else:
                heapq.heappush(newest, (-r.admitted_seq, r.rid))

    def _cache_insert(self, r: Req, tokens: int) -> None:
        """``r`` computed its prefix: its first ``tokens`` KV tokens become the shared cache entry
        (moved from its own KV, so they are counted once) and ``r`` pins it while it runs. If
        another request created the entry meanwhile, ``r`` keeps its own copy (as vLLM does for
        blocks computed twice concurrently) and only refreshes the entry's recency."""
        digest = r.prefix_digest
        assert digest is not None
        if digest in self.cache:
            self.cache.move_to_end(digest)
            return
        self.cache[digest] = tokens
        self.cache_tokens += tokens
        self.kv_used -= tokens
        r.cached = tokens
        self._pin(digest)

    def _pin(self, digest: str) -> None:
        self._pins[digest] = self._pins.get(digest, 0) + 1

    def _unpin(self, r: Req) -> None:
        digest = r.prefix_digest
        if r.cached <= 0 or digest is None:
            return
        left = self._pins.get(digest, 0) - 1
        if left > 0:
            self._pins[digest] = left
        else:
            self._pins.pop(digest, None)

    def _complete_due(self, now: float) -> None:
        while True:
            done_at = self._next_done()
            if done_at is None or done_at > self.counter:
                return
            _, _, rid = heapq.heappop(self._done_heap)
            r = self.decoding[rid]
            self._remove_running(r, now)
            if not r.cancelled:
                self.stats.completed += 1
                self.listener.on_finish(r, now)

    def _remove_running(self, r: Req, now: float) -> None:
        """Take a running request out and settle its cost (waste if the client already left)."""
        if r.state == "decode":
            gen_since = self.counter - r.join_counter
            ctx = r.p_len + 1 + gen_since
            self.ctx_decode -= ctx
            self.kv_used -= ctx - r.cached
            r.cost += self.acc - r.join_acc
            r.generated += 1 + gen_since
            if self.decoding.pop(r.rid, None) is not None:
                self._sum_done_at -= r.done_at
        elif r.state == "prefill":
            self.kv_used -= r.p_len - r.cached
            if r in self.prefilling:
                self.prefilling.remove(r)
        if r.state in ("decode", "prefill"):
            self._unpin(r)
        r.state = "done"
        self._settle_abandoned(r)

    def _settle_abandoned(self, r: Req) -> None:
        """A request its client left (cancelled or orphaned): what it cost after that is waste."""
        if r.cancelled or r.orphaned:
            extra = r.cost - r.reported_cost
            if extra > 0:
                self.listener.on_waste(r, extra)

    def _sweep_cancelled(self) -> None:
        """Take every cancelled request out of the batch; skipped when none can be cancelled."""
        if not self._cancelled_hint:  # no running request is cancelled: both scans find nothing
            return
        self._cancelled_hint = 0
        for r in [r for r in self.prefilling if r.cancelled]:
            self._remove_running(r, 0.0)
        for r in sorted((r for r in self.decoding.values() if r.cancelled), key=lambda r: r.rid):
            self._remove_running(r, 0.0)
