"""The node's fast forms equal their statements, bit for bit, on generated request sequences.

``Node`` skips ``_sweep_cancelled``'s scans when no running request can be cancelled, finds the
preemption victim on a heap and evicts prefixes without copying the cache's keys; ``PlainNode``
runs the statements. Both are fed the same generated sequence of submissions (small KV, so
preemption is frequent; shared prefixes), cancellations, abandonments, degradations, crashes and
events, and every callback, every request's fields and the node's books must be equal after every
step."""

from __future__ import annotations

import heapq
import math
from dataclasses import astuple
from typing import Any

import numpy as np
import pytest
from fleetloop.perf.catalog import node_spec
from fleetloop.sim.node import Node, Req


class PlainNode(Node):
    """The node with its fast forms' statements."""

    def _sweep_cancelled(self) -> None:
        """Take every cancelled request out of the batch (every time: no hint)."""
        for r in [r for r in self.prefilling if r.cancelled]:
            self._remove_running(r, 0.0)
        for r in sorted((r for r in self.decoding.values() if r.cancelled), key=lambda r: r.rid):
            self._remove_running(r, 0.0)

    def _newest_decoding(self) -> Req:
        """The decoding request admitted last (``decoding`` is not empty)."""
        return max(self.decoding.values(), key=lambda r: r.admitted_seq)

    def _evict_cache(self, need: int, keep: str | None = None) -> None:
        """Evict LRU prefixes until ``need`` more KV tokens fit (never ``keep``, never a pinned one)."""
        for digest in list(self.cache):
            if self.kv_used + self.cache_tokens + need <= self.capacity:
                return
            if digest == keep or self._pins.get(digest, 0) > 0:
                continue
            self.cache_tokens -= self.cache.pop(digest)


def _fields(r: Req) -> tuple[Any, ...]:
    return tuple(getattr(r, f) for f in Req.__slots__ if f != "owner")


class _Rig:
    """One node on its own event loop, recording everything it tells the world."""

    def __init__(self, cls: type[Node], *, capacity: int, max_batch_tokens: int) -> None:
        self.heap: list[tuple[float, int, int]] = []
        self.seq = 0
        self.log: list[tuple[Any, ...]] = []
        self.reqs: dict[int, Req] = {}
        self.node = cls(
            "p/0",
            "p",
            node_spec("llama-8b", "L40S"),
            self,
            self._schedule,
            now=0.0,
            warm=True,
            max_batch_tokens=max_batch_tokens,
        )
        self.node.capacity = capacity

    def _schedule(self, t: float, node: Node, version: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, version))

    def on_first_token(self, req: Req, t: float) -> None:
        self.log.append(("first", req.rid, t))

    def on_finish(self, req: Req, t: float) -> None:
        self.log.append(("finish", req.rid, t))

    def on_lost(self, req: Req, t: float) -> None:
        self.log.append(("lost", req.rid, t))

    def on_waste(self, req: Req, usd: float) -> None:
        self.log.append(("waste", req.rid, usd))

    def run_until(self, t_end: float) -> None:
        while self.heap and self.heap[0][0] <= t_end:
            now, _, version = heapq.heappop(self.heap)
            self.node.on_event(now, version)

    def books(self) -> tuple[Any, ...]:
        n = self.node
        return (
            n.kv_used,
            n.ctx_decode,
            n.counter,
            n.acc,
            n.cache_tokens,
            tuple(n.cache.items()),
            tuple(r.rid for r in n.waiting),
            tuple(r.rid for r in n.prefilling),
            tuple(n.decoding),
            n.version,
            astuple(n.stats),
            None if n.run is None else (n.run.kind, n.run.start, n.run.end, n.run.steps),
            tuple(_fields(r) for r in self.live()),
        )

    def live(self) -> list[Req]:
        """Requests not yet done (a done request's fields are compared once, at the end)."""
        return [r for r in self.reqs.values() if r.state != "done"]


def _actions(seed: int, n: int) -> list[tuple[Any, ...]]:
    rng = np.random.default_rng(seed)
    out: list[tuple[Any, ...]] = []
    t = 0.0
    rid = 0
    digests = 4 if seed % 2 == 0 else 60  # few shared prefixes, or many (a long LRU to evict from)
    for _ in range(n):
        t += float(rng.exponential(0.05))
        k = float(rng.random())
        if k < 0.45:
            rid += 1
            digest = f"d{int(rng.integers(0, digests))}" if rng.random() < 0.6 else None
            prompt = int(rng.integers(1, 1500))
            output = int(rng.integers(1, 2000))
            out.append(("submit", t, rid, prompt, output, digest, int(rng.integers(0, prompt))))
        elif k < 0.75 and rid:
            out.append(("cancel", t, int(rng.integers(1, rid + 1))))
        elif k < 0.82 and rid:
            out.append(("abandon", t, int(rng.integers(1, rid + 1))))
        elif k < 0.86:
            out.append(("degrade", t, float(rng.choice([1.0, 3.0, 0.5]))))
        elif k < 0.88:
            out.append(("crash", t))
        else:
            out.append(("run", t))
    out.append(("run", math.inf))
    return out


def _play(cls: type[Node], actions: list[tuple[Any, ...]], capacity: int, mbt: int) -> list[tuple[Any, ...]]:
    rig = _Rig(cls, capacity=capacity, max_batch_tokens=mbt)
    trace: list[tuple[Any, ...]] = []
    for a in actions:
        kind, t = a[0], a[1]
        rig.run_until(t)
        node = rig.node
        if kind == "submit":
            _, _, rid, prompt, output, digest, prefix = a
            r = Req(rid, prompt, output, digest, prefix if digest else 0)
            rig.reqs[rid] = r
            node.submit(r, t)
        elif kind == "cancel":
            node.cancel(rig.reqs[a[2]], t)
        elif kind == "abandon":
            node.abandon(rig.reqs[a[2]])
        elif kind == "degrade":
            node.set_degrade(a[2], t)
        elif kind == "crash":
            node.crash(t, keep_alive=True)
            node.set_weights_state("warm", t)
        trace.append((a, rig.books(), tuple(rig.log)))
        rig.log.clear()
    trace.append(("end", tuple(_fields(r) for _, r in sorted(rig.reqs.items()))))
    return trace


@pytest.mark.parametrize("seed", range(12))
def test_fast_node_equals_the_statements_on_generated_sequences(seed: int) -> None:
    actions = _actions(seed, 600)
    capacity = [4_000, 9_000, 30_000][seed % 3]  # small KV: preemption and eviction all the time
    mbt = [512, 2048, 8192][(seed // 3) % 3]
    fast = _play(Node, actions, capacity, mbt)
    plain = _play(PlainNode, actions, capacity, mbt)
    assert len(fast) == len(plain)
    for i, (f, p) in enumerate(zip(fast, plain, strict=True)):
        assert f == p, f"step {i}: {f[0]}"


def test_the_generated_sequences_reach_every_path() -> None:
    """Preemption with several decoding requests, cancellation of running requests, and both
    skipped and full sweeps happen in these sequences (else the equality above proves little)."""
    counts = {"preempt": 0, "preempt_choice": 0, "swept": 0, "skipped": 0, "cancel_running": 0, "evicted": 0}

    class Counting(Node):
        def _newest_decoding(self) -> Req:
            counts["preempt"] += 1
            counts["preempt_choice"] += len(self.decoding) > 1
            return Node._newest_decoding(self)

        def _evict_cache(self, need: int, keep: str | None = None) -> None:
            before = len(self.cache)
            Node._evict_cache(self, need, keep)
            counts["evicted"] += before - len(self.cache)

        def _sweep_cancelled(self) -> None:
            running = [*self.prefilling, *self.decoding.values()]
            counts["cancel_running"] += any(r.cancelled for r in running)
            counts["swept" if self._cancelled_hint else "skipped"] += 1
            Node._sweep_cancelled(self)

    for seed in range(4):
        _play(Counting, _actions(seed, 600), [4_000, 9_000, 30_000, 30_000][seed], 2048)
    assert counts["preempt_choice"] > 20
    assert counts["cancel_running"] > 20
    assert counts["skipped"] > 100
    assert counts["evicted"] > 40
