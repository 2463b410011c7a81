"""What the live benches (``fuzz``, ``soak``) share: a broker (embedded unless one is named), a
daemon in this process with its stats at hand, a small real fleet's records, and RSS.

The daemon runs in this process so the bench can read its counters and model directly; its RSS is
this process's (the broker is a child process of its own and is not counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from fleetloop.bench.common import progress, rss_mib
from fleetloop.daemon import observability
from fleetloop.daemon.brokers import (
    BrokerStartError,
    delete_topics,
    ensure_topics,
    probe_capabilities,
    start_broker,
)
from fleetloop.daemon.cli_common import UsageError, quiet_client_logs
from fleetloop.daemon.runtime import Daemon, DaemonConfig, OnDecisions
from fleetloop.kafka_security import error_text

__all__ = ["progress", "rss_mib"]


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    bootstrap_servers: str
    kind: str
    idempotent: bool | None


def run_live(
    args: Any,
    name: str,
    bench: Callable[[Any, BrokerInfo], Coroutine[Any, Any, dict[str, Any]]],
    table: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """What every live bench's command does around its run: quiet logs, the broker (the named one
    or an embedded one), ``bench(args, broker)`` in an event loop, then one JSON object on stdout
    (``--json``) or ``table(result)``."""
    observability.configure(level="error")
    quiet_client_logs()
    with broker(args.bootstrap_servers, name) as info:
        result = asyncio.run(bench(args, info))
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        table(result)
    return result


async def drop_topics(info: BrokerInfo, prefix: str) -> None:
    """Delete a run's topics; leftovers are harmless, so a failure is one progress line."""
    try:
        await delete_topics(info.bootstrap_servers, prefix)
    except Exception as exc:  # whatever the admin client raised
        progress(f"  could not delete the topics under {prefix}: {type(exc).__name__}")


@contextlib.contextmanager
def broker(bootstrap: str | None, name: str) -> Iterator[BrokerInfo]:
    """The named broker, or the embedded Tansu started on loopback (stopped on exit)."""
    if bootstrap:
        yield BrokerInfo(bootstrap, "external", None)
        return
    progress(f"fleetloop bench {name}: starting the embedded broker (Tansu) on loopback ...")
    try:
        started = start_broker("tansu")
    except BrokerStartError as exc:
        raise UsageError(f"fleetloop bench {name}: {exc}".splitlines()[0]) from None
    try:
        yield BrokerInfo(
            started.bootstrap_servers, "tansu (embedded)", started.capabilities.idempotent_producer
        )
    finally:
        started.stop()


async def fresh_prefix(info: BrokerInfo, name: str) -> tuple[str, bool]:
    """A fresh topic prefix with every registry topic; and whether the producer may be idempotent."""
    prefix = f"bench-{name}-{uuid.uuid4().hex[:8]}"
    try:
        await ensure_topics(info.bootstrap_servers, prefix)
        idempotent = info.idempotent
        if idempotent is None:
            idempotent = (await probe_capabilities(info.bootstrap_servers)).idempotent_producer
    except Exception as exc:  # one line for the user, whatever the client raised
        raise UsageError(
            f"fleetloop bench {name}: cannot use Kafka at {info.bootstrap_servers}: {error_text(exc)}"
        ) from None
    return prefix, idempotent


@dataclass(slots=True)
class RunningDaemon:
    daemon: Daemon
    task: asyncio.Task[None]

    @property
    def crashed(self) -> BaseException | None:
        """The exception the daemon's loop died of, if it did."""
        if self.task.done() and not self.task.cancelled():
            return self.task.exception()
        return None


@contextlib.asynccontextmanager
async def running_daemon(
    config: DaemonConfig, on_decisions: OnDecisions | None = None
) -> AsyncIterator[RunningDaemon]:
    daemon = Daemon(config, on_decisions)
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop), name="daemon")
    running = RunningDaemon(daemon, task)
    try:
        ready = asyncio.create_task(daemon.ready.wait())
        done, _ = await asyncio.wait({ready, task}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if ready not in done:
            ready.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ready
            if task.done() and task.exception() is not None:
                raise UsageError(f"the daemon did not start: {task.exception()}")
            raise UsageError("the daemon did not get its partitions within 60 s")
        yield running
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(task), 60)


# -- a small real fleet ------------------------------------------------------------------------------


def telemetry_bytes(
    pool: str, node: str, ts_ms: int, *, queue_depth: int = 0, errors: int = 0, model: str = "llama-8b"
) -> bytes:
    return orjson.dumps(
        {
            "ts_ms": ts_ms,
            "node_id": node,
            "pool_id": pool,
            "model": model,
            "gpu_type": "L40S",
            "weights_state": "warm",
            "interval_ms": 1000,
            "queue_depth": queue_depth,
            "running_requests": 2 + queue_depth,
            "kv_cache_used_frac": 0.3,
            "hbm_free_gib": 20.0,
            "gpu_util_frac": 0.6,
            "errors": errors,
            "cost_rate_usd_per_h": 1.5,
        }
    )


def outcome_bytes(
    pool: str,
    node: str,
    ts_ms: int,
    request: str,
    workflow: str,
    *,
    outcome: str = "ok",
    tenant: str = "gold",
    task_outcome: str | None = None,
) -> bytes:
    body: dict[str, Any] = {
        "ts_ms": ts_ms,
        "request_id": request,
        "workflow_id": workflow,
        "step_index": 0,
        "tenant_id": tenant,
        "priority": 0,
        "latency_budget_ms": 10_000,
        "pool_id": pool,
        "node_id": node,
        "model": "llama-8b",
        "prompt_tokens": 500,
        "output_tokens": 50,
        "e2e_ms": 300.0,
        "outcome": outcome,
        "cost_usd": 0.0004,
    }
    if outcome == "ok":
        body["ttft_ms"] = 80.0
    if task_outcome is not None:
        body["task_outcome"] = task_outcome
    return orjson.dumps(body)
