"""Test helpers: drive one Node on its own tiny event loop (no fleet, no router)."""

from __future__ import annotations

import heapq

from fleetloop.perf.catalog import NodeSpec
from fleetloop.sim.node import Node, Req


class Recorder:
    def __init__(self) -> None:
        self.first: dict[int, float] = {}
        self.finish: dict[int, float] = {}
        self.lost: dict[int, float] = {}
        self.waste = 0.0

    def on_first_token(self, req: Req, t: float) -> None:
        self.first[req.rid] = t

    def on_finish(self, req: Req, t: float) -> None:
        self.finish[req.rid] = t

    def on_lost(self, req: Req, t: float) -> None:
        self.lost[req.rid] = t

    def on_waste(self, req: Req, usd: float) -> None:
        self.waste += usd


class Loop:
    """A minimal event loop around one node."""

    def __init__(self, spec: NodeSpec, *, max_batch_tokens: int = 8192, warm: bool = True) -> None:
        self.heap: list[tuple[float, int, int]] = []
        self.seq = 0
        self.rec = Recorder()
        self.node = Node(
            "p/0", "p", spec, self.rec, self._schedule, now=0.0, warm=warm, max_batch_tokens=max_batch_tokens
        )

    def _schedule(self, t: float, node: Node, version: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, version))

    def run_until(self, t_end: float = 1e9) -> float:
        now = 0.0
        while self.heap and self.heap[0][0] <= t_end:
            now, _, version = heapq.heappop(self.heap)
            self.node.on_event(now, version)
        return now


def batch(spec: NodeSpec, n: int, prompt: int, output: int, **kw: object) -> tuple[Loop, list[Req]]:
    """Submit ``n`` identical requests at t=0 and run to completion."""
    loop = Loop(spec, **kw)  # type: ignore[arg-type]
    reqs = [Req(i + 1, prompt, output, None, 0) for i in range(n)]
    for r in reqs:
        loop.node.submit(r, 0.0)
    loop.run_until()
    return loop, reqs
