"""llm-d's endpoint picker (EPP), per call: three scorers, their weights, a max-score pick, and the
EPP's approximate prefix index.

The router runs this when a routing decision names ``picker="llm-d-epp"`` (the ``llm-d`` baseline,
:mod:`fleetloop.policies.routing.llm_d`). It is written from llm-d's public source
(llm-d/llm-d-inference-scheduler, now llm-d-router, commit 520af478 of 2026-05-17; the paths below
are that repository's) and from the gateway-api-inference-extension it grew out of (tag v1.3.0,
commit 616745e9, the chart the llm-d inference-scheduling guide pinned). No code is copied.

Per call, over the candidates the router holds eligible (weight > 0, not draining, not ejected):

- **queue-scorer** (``pkg/epp/framework/plugins/scheduling/scorer/queuedepth/queue.go``): min-max
  normalization of each endpoint's waiting queue (vLLM ``num_requests_waiting``)::

      s_queue_i = (max_j q_j - q_i) / (max_j q_j - min_j q_j)     (1 for every i when all are equal)

- **kv-cache-utilization-scorer** (``.../scorer/kvcacheutilization/kvcache_utilization.go``)::

      s_kv_i = 1 - kv_cache_usage_i

- **prefix-cache-scorer** (``.../scorer/prefix/plugin.go``) over the approximate prefix producer's
  match (``pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/``)::

      s_prefix_i = matched_blocks_i / total_blocks                (0 when the prompt has no block)

  The producer cuts the prompt into blocks of ``block_size_tokens`` (16: vLLM's block size, which
  ``autoTune`` reads from the engine; the prompt's characters at 4 per token), hashes at most
  ``max_prefix_blocks`` (256) of them, each chained to the one before, the trailing partial block
  included, none for a prompt shorter than one block. ``matched_blocks_i`` counts the leading
  blocks, in order, that the index holds for endpoint ``i``. After the pick (``PreRequest``), every
  block of the prompt is added to the picked endpoint's LRU, whose capacity is the engine's number
  of KV blocks (``autoTune``; 31 250 when the engine reports none).

- **weights** (``pkg/epp/config/loader/defaults.go``, ``loadDefaultConfig``; the same profile as
  the charts' ``default-plugins.yaml``): queue 2, KV-cache utilization 2, prefix cache 3, each score
  clipped to [0, 1] and summed with its weight (``pkg/epp/scheduling/scheduler_profile.go``).
- **picker** (``.../scheduling/picker/maxscore/picker.go``, added by ``ensureSchedulingLayer`` when a
  profile names none): the highest total; ties broken uniformly at random (the EPP shuffles the
  candidates, then sorts stably by score). Here the router's seeded generator draws among the tied
  endpoints, so a run is reproducible.

How the simulator's request model fits the index (the gaps): a call there is a shared prefix (one
digest per task, the same tokens in every call of the task) followed by tokens of its own, so the
index keeps, per endpoint, groups of blocks: the task's prefix blocks under its digest (the full
blocks inside the prefix; the block the prefix ends in holds the call's own tokens) and each call's
own blocks as a group nothing else matches. A group is evicted whole, oldest first. In the EPP each
block is an LRU entry and a request's blocks enter in prompt order, so a prefix's first block is
its oldest and is evicted first; after that nothing of the prefix matches, so a whole group's
eviction loses the same matches, and frees its blocks a little earlier than the EPP would. Tokens
stand for characters (4 per token exactly; the EPP hashes the request's JSON). In a real agent
conversation each call's prompt holds the previous call's, so the EPP matches more than a shared
system prompt; the simulator's engines cache only the shared prefix, and the index matches what
they can hit. The engines' queue and KV figures are read at the call (the EPP's are up to one
50 ms scrape old). A model's calls are split across its pools by the router first, as for every
baseline, then picked within the pool: one InferencePool, and one EPP, per pool.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

#: ``defaultLRUCapacityPerServer``: index entries per endpoint when the engine reports no KV blocks.
DEFAULT_LRU_CAPACITY = 31_250


@dataclass(frozen=True, slots=True)
class EppProfile:
    """A scheduling profile: its scorers' weights and the prefix producer's parameters. The
    defaults are llm-d's default profile, which is what the router runs for ``llm-d-epp`` (they
    are the EPP's configuration, not the control plane's, as Envoy's ``choice_count`` is for
    ``least-request-p2c``)."""

    queue_weight: float = 2.0
    kv_cache_weight: float = 2.0
    prefix_cache_weight: float = 3.0
    block_size_tokens: int = 16
    max_prefix_blocks: int = 256  # 0: no limit
    lru_capacity_per_server: int = 0  # 0: the engine's KV blocks (autoTune), else this many

    def lru_blocks(self, kv_capacity_tokens: int) -> int:
        """An endpoint's index capacity in blocks."""
        if self.lru_capacity_per_server > 0:
            return self.lru_capacity_per_server
        if kv_capacity_tokens > 0:
            return max(1, kv_capacity_tokens // self.block_size_tokens)
        return DEFAULT_LRU_CAPACITY


def _clip(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


def queue_scores(waiting: Sequence[int]) -> list[float]:
    """queue-scorer: the shortest queue 1, the longest 0, linear between; all 1 when all are equal."""
    if not waiting:
        return []
    lo, hi = min(waiting), max(waiting)
    if hi == lo:
        return [1.0] * len(waiting)
    return [(hi - q) / (hi - lo) for q in waiting]


def kv_cache_scores(used: Sequence[float]) -> list[float]:
    """kv-cache-utilization-scorer: the free share of the KV cache, clipped to [0, 1]."""
    return [_clip(1.0 - u) for u in used]


def prefix_cache_scores(matched: Sequence[int], total_blocks: int) -> list[float]:
    """prefix-cache-scorer: the share of the prompt's blocks each endpoint is thought to hold."""
    if total_blocks <= 0:
        return [0.0] * len(matched)
    return [_clip(m / total_blocks) for m in matched]


def prompt_blocks(prompt_tokens: int, prefix_tokens: int, profile: EppProfile) -> tuple[int, int]:
    """(blocks hashed, of which inside the shared prefix) for a prompt whose first ``prefix_tokens``
    tokens are its task's shared prefix."""
    bs = profile.block_size_tokens
    if prompt_tokens < bs:
        return 0, 0
    hashed = prompt_tokens
    if profile.max_prefix_blocks > 0:
        hashed = min(hashed, bs * profile.max_prefix_blocks)
    total = math.ceil(hashed / bs)
    return total, min(max(0, prefix_tokens) // bs, total)


def max_score_pick(scores: Sequence[float], rng: np.random.Generator) -> int:
    """max-score-picker: the index of the highest score, a tie drawn uniformly (no draw without one)."""
    best = max(scores)
    tied = [i for i, s in enumerate(scores) if s == best]
    if len(tied) == 1:
        return tied[0]
    return tied[int(rng.integers(len(tied)))]


class PrefixIndex:
    """The EPP's approximate prefix index: per endpoint, an LRU of block groups (see the module
    docstring): a task's prefix blocks under its digest, each call's own blocks under a fresh key.
    It learns only from the router's own picks, never from the engines, as the EPP's does."""

    __slots__ = ("_lru", "_seq", "_used")

    def __init__(self) -> None:
        self._lru: dict[str, OrderedDict[str | int, int]] = {}
        self._used: dict[str, int] = {}
        self._seq = 0

    def matched(self, node_id: str, digest: str | None, prefix_blocks: int) -> int:
        """Leading blocks of a prompt (``prefix_blocks`` of them its task's prefix) held for ``node_id``."""
        if digest is None or prefix_blocks <= 0:
            return 0
        lru = self._lru.get(node_id)
        if lru is None:
            return 0
        return min(lru.get(digest, 0), prefix_blocks)

    def record(
        self, node_id: str, digest: str | None, prefix_blocks: int, total_blocks: int, capacity_blocks: int
    ) -> None:
        """The prompt went to ``node_id``: its blocks become the most recent there, the oldest
        groups leave while the endpoint holds more than ``capacity_blocks``."""
        lru = self._lru.get(node_id)
        if lru is None:
            lru = self._lru[node_id] = OrderedDict()
        used = self._used.get(node_id, 0)
        shared = prefix_blocks if digest is not None else 0
        if shared > 0:
            assert digest is not None
            old = lru.pop(digest, 0)
            held = max(old, shared)
            lru[digest] = held
            used += held - old
        own = total_blocks - shared
        if own > 0:
            self._seq += 1
            lru[self._seq] = own
            used += own
        while used > capacity_blocks and lru:
            used -= lru.popitem(last=False)[1]
        self._used[node_id] = used

    def held_blocks(self, node_id: str) -> int:
        return self._used.get(node_id, 0)

    def forget(self, node_id: str) -> None:
        """Drop an endpoint that left (the EPP's inactive-pod clean-up)."""
        self._lru.pop(node_id, None)
        self._used.pop(node_id, None)


N = TypeVar("N")
EngineFigures = Callable[[N], tuple[float, int]]  # node -> (KV cache used fraction, KV capacity tokens)


class EppScheduler:
    """One router's EPP: its profile, its prefix index and the per-call pick."""

    __slots__ = ("index", "profile")

    def __init__(self, profile: EppProfile | None = None) -> None:
        self.profile = profile if profile is not None else EppProfile()
        self.index = PrefixIndex()

    def pick(  # noqa: PLR0917 - the call's figures
        self,
        nodes: Sequence[N],
        node_ids: Sequence[str],
        waiting: Sequence[int],
        engine: Sequence[tuple[float, int]],
        digest: str | None,
        prompt_tokens: int,
        prefix_tokens: int,
        rng: np.random.Generator,
    ) -> N:
        """Score ``nodes`` (ids, waiting queues and engine figures alongside), pick the best, and
        record the prompt's blocks for it."""
        prof = self.profile
        total, shared = prompt_blocks(prompt_tokens, prefix_tokens, prof)
        q = queue_scores(waiting)
        kv = kv_cache_scores([u for u, _ in engine])
        matched = [self.index.matched(i, digest, shared) for i in node_ids]
        px = prefix_cache_scores(matched, total)
        wq, wk, wp = prof.queue_weight, prof.kv_cache_weight, prof.prefix_cache_weight
        scores = [wq * a + wk * b + wp * c for a, b, c in zip(q, kv, px, strict=True)]
        k = max_score_pick(scores, rng)
        if total > 0:
            self.index.record(node_ids[k], digest, shared, total, prof.lru_blocks(engine[k][1]))
        return nodes[k]
