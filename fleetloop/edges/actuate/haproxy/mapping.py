"""Desired state -> HAProxy server settings. Pure: no I/O, no clock (``now_s`` comes in).

The mapping (docs/integrations/routers.md's table; tests check each row):

- routing weight ``w`` of a node -> ``set server B/S weight round(256 * w / max w in pool)``
  (1..256; 0 for ``w = 0``: no new traffic);
- breaker ``open`` (enforced) -> ``set server B/S state maint`` (no new or queued traffic);
- breaker ``half_open`` and slow start -> ``state ready`` at the probe share fleetloop publishes as
  the node's routing weight, which grows tick by tick: the weight ramp;
- node absent from its pool's routing (not provisioned) -> ``state maint``: the slot is disabled;
- autoscale ``drain`` list -> ``set server B/S state drain`` (in-flight work finishes, no new);
- admission ``max_outstanding``, when it limits priority 0 too -> ``set maxconn server B/S N``, N the
  loosest class limit (0 otherwise: no limit);
- no fresh routing for ``fail_static_s`` -> every slot ``ready``, weight 100, maxconn 0;
- a fresh decision that leaves no slot of a pool ready at a weight above 0 (no member, weights 0,
  every member drained or ejected) -> the pool's slots not behind an enforced open breaker (every
  slot, if all are) ``ready`` at weight 100: fleetloop never empties a backend (the router
  library's rotation rule, :mod:`fleetloop.router.state`).

Not mapped (HAProxy cannot express it per request without a config change; listed, not faked):
``by_priority`` weights, ``prefix_affinity``, ``spill_to``, ``max_prompt_tokens``,
``slo_prompt_tokens``, the picker,
per-class and new-task shed thresholds (``max_queue_depth``, ``new_task_*``,
``reject_if_budget_below_ms``), per-class ``max_outstanding`` below the loosest, retry budgets,
batching caps, and autoscale's ``desired_nodes`` (HAProxy cannot provision a node; it only enables
the slots the map declares).
Beyond ``maxconn`` HAProxy queues a request (up to ``timeout queue``) instead of rejecting it at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from fleetloop.router.state import DesiredState, rotation

Admin = Literal["ready", "drain", "maint"]

# What HAProxy's runtime API cannot express (the "not mapped" table of
# docs/integrations/routers.md): field -> why.
UNMAPPED: dict[str, str] = {
    "routing.by_priority": "one weight per server; per-class weights need a backend per class",
    "routing.prefix_affinity": "no per-request server choice from a runtime table without config",
    "routing.spill_to": "backend choice is configuration (use_backend rules), not runtime state",
    "routing.max_prompt_tokens": "HAProxy does not read a call's prompt size",
    "routing.slo_prompt_tokens": "HAProxy does not read a call's prompt size",
    "routing.picker": "the balance algorithm is configuration",
    "admission.max_queue_depth": "no per-class queue limit per server",
    "admission.new_task_*": "HAProxy cannot tell a task's first call from its later ones",
    "admission.reject_if_budget_below_ms": "no latency-budget admission",
    "admission.max_outstanding (per class)": "maxconn limits every class alike; mapped only if class 0 is",
    "retry_budget": "HAProxy retries connections, not client calls; client retries are invisible to it",
    "autoscale.desired_nodes": "HAProxy cannot provision a node; only declared slots are enabled",
    "batching.max_batch_tokens": "an engine setting, not a proxy one",
}
MAX_WEIGHT = 256
PLAIN_WEIGHT = 100

# HAProxy's srv_admin_state bits (src/server.h): forced / inherited / config maint, forced drain.
_ADMF_MAINT = 0x01 | 0x02 | 0x04 | 0x20
_ADMF_DRAIN = 0x08 | 0x10


@dataclass(frozen=True, slots=True)
class Slot:
    """One HAProxy server declared for one fleetloop node."""

    node_id: str
    pool_id: str
    backend: str
    server: str

    @property
    def name(self) -> str:
        return f"{self.backend}/{self.server}"


@dataclass(frozen=True, slots=True)
class PoolMap:
    pool_id: str
    backend: str
    model: str
    slots: tuple[Slot, ...]


@dataclass(frozen=True, slots=True)
class BackendMap:
    pools: tuple[PoolMap, ...]

    def slots(self) -> list[Slot]:
        return [s for p in self.pools for s in p.slots]

    def by_server(self) -> dict[tuple[str, str], tuple[Slot, PoolMap]]:
        return {(s.backend, s.server): (s, p) for p in self.pools for s in p.slots}


@dataclass(frozen=True, slots=True)
class Target:
    admin: Admin
    weight: int
    maxconn: int  # 0: no limit
    why: str


@dataclass(frozen=True, slots=True)
class Observed:
    admin: Admin
    weight: int
    maxconn: int | None  # None: not read


def scale_weight(w: float, max_w: float) -> int:
    if w <= 0 or max_w <= 0:
        return 0
    return max(1, min(MAX_WEIGHT, round(w / max_w * MAX_WEIGHT)))  # ratio first: no overflow at 1e308


def _maxconn(state: DesiredState, pool_id: str) -> int:
    st = state.pools.get(pool_id)
    adm = st.admission if st is not None else None
    if adm is None or "0" not in adm.max_outstanding:
        return 0  # HAProxy cannot limit some classes and not others: only a limit on everyone maps
    return max(adm.max_outstanding.values())


def targets(state: DesiredState, bmap: BackendMap, now_s: float, fail_static_s: float) -> dict[Slot, Target]:
    """What every declared server should be, from the desired state held at ``now_s``.

    Which slots take calls is the router library's rotation rule (:func:`fleetloop.router.state.rotation`):
    stale or absent routing is plain load balancing, and a fresh decision that would leave no slot
    of a pool ready at a weight above 0 (it names none of them, weights them all 0, drains or
    ejects every one) puts the pool's slots not behind an enforced open breaker (all, if every one
    is) ``ready`` at the plain weight: fleetloop never empties a backend."""
    out: dict[Slot, Target] = {}
    for pool in bmap.pools:
        rot = rotation(state, pool.pool_id, (s.node_id for s in pool.slots), now_s, fail_static_s)
        if rot.mode == "fail-static":
            for s in pool.slots:
                out[s] = Target("ready", PLAIN_WEIGHT, 0, "fail-static")
            continue
        routing = state.routing_fresh(pool.pool_id, now_s, fail_static_s)
        assert routing is not None
        weights = routing.weights
        max_w = max(weights.values(), default=0.0)
        maxconn = _maxconn(state, pool.pool_id)
        for s in pool.slots:
            why = rot.why[s.node_id]
            if rot.mode == "never-empty" and rot.serves(s.node_id):
                out[s] = Target("ready", PLAIN_WEIGHT, maxconn, why)
            elif why in ("not-a-member", "breaker-open"):
                out[s] = Target("maint", 0, 0, why)
            elif why == "autoscale-drain":
                out[s] = Target("drain", scale_weight(weights[s.node_id], max_w), maxconn, why)
            else:  # in rotation at its weight, or weight 0 (ready: no new calls, kept warm)
                out[s] = Target("ready", scale_weight(weights[s.node_id], max_w), maxconn, why)
    return out


def parse_servers_state(text: str) -> dict[tuple[str, str], Observed]:
    """``show servers state`` -> (backend, server) -> observed admin state and user weight."""
    out: dict[tuple[str, str], Observed] = {}
    header: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("# be_id"):
            header = line[2:].split()
            continue
        if not line.strip() or line.startswith("#") or header is None:
            continue
        cols = line.split()
        if len(cols) < len(header):
            continue
        row = dict(zip(header, cols, strict=False))
        admin_bits = int(row["srv_admin_state"])
        admin: Admin = (
            "maint" if admin_bits & _ADMF_MAINT else "drain" if admin_bits & _ADMF_DRAIN else "ready"
        )
        out[(row["be_name"], row["srv_name"])] = Observed(admin, int(row["srv_uweight"]), None)
    return out


def parse_stat_maxconn(text: str) -> dict[tuple[str, str], int]:
    """``show stat`` CSV -> (backend, server) -> session limit (0 when unlimited)."""
    out: dict[tuple[str, str], int] = {}
    header: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("# pxname"):
            header = line[2:].split(",")
            continue
        if header is None or not line.strip():
            continue
        row = dict(zip(header, line.split(","), strict=False))
        if row.get("svname") in ("FRONTEND", "BACKEND", None):
            continue
        out[(row["pxname"], row["svname"])] = int(row.get("slim") or 0)
    return out


@dataclass(frozen=True, slots=True)
class Change:
    slot: Slot
    command: str
    field: str  # admin | weight | maxconn
    was: str
    want: str
    why: str


def plan(
    want: Mapping[Slot, Target], seen: Mapping[tuple[str, str], Observed]
) -> tuple[list[Change], list[Slot]]:
    """Commands that move HAProxy from ``seen`` to ``want``; and the declared slots HAProxy lacks."""
    changes: list[Change] = []
    missing: list[Slot] = []
    for slot in sorted(want, key=lambda s: (s.backend, s.server)):
        t = want[slot]
        o = seen.get((slot.backend, slot.server))
        if o is None:
            missing.append(slot)
            continue
        name = slot.name
        # weight first: a server leaving maint comes back at its new weight, not its old one
        if t.admin != "maint" and o.weight != t.weight:
            changes.append(
                Change(
                    slot,
                    f"set server {name} weight {t.weight}",
                    "weight",
                    str(o.weight),
                    str(t.weight),
                    t.why,
                )
            )
        if o.maxconn is not None and o.maxconn != t.maxconn:
            changes.append(
                Change(
                    slot,
                    f"set maxconn server {name} {t.maxconn}",
                    "maxconn",
                    str(o.maxconn),
                    str(t.maxconn),
                    t.why,
                )
            )
        if o.admin != t.admin:
            changes.append(
                Change(slot, f"set server {name} state {t.admin}", "admin", o.admin, t.admin, t.why)
            )
    return changes, missing
