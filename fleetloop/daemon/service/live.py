"""The live page on ``/``: what the daemon decides right now, read-only.

:class:`LiveView` is fed every published batch of decisions (the daemon's ``on_decisions`` hook)
and keeps, bounded: the newest decision per kind and entity (weights per node, breaker states,
shed thresholds, autoscale targets), the last ``RECENT`` decisions with their reasons, and one KPI
sample per decided tick (tasks started/succeeded, fleet cost, cost per successful task) from the
model's ledger, the last ``HISTORY`` of them. ``/api/state`` serves it as JSON; ``/`` is one static
HTML page that polls it. Nothing on the page can change anything.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, Final

import orjson
from aiohttp import web

from fleetloop.schemas.decisions import Decision

RECENT: Final = 50
HISTORY: Final = 600
MAX_ENTITIES: Final = 5_000  # a bound on what the page keeps per kind (10,000-node fleets stay cheap)


class LiveView:
    def __init__(self, ledger: Callable[[], dict[str, float]] | None = None) -> None:
        self.ledger = ledger
        self.latest: dict[str, dict[str, dict[str, Any]]] = {}
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.policy: dict[str, Any] = {}
        self._last_tick: tuple[int, int] | None = None

    def record(self, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            body = d.body.model_dump(mode="json")
            per_kind = self.latest.setdefault(d.body.kind, {})
            if d.body.entity in per_kind or len(per_kind) < MAX_ENTITIES:
                per_kind[d.body.entity] = {"tick_id": d.tick_id, "ts_ms": d.ts_ms, **body}
            self.recent.append(
                {
                    "ts_ms": d.ts_ms,
                    "tick_id": d.tick_id,
                    "kind": d.body.kind,
                    "entity": d.body.entity,
                    "reason": d.body.reason,
                    "inputs": dict(sorted(d.body.inputs.items())[:6]),
                }
            )
            self.policy = d.policy.model_dump(mode="json")
        if decisions and self.ledger is not None:
            last = decisions[-1]
            tick = (last.tick_id, last.ts_ms)
            if tick != self._last_tick:
                self._last_tick = tick
                self.history.append({"ts_ms": last.ts_ms, **self.ledger()})

    def state(self) -> dict[str, Any]:
        def kind(k: str) -> list[dict[str, Any]]:
            return [v for _, v in sorted(self.latest.get(k, {}).items())]

        return {
            "policy": self.policy,
            "routing": kind("routing"),
            "breakers": kind("breaker"),
            "admission": kind("admission"),
            "autoscale": kind("autoscale"),
            "retry_budget": kind("retry_budget"),
            "recent": list(reversed(self.recent)),
            "kpi": list(self.history),
        }


def ledger_of(daemon: Any) -> Callable[[], dict[str, float]]:
    """KPI figures summed over the daemon's models (one per owned partition), read on the loop's thread."""

    def read() -> dict[str, float]:
        ledgers = [daemon.shards[p].model.ledger for p in sorted(daemon.shards)]
        started = sum(int(led.tasks_started) for led in ledgers)
        succeeded = sum(int(led.tasks_succeeded) for led in ledgers)
        cost_usd = sum(led.fleet_cost_nusd for led in ledgers) / 1e9
        return {
            "tasks_started": started,
            "tasks_succeeded": succeeded,
            "tasks_failed": sum(int(led.tasks_failed) for led in ledgers),
            "success_rate": round(succeeded / started, 4) if started else 0.0,
            "fleet_cost_usd": round(cost_usd, 6),
            "cost_per_successful_task_usd": round(cost_usd / succeeded, 6) if succeeded else 0.0,
        }

    return read


def add_routes(view: LiveView) -> Callable[[web.Application], None]:
    page = resources.files("fleetloop.daemon.service").joinpath("live.html").read_bytes()

    async def index(_: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html")

    async def api_state(_: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(view.state()), content_type="application/json")

    def install(app: web.Application) -> None:
        app.router.add_get("/", index)
        app.router.add_get("/api/state", api_state)

    return install
