"""The peers' autoscaler in ``fleetloop bench stack``, wired as the bench wires it: the peer arms'
built-in policy (``modern``: KEDA on the engine's queue and KV, one HPA with Kubernetes' default
behavior) compiled and run by the daemon's engine over the telemetry ``fleetloop scrape`` makes of
the stack scenarios' 24 idle nodes. It scales in, but only once HPA's 300 s scale-down
stabilization has passed since its first sync: longer than a bench run's load and drain, which the
bench says (and why, in smoke runs, the peers never left 24 nodes while fleetloop scaled in)."""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.bench.stack import report
from fleetloop.bench.stack.arms import ARMS, BY_NAME, peer_scale_in_hold_s
from fleetloop.core.decide.engine import Engine
from fleetloop.core.model import FleetModel, apply, snapshot
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas import AutoscaleDecision, Tick
from fleetloop.sim.scenario import load_scenario
from tests.support.records import telemetry

T = 1_700_000_000_000
PEERS = sorted({a.policy for a in ARMS if not a.fleetloop})


def _pool() -> tuple[str, int, int]:
    pool = load_scenario("scenarios/stack/degraded-gpu.yaml").pools[0]
    return pool.id, pool.nodes, pool.min_nodes


def _idle(pool_id: str, n: int, now: int) -> list[Any]:
    """What the scraper makes of an emulated node with nothing to do (warm, fresh, no queue, no KV)."""
    return [
        telemetry(f"{pool_id}/{i}", pool_id, ts_ms=now, queue_depth=0, running_requests=0,
                  kv_cache_used_frac=0.0, gpu_util_frac=0.0)
        for i in range(n)
    ]  # fmt: skip


def _targets(policy: str, seconds: int) -> dict[int, int]:
    """Second -> the autoscale target the daemon publishes on ``policy`` over idle nodes."""
    pool_id, nodes, _ = _pool()
    engine, model = Engine(builtin_policy(policy)), FleetModel()
    out: dict[int, int] = {}
    for k in range(1, seconds + 1):
        now = T + k * 1_000
        apply(model, _idle(pool_id, nodes, now))
        result = engine.tick(snapshot(model, now), Tick(ts_ms=now, tick_id=k, pool_id=pool_id))
        for d in result.decisions:
            if isinstance(d.body, AutoscaleDecision) and d.body.pool_id == pool_id:
                out[k] = d.body.desired_nodes
    return out


def test_the_peers_use_kedas_documented_windows_unshortened() -> None:
    assert PEERS == ["modern"]
    autoscale = builtin_policy("modern").sections["autoscale"]
    assert autoscale.algorithm.name == "keda-engine"
    params: Any = autoscale.params
    assert params.scale_down.stabilization_window_s == 300  # HPA's default, as a KEDA deployment runs it
    assert params.sync_period_ms == 15_000
    assert peer_scale_in_hold_s(list(ARMS)) == 300.0
    assert peer_scale_in_hold_s([a for a in ARMS if a.fleetloop]) is None


@pytest.mark.parametrize("policy", PEERS)
def test_peers_keep_every_node_for_the_stabilization_window_then_scale_in(policy: str) -> None:
    _, nodes, _ = _pool()
    targets = _targets(policy, 360)
    first = min(targets)  # its first sync: the HPA records the nodes it found as its first proposal
    assert targets[first] == nodes
    held = {t for k, t in targets.items() if k < first + 300}
    assert held == {nodes}, "idle nodes, yet no scale-in inside the window"
    after = [t for k, t in targets.items() if k >= first + 300]
    assert after
    assert min(after) < nodes, "the metrics reach it: once the window has passed it scales in"


def _doc(seconds: float, drain_s: float) -> dict[str, Any]:
    arms = ["vllm-cache-aware", "fleetloop-vllm"]
    s = report.summarize([], arms)
    return {
        "scenario": "stack-x", "arms": arms, "summary": s, "targets": report.targets([], s, arms),
        "runs_raw": [], "failed_runs": [], "void": [], "seconds": seconds, "drain_s": drain_s,
        "runs": 1, "max_lag_ms": 20.0, "command": "fleetloop bench stack", "commit": "x",
        "date_utc": "2026-12-06", "machine": {"cpus": 2, "load_start": "1", "load_end": "1"},
        "peer_scale_in_hold_s": peer_scale_in_hold_s([BY_NAME[a] for a in arms]),
    }  # fmt: skip


def test_a_run_shorter_than_the_window_says_the_peers_could_not_scale_in() -> None:
    assert "cannot scale in within it" in report.table_markdown(_doc(120.0, 90.0))
    assert "cannot scale in" not in report.table_markdown(_doc(600.0, 90.0))
