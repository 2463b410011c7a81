"""Builders for wire records used across tests (a stand-in for serving nodes and routers)."""

from __future__ import annotations

import struct
from typing import Any

import msgspec
import orjson
from fleetloop.schemas import NodeTelemetry, RequestOutcome, Tick
from pydantic import BaseModel


def telemetry(node: str, pool: str = "p", ts_ms: int = 1_000, **kw: Any) -> NodeTelemetry:
    return NodeTelemetry(**telemetry_fields(node, pool, ts_ms, **kw))


def telemetry_fields(node: str, pool: str = "p", ts_ms: int = 1_000, **kw: Any) -> dict[str, Any]:
    """A warm node's telemetry record as field values (``kw`` replaces any of them)."""
    fields: dict[str, Any] = {
        "ts_ms": ts_ms,
        "node_id": node,
        "pool_id": pool,
        "model": "llama-8b",
        "gpu_type": "L40S",
        "weights_state": "warm",
        "interval_ms": 1000,
        "queue_depth": 0,
        "running_requests": 1,
        "kv_cache_used_frac": 0.2,
        "hbm_free_gib": 20.0,
        "gpu_util_frac": 0.5,
        "cost_rate_usd_per_h": 1.0,
    }
    fields.update(kw)
    return fields


def outcome(
    node: str | None, outcome: str = "ok", pool: str = "p", ts_ms: int = 1_000, n: int = 0, **kw: Any
) -> RequestOutcome:
    fields: dict[str, Any] = {
        "ts_ms": ts_ms,
        "request_id": f"r-{node}-{ts_ms}-{n}",
        "workflow_id": f"w-{n}",
        "step_index": 0,
        "tenant_id": "t",
        "priority": 0,
        "latency_budget_ms": 10_000,
        "pool_id": pool,
        "node_id": node,
        "model": "llama-8b",
        "prompt_tokens": 100,
        "output_tokens": 10,
        "ttft_ms": 50.0 if outcome == "ok" else None,
        "e2e_ms": 100.0,
        "outcome": outcome,
    }
    fields.update(kw)
    return RequestOutcome(**fields)


def tick(tick_id: int, pool: str = "p", tick_ms: int = 1000) -> Tick:
    return Tick(ts_ms=tick_id * tick_ms, tick_id=tick_id, pool_id=pool)


def to_bytes(record: NodeTelemetry | RequestOutcome | Tick) -> bytes:
    return orjson.dumps(record.model_dump(mode="json"))


def bits(v: Any) -> Any:
    """A value compared bit for bit (floats by their IEEE bytes: -0.0 is not 0.0)."""
    if isinstance(v, float):
        return ("f", struct.pack("<d", v))
    if isinstance(v, (list, tuple)):
        return ("seq", tuple(bits(x) for x in v))
    return (type(v).__name__, v)


def bit_fields(item: Any) -> dict[str, Any]:
    """A decoded record's fields (a pydantic model or its msgspec twin), each compared bit for bit."""
    if isinstance(item, BaseModel):
        # every field's value, as the struct has them (a dump leaves out a field excluded when unset)
        return {k: bits(getattr(item, k)) for k in type(item).model_fields}
    return {k: bits(v) for k, v in msgspec.structs.asdict(item).items()}
