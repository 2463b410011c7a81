"""The HAProxy actuator's loop: follow control.state, reconcile HAProxy to it, report drift.

Every ``period_s`` (and at once when new desired state arrives) it computes each declared server's
target (:func:`~fleetloop.edges.actuate.haproxy.mapping.targets`), reads HAProxy's state (``show servers
state``, and ``show stat`` for maxconn), and sends the commands that close the gap in one exchange.
A difference on a server whose target did not change since the actuator last asserted it is drift
(a reload, someone's manual change): it is re-asserted and logged as ``drift``; a difference from a
new target is logged as ``apply``. A slot the map declares but HAProxy lacks is logged once per
appearance as ``missing``. An unreachable runtime API is logged and retried; the loop never dies.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleetloop.edges.actuate.haproxy.mapping import (
    BackendMap,
    Change,
    Observed,
    PoolMap,
    Slot,
    Target,
    parse_servers_state,
    parse_stat_maxconn,
    plan,
    targets,
)
from fleetloop.edges.actuate.haproxy.runtime_api import RuntimeApi, RuntimeApiError
from fleetloop.edges.actuate.loop import Reconciler
from fleetloop.router.state import DesiredState
from fleetloop.user_input import UserInputError, read_yaml

log = logging.getLogger("fleetloop.edges.actuate.haproxy")


class BackendMapError(ValueError):
    """A backend map the actuator cannot use (one line, for the CLI)."""


def load_backend_map(path: str | Path) -> BackendMap:
    """Read the backend map YAML::

    pools:
      chat-l40s:                 # fleetloop pool id
        backend: chat            # HAProxy backend
        model: llama-8b          # the model the pool serves (RequestOutcome.model)
        servers:                 # fleetloop node id -> HAProxy server name
          chat-l40s/0: s0
          chat-l40s/1: s1
    """
    try:
        doc = read_yaml(path)
    except UserInputError as exc:
        raise BackendMapError(f"--backend-map {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("pools"), dict) or not doc["pools"]:
        raise BackendMapError(f"--backend-map {path}: want a mapping with a non-empty 'pools' mapping")
    pools: list[PoolMap] = []
    seen: set[tuple[str, str]] = set()
    for pool_id, spec in sorted(doc["pools"].items()):
        where = f"--backend-map {path}: pools.{pool_id}"
        if not isinstance(spec, dict):
            raise BackendMapError(f"{where}: want a mapping")
        backend, model, servers = spec.get("backend"), spec.get("model"), spec.get("servers")
        if not isinstance(backend, str) or not backend:
            raise BackendMapError(f"{where}.backend: want a backend name")
        if not isinstance(model, str) or not model:
            raise BackendMapError(f"{where}.model: want the model the pool serves")
        if not isinstance(servers, dict) or not servers:
            raise BackendMapError(f"{where}.servers: want node id -> server name")
        slots = []
        for node_id, server in sorted(servers.items()):
            if not isinstance(server, str) or not server or any(c in server for c in " /;\n"):
                raise BackendMapError(f"{where}.servers.{node_id}: want a plain server name")
            if (backend, server) in seen:
                raise BackendMapError(f"{where}.servers.{node_id}: {backend}/{server} is mapped twice")
            seen.add((backend, server))
            slots.append(Slot(str(node_id), str(pool_id), backend, server))
        pools.append(PoolMap(str(pool_id), backend, model, tuple(slots)))
    return BackendMap(tuple(pools))


@dataclass(slots=True)
class ActuatorStats:
    reconciles: int = 0
    applied: int = 0
    drift: int = 0
    api_errors: int = 0
    last_error: str = ""
    missing: list[str] = field(default_factory=list)


class HaproxyActuator(Reconciler):
    target_error = RuntimeApiError
    log = log

    def __init__(
        self,
        api: RuntimeApi,
        bmap: BackendMap,
        state: DesiredState,
        *,
        fail_static_s: float,
        now: Callable[[], float],
        period_s: float = 0.5,
        on_change: Callable[[Change, str], None] | None = None,
    ) -> None:
        self.api = api
        self.bmap = bmap
        self.state = state
        self.fail_static_s = fail_static_s
        self.now = now
        self.period_s = period_s
        self.on_change = on_change
        self.stats = ActuatorStats()
        self.wake = asyncio.Event()
        self._asserted: dict[Slot, Target] = {}
        self._missing: set[Slot] = set()

    async def observe(self) -> dict[tuple[str, str], Observed]:
        text, stat = await self.api.run(["show servers state"]), await self.api.run(["show stat"])
        seen = parse_servers_state(text)
        limits = parse_stat_maxconn(stat)
        return {k: Observed(o.admin, o.weight, limits.get(k)) for k, o in seen.items()}

    async def reconcile(self) -> list[tuple[Change, str]]:
        """One pass; returns the changes made, each tagged ``apply`` or ``drift``."""
        return await self._pass(self.state, restoring=False)

    async def restore(self) -> list[tuple[Change, str]]:
        """Every mapped server ready at the plain weight, no maxconn: the targets of a state that
        holds no decision (fail-static), whatever is held. Each change is tagged ``restore``."""
        return await self._pass(DesiredState(), restoring=True)

    async def _pass(self, state: DesiredState, *, restoring: bool) -> list[tuple[Change, str]]:
        want = targets(state, self.bmap, self.now(), self.fail_static_s)
        seen = await self.observe()
        changes, missing = plan(want, seen)
        for slot in missing:
            if slot not in self._missing:
                log.warning("missing: HAProxy has no server %s for node %s", slot.name, slot.node_id)
                self.stats.missing.append(slot.name)
        self._missing = set(missing)
        done: list[tuple[Change, str]] = []
        if changes:
            answer = await self.api.run([c.command for c in changes])
            problems = [line for line in answer.splitlines() if line.strip()]
            if problems:
                log.warning("HAProxy answered: %s", " | ".join(problems)[:500])
            for c in changes:
                kind = "drift" if self._asserted.get(c.slot) == want[c.slot] else "apply"
                if restoring:
                    kind = "restore"
                    log.info("restore: %s %s %s -> %s", c.slot.name, c.field, c.was, c.want)
                elif kind == "drift":
                    self.stats.drift += 1
                    log.warning(
                        "drift: %s %s was %s (want %s, %s); re-asserted",
                        c.slot.name,
                        c.field,
                        c.was,
                        c.want,
                        c.why,
                    )
                else:
                    self.stats.applied += 1
                    log.info("apply: %s %s %s -> %s (%s)", c.slot.name, c.field, c.was, c.want, c.why)
                done.append((c, kind))
                if self.on_change is not None:
                    self.on_change(c, kind)
        for slot, t in want.items():
            if slot not in self._missing:
                self._asserted[slot] = t
        self.stats.reconciles += 1
        return done

    def failed(self, message: str) -> None:
        self.stats.api_errors += 1
        self.stats.last_error = message

    def last_error(self) -> str:
        return self.stats.last_error
