"""Generated fleets that misbehave, for holding the decide tick's fast paths to their plain forms.

:func:`perturbed_snapshots` folds a :mod:`fleetloop.bench.fleetgen` fleet through the real model and
yields one snapshot per tick while nodes cycle cold -> loading -> warm, drain, go silent (stale, then
forgotten: they leave their pool and come back), lose their step or first-token figures, report
hostile values the schema accepts (no free HBM, zero step time, huge queues), fail bursts of calls,
and a whole pool goes silent and another joins late.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from fleetloop.bench.fleetgen import BASE_TS_MS, make_fleet, outcomes_at, telemetry_at
from fleetloop.core.model.fleet import FleetModel, ModelConfig, snapshot
from fleetloop.policies.base import FleetSnapshot


def perturbed_snapshots(n_nodes: int, ticks: int, seed: int = 11) -> Iterator[FleetSnapshot]:
    fleet = make_fleet(n_nodes, seed=seed, degraded_per_1000=40.0)
    pools = sorted(fleet.pool_ids)
    model = FleetModel(ModelConfig(forget_node_after_ms=6_000))
    rng = np.random.default_rng(seed)
    kind = rng.integers(0, 16, fleet.n_nodes)
    row = {node_id: i for i, node_id in enumerate(fleet.node_ids)}
    silent_pool, late_pool = pools[0], pools[-1]
    ts = BASE_TS_MS
    for k in range(ticks):
        ts += 1000
        for i, t in enumerate(telemetry_at(fleet, ts)):
            kk = int(kind[i])
            upd: dict[str, object] = {}
            if kk == 0:
                upd["weights_state"] = ("cold", "loading", "warm")[(k // 4) % 3]
            elif kk == 1 and (k // 3) % 2:
                upd["draining"] = True
            elif kk == 2 and (k // 9) % 2:
                continue  # silent: stale after 5 s, forgotten after 6 s, back later
            elif kk == 3 and k % 3:
                upd["tbt_p50_ms"] = None
                upd["tbt_p99_ms"] = None
            elif kk == 4:
                upd["ttft_p99_ms"] = None
            elif kk == 5 and k % 2:
                upd["hbm_free_gib"] = 0.0
                upd["tbt_p50_ms"] = 0.0
            elif kk == 6:
                upd["queue_depth"] = 10**9
                upd["queued_prompt_tokens"] = 10**12
                upd["kv_cache_used_frac"] = 1.0
            elif kk == 7 and k % 4 == 0:
                upd["tbt_p50_ms"] = (t.tbt_p50_ms or 1.0) * 9.0
            elif kk == 8 and (k // 5) % 2:
                upd["timeouts"] = 2  # and its calls fail below: no first token in the window
            elif kk == 9 and (k // 3) % 3 == 0:
                upd["tbt_p50_ms"] = (t.tbt_p50_ms or 1.0) * 6.0  # slow for three ticks in nine
                upd["ttft_p99_ms"] = (t.ttft_p99_ms or 1.0) * 6.0
            if t.pool_id == silent_pool and 6 <= k < 14:
                continue
            if t.pool_id == late_pool and k < 5:
                continue
            model.fold_telemetry(t.model_copy(update=upd) if upd else t)
        for o in outcomes_at(fleet, ts, per_node=1.5, workflow_base=k * n_nodes * 4):
            if kind[row[o.node_id]] == 8 and (k // 5) % 2:
                o = o.model_copy(update={"outcome": "error", "ttft_ms": None, "task_outcome": None})
            model.fold_outcome(o)
        yield snapshot(model, ts, window_ms=10_000, stale_after_ms=5_000)
