"""Generated fleets for the benchmarks: pools of 16-64 nodes, several GPU types, models and regions.

Deterministic per seed (a numpy ``Generator``). Node figures move every second like a loaded fleet's:
queues and running sequences fluctuate, a few nodes per thousand are degraded (their step time several
times their pool's, so the breaker has work to do), every node lists a few hot prefixes out of its
pool's set. Routers' outcomes are spread over the nodes with workflows of several calls each.

Records are built with ``model_construct`` (the values are valid by construction); the ingest
benchmark serializes them and the daemon path validates them as it would any producer's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.telemetry import NodeTelemetry

# gpu type -> (gpus per node, step ms for the pool's model, $ per node-hour)
GPUS: dict[str, tuple[int, float, float]] = {
    "H100": (4, 22.0, 11.96),
    "H200": (4, 18.0, 14.36),
    "A100": (4, 38.0, 5.56),
    "L40S": (1, 30.0, 0.79),
    "MI300X": (2, 24.0, 3.98),
}
MODELS = ("llama-70b", "llama-8b", "qwen-32b", "mixtral-8x7b")
REGIONS = ("us-east", "us-west", "eu-west", "ap-south")
BASE_TS_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: event time starts here


@dataclass(frozen=True, slots=True)
class Pool:
    pool_id: str
    model: str
    gpu_type: str
    node_ids: tuple[str, ...]


@dataclass(slots=True)
class Fleet:
    pools: tuple[Pool, ...]
    node_pool: np.ndarray  # node index -> pool index
    step_ms: np.ndarray  # node index -> its base step time (degraded nodes several times their pool's)
    rng: np.random.Generator
    node_ids: tuple[str, ...] = ()  # node index -> node id

    @property
    def n_nodes(self) -> int:
        return int(self.node_pool.size)

    @property
    def pool_ids(self) -> tuple[str, ...]:
        return tuple(p.pool_id for p in self.pools)


def make_fleet(n_nodes: int, seed: int = 7, degraded_per_1000: float = 3.0) -> Fleet:
    """Pools of 16-64 nodes until ``n_nodes`` are placed (the last pool takes the remainder)."""
    rng = np.random.default_rng(seed)
    pools: list[Pool] = []
    placed = 0
    gpus = sorted(GPUS)
    while placed < n_nodes:
        size = min(int(rng.integers(16, 65)), n_nodes - placed)
        i = len(pools)
        gpu = gpus[int(rng.integers(len(gpus)))]
        model = MODELS[int(rng.integers(len(MODELS)))]
        region = REGIONS[i % len(REGIONS)]
        pool_id = f"{region}-{gpu.lower()}-{model}-{i:04d}"
        pools.append(Pool(pool_id, model, gpu, tuple(f"{pool_id}/n{j:02d}" for j in range(size))))
        placed += size
    node_pool = np.concatenate([np.full(len(p.node_ids), i) for i, p in enumerate(pools)])
    base = np.array([GPUS[pools[i].gpu_type][1] for i in node_pool], dtype=float)
    degraded = rng.random(n_nodes) < degraded_per_1000 / 1000.0
    step = base * rng.uniform(0.9, 1.1, n_nodes) * np.where(degraded, rng.uniform(4.0, 8.0, n_nodes), 1.0)
    node_ids = tuple(n for p in pools for n in p.node_ids)
    return Fleet(tuple(pools), node_pool, step, rng, node_ids)


def telemetry_at(fleet: Fleet, ts_ms: int) -> Iterator[NodeTelemetry]:
    """One report per node for the second ending at ``ts_ms``."""
    rng = fleet.rng
    n = fleet.n_nodes
    queue = rng.poisson(1.5, n)
    running = rng.integers(4, 48, n)
    kv = rng.uniform(0.1, 0.95, n)
    tbt = fleet.step_ms * rng.uniform(0.85, 1.15, n)
    errors = rng.poisson(0.02, n)
    prefixes = rng.integers(0, 32, (n, 4))
    i = 0
    for pool in fleet.pools:
        gpu_count, _, price = GPUS[pool.gpu_type]
        for node_id in pool.node_ids:
            t = float(tbt[i])
            yield NodeTelemetry.model_construct(
                ts_ms=ts_ms,
                node_id=node_id,
                pool_id=pool.pool_id,
                model=pool.model,
                gpu_type=pool.gpu_type,
                gpu_count=gpu_count,
                weights_state="warm",
                draining=False,
                interval_ms=1000,
                ttft_p50_ms=t * 12.0,
                ttft_p99_ms=t * 40.0,
                tbt_p50_ms=t,
                tbt_p99_ms=t * 2.5,
                queue_depth=int(queue[i]),
                running_requests=int(running[i]),
                queued_prompt_tokens=int(queue[i]) * 1500,
                kv_cache_used_frac=float(kv[i]),
                hbm_free_gib=float(80.0 * (1.0 - kv[i])),
                gpu_util_frac=float(min(1.0, running[i] / 48.0)),
                prefix_cache_hit_frac=0.4,
                hot_prefixes=tuple(f"px-{pool.pool_id}-{k}" for k in sorted(set(prefixes[i].tolist()))),
                max_batch_tokens=8192,
                errors=int(errors[i]),
                timeouts=0,
                preemptions=0,
                requests_completed=int(running[i]) // 4,
                prompt_tokens=int(running[i]) * 400,
                output_tokens=int(running[i]) * 60,
                cost_rate_usd_per_h=price,
            )
            i += 1


def outcomes_at(
    fleet: Fleet, ts_ms: int, per_node: float = 1.0, *, workflow_base: int = 0, open_only: bool = False
) -> Iterator[RequestOutcome]:
    """About ``per_node`` router outcomes per node for the second ending at ``ts_ms``.

    Workflows run eight calls; the eighth says whether the task succeeded (unless ``open_only``,
    which leaves every workflow open: the ledger's worst case)."""
    rng = fleet.rng
    n = fleet.n_nodes
    counts = rng.poisson(per_node, n)
    total = int(counts.sum())
    nodes = np.repeat(np.arange(n), counts)
    fail = rng.random(total) < np.where(fleet.step_ms[nodes] > 60.0, 0.2, 0.01)
    ttft = fleet.step_ms[nodes] * rng.uniform(8.0, 30.0, total)
    offsets = rng.integers(0, 1000, total)
    for k in range(total):
        i = int(nodes[k])
        pool = fleet.pools[int(fleet.node_pool[i])]
        seq = workflow_base + k
        step = seq % 8
        failed = bool(fail[k])
        yield RequestOutcome.model_construct(
            ts_ms=ts_ms - 999 + int(offsets[k]),
            request_id=f"r{ts_ms}-{k}",
            attempt=0,
            workflow_id=f"wf-{seq // 8}" if not open_only else f"wf-{seq}",
            step_index=step if not open_only else 0,
            workflow_spend_usd=0.001 * step,
            tenant_id=f"tenant-{seq % 16}",
            priority=int(seq % 3),
            latency_budget_ms=30_000,
            pool_id=pool.pool_id,
            node_id=fleet.node_ids[i],
            model=pool.model,
            prompt_tokens=2000,
            cached_prompt_tokens=1500,
            output_tokens=200,
            prefix_digest=None,
            ttft_ms=None if failed else float(ttft[k]),
            e2e_ms=float(ttft[k]) * 4.0,
            outcome="error" if failed else "ok",
            cost_usd=0.0004,
            task_outcome=("failed" if failed else "succeeded") if step == 7 and not open_only else None,
        )
