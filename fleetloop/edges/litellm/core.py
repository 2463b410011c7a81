"""The LiteLLM integration's judgement-free core: LiteLLM's candidate deployments in, the one fleetloop's
router picks out, and each attempt's RequestOutcome. No LiteLLM, no Kafka, no clock (``now_s`` and
``wall_ms`` come in), so it is tested without either.

Per call (:meth:`LiteLLMRouting.select`, given the deployments LiteLLM still considers for the call:
its own cooldowns and a retry's failed deployments already left out):

1. Each deployment's node and pool (:func:`~fleetloop.edges.litellm.mapping.placement_of`). A model
   group with a deployment that is not fleetloop's is left to LiteLLM (all of them, unchanged).
2. The router library's :class:`~fleetloop.router.pick.Router` picks a node among the candidates'
   nodes (the pool's other nodes are out of this call): weights, by-priority weights, breakers,
   prefix affinity, shed thresholds, the pick algorithm the decision names, fail static, never
   empty (:mod:`fleetloop.router.state`). A retry (``x-fleetloop-attempt`` > 0, or LiteLLM's own:
   the same call placed again) spends the retry budget first.
3. The deployments on that node are kept; a shed call keeps none (LiteLLM answers it 429, "no
   deployments available") and its outcome, ``shed`` with no node, is returned at once.

Each attempt's result (:meth:`LiteLLMRouting.outcome`) becomes a RequestOutcome of the node that
served it, with the call's headers; one that cannot be attributed to a node is not published.
Desired state comes in through :meth:`apply` (the :class:`~fleetloop.router.follow.StateFollower`'s
sink) and node load through :attr:`endpoints` (the follower's telemetry).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from fleetloop.edges.headers import CallHeaders, task_end
from fleetloop.edges.litellm.mapping import DeploymentMap, Placement, call_of, placement_of
from fleetloop.router.pick import FAIL_STATIC_S, Endpoint, Router
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.requests import Outcome, RequestOutcome

PENDING_MAX_S = 900.0  # a call with no result after this long (a client that went away) is forgotten


@dataclass(slots=True)
class Pending:
    """A call fleetloop placed, until its result: what it was, where, and when."""

    call: CallHeaders
    placement: Placement
    at_s: float


@dataclass(slots=True)
class Counts:
    picked: int = 0
    shed: int = 0
    left_to_litellm: int = 0  # calls of a model group with a deployment that is not fleetloop's
    outcomes: int = 0
    unattributed: int = 0  # results with no node to attribute them to: not published
    malformed: int = 0  # results whose header values the schema refuses
    last_error: str = ""


class LiteLLMRouting:
    """One LiteLLM process's view: desired state, the deployments it has seen, calls in flight."""

    def __init__(
        self,
        dmap: DeploymentMap | None = None,
        *,
        rng: np.random.Generator | None = None,
        fail_static_s: float = FAIL_STATIC_S,
        default_priority: int = 1,
    ) -> None:
        self.dmap = dmap or DeploymentMap()
        self.rng = rng if rng is not None else np.random.default_rng()
        self.default_priority = default_priority
        self.endpoints: dict[str, Endpoint] = {}  # every node seen (the follower updates their load)
        self._nodes: dict[str, Endpoint] = {}  # the nodes of this call's candidates, and other pools'
        self._members: dict[str, list[Endpoint]] = {}
        self._pools: dict[str, set[str]] = {}  # pool -> its nodes seen
        self._groups: dict[str, set[str]] = {}  # model group -> its pools seen
        self._out: dict[str, frozenset[str]] = {}  # pool -> its nodes left out of the last call
        self.router: Router[Endpoint] = self._new_router(fail_static_s)
        self.pending: OrderedDict[str, Pending] = OrderedDict()
        self._placed: OrderedDict[str, float] = OrderedDict()  # call -> when last placed (retries)
        self.counts = Counts()

    # -- desired state (the StateFollower's sink) -------------------------------------------------

    @property
    def fail_static_s(self) -> float:
        return self.router.fail_static_s

    @fail_static_s.setter
    def fail_static_s(self, value: float) -> None:
        self.router.fail_static_s = value

    def apply(self, decisions: Sequence[Decision], now_s: float, refresh_s: float = 0.0) -> list[Decision]:
        return self.router.apply(decisions, now_s, refresh_s)

    def fleet_changed(self) -> None:
        self.router.fleet_changed()

    # -- per call ---------------------------------------------------------------------------------

    def select(
        self,
        model_group: str,
        deployments: Sequence[Mapping[str, Any]],
        request: Mapping[str, Any],
        *,
        call_id: str,
        now_s: float,
        wall_ms: int,
    ) -> tuple[list[Mapping[str, Any]], RequestOutcome | None]:
        """The deployments LiteLLM may send this call to, and the call's outcome when it is shed."""
        self._forget_stale(now_s)
        placed = [placement_of(d, self.dmap) for d in deployments]
        if not deployments or any(p is None for p in placed):
            self.counts.left_to_litellm += bool(deployments)
            return list(deployments), None
        places = [p for p in placed if p is not None]
        self._learn(model_group, places)
        self._restrict(places)
        call = call_of(request, call_id=call_id, default_priority=self.default_priority)
        route = self.router.pick(  # budget 0: no deadline, never shed for one (router.pick.budget_rejects)
            (model_group,), call.priority, call.prefix_digest, new_task=call.step_index == 0,
            budget_ms=call.latency_budget_ms, now_s=now_s, prompt_tokens=call.prompt_tokens,
        )  # fmt: skip
        retrying = call.attempt > 0 or call_id in self._placed
        self._placed.pop(call_id, None)
        self._placed[call_id] = now_s
        retry_refused = (
            route.node is not None
            and retrying
            and not self.router.allow_retry(route.pool_id, call.tenant_id, now_s=now_s)
        )
        if route.node is None and route.reason != "shed":
            return list(deployments), None  # no node anywhere (never, with candidates): LiteLLM's call
        if route.node is None or retry_refused:
            self.counts.shed += 1
            shed = Placement("", route.pool_id, model_group)
            return [], self._record(call, shed, "shed", wall_ms=wall_ms, e2e_ms=0.0)
        node_id = route.node.node_id
        kept = [d for d, p in zip(deployments, places, strict=True) if p.node_id == node_id]
        self.router.started(node_id)
        self.pending.pop(call_id, None)
        self.pending[call_id] = Pending(call, next(p for p in places if p.node_id == node_id), now_s)
        self.counts.picked += 1
        return kept, None

    def outcome(
        self,
        call_ids: Sequence[str],
        served_by: Mapping[str, Any] | None,
        kind: Outcome,
        *,
        request: Mapping[str, Any],
        now_s: float,
        wall_ms: int,
        ttft_ms: float | None = None,
        e2e_ms: float | None = None,
        prompt_tokens: int = 0,
        output_tokens: int = 0,
    ) -> RequestOutcome | None:
        """One attempt's result (``ok``, ``error``, ``timeout``, or ``shed``: published with no node)
        on the deployment ``served_by`` (a ``model_list`` entry's fields; None: unknown), or None
        when there is nothing to publish: no node to attribute it to, or header values the schema
        refuses (counted). ``call_ids``: the ids the call may have been placed under, the first one
        known wins (LiteLLM's proxy hands its filter the call id, its SDK only the trace id; its
        logging events carry both)."""
        pending = None
        for key in call_ids:
            pending = self.pending.pop(key, None) if key else None
            if pending is not None:
                break
        call_id = next((k for k in call_ids if k), "litellm")
        if pending is not None:
            self.router.finished(pending.placement.node_id)
        place = placement_of(served_by, self.dmap) if served_by is not None else None
        place = place or (pending.placement if pending is not None else None)
        if place is None:
            self.counts.unattributed += 1
            return None
        call = pending.call if pending is not None else None
        call = call or call_of(request, call_id=call_id, default_priority=self.default_priority)
        if e2e_ms is None:
            e2e_ms = (now_s - pending.at_s) * 1000.0 if pending is not None else 0.0
        tokens = call.prompt_tokens or prompt_tokens
        return self._record(
            call, place, kind, wall_ms=wall_ms, e2e_ms=e2e_ms, ttft_ms=ttft_ms,
            prompt_tokens=tokens, output_tokens=output_tokens,
        )  # fmt: skip

    def placed(self, call_ids: Sequence[str]) -> bool:
        """Whether a call fleetloop placed is still waiting for its result."""
        return any(k in self.pending for k in call_ids if k)

    # -- internals --------------------------------------------------------------------------------

    def _record(
        self,
        call: CallHeaders,
        place: Placement,
        kind: Outcome,
        *,
        wall_ms: int,
        e2e_ms: float,
        ttft_ms: float | None = None,
        prompt_tokens: int | None = None,
        output_tokens: int = 0,
    ) -> RequestOutcome | None:
        try:
            o = RequestOutcome(
                ts_ms=wall_ms,
                request_id=call.request_id,
                attempt=min(100, max(0, call.attempt)),
                workflow_id=call.workflow_id,
                step_index=max(0, call.step_index),
                tenant_id=call.tenant_id,
                priority=call.priority,
                latency_budget_ms=max(0, call.latency_budget_ms),
                pool_id=place.pool_id,
                node_id=place.node_id if kind != "shed" else None,
                model=place.model,
                prompt_tokens=call.prompt_tokens if prompt_tokens is None else max(0, prompt_tokens),
                output_tokens=max(0, output_tokens),
                prefix_digest=call.prefix_digest,
                ttft_ms=round(ttft_ms, 3) if ttft_ms is not None and kind == "ok" else None,
                e2e_ms=round(max(0.0, e2e_ms), 3),
                outcome=kind,
                task_outcome=task_end(call, kind),
            )
        except ValidationError as exc:
            self.counts.malformed += 1
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "record"
            self.counts.last_error = f"{where}: {first['msg']}"[:300]
            return None
        self.counts.outcomes += 1
        return o

    def _new_router(self, fail_static_s: float) -> Router[Endpoint]:
        pools_by_model = {g: tuple(sorted(ps)) for g, ps in sorted(self._groups.items())}
        return Router(
            pools_by_model, self.rng, members=self._members, nodes=self._nodes, fail_static_s=fail_static_s
        )

    def _learn(self, model_group: str, places: Sequence[Placement]) -> None:
        """Take in nodes and pools not seen before: a new router over them, keeping the state held
        and the calls outstanding (rare: a model list's first calls, or an edit; the retries spent
        since the last retry-budget decision start again from none)."""
        pools = self._groups.get(model_group, set())
        new = [p for p in places if p.node_id not in self.endpoints or p.pool_id not in pools]
        if not new:
            return
        for p in new:
            ep = self.endpoints.get(p.node_id)
            if ep is None:
                ep = self.endpoints[p.node_id] = Endpoint(node_id=p.node_id, pool_id=p.pool_id)
            self._pools.setdefault(p.pool_id, set()).add(p.node_id)
            self._groups.setdefault(model_group, set()).add(p.pool_id)
        old = self.router
        self.router = self._new_router(old.fail_static_s)
        self.router.state = old.state
        self.router.outstanding = old.outstanding
        self._out.clear()
        self._restrict(places, force=True)

    def _restrict(self, places: Sequence[Placement], *, force: bool = False) -> None:
        """The router sees, of each candidate pool, only the nodes among this call's candidates."""
        here: dict[str, set[str]] = {}
        for p in places:
            here.setdefault(p.pool_id, set()).add(p.node_id)
        changed = force
        for pool_id, nodes in here.items():
            out = frozenset(self._pools[pool_id] - nodes)
            if self._out.get(pool_id) != out:
                self._out[pool_id] = out
                changed = True
        if not changed:
            return
        self._nodes.clear()
        self._members.clear()
        for pool_id, nodes in sorted(self._pools.items()):
            out = self._out.get(pool_id, frozenset())
            kept = [self.endpoints[n] for n in sorted(nodes) if n not in out]
            self._members[pool_id] = kept
            self._nodes.update((ep.node_id, ep) for ep in kept)
        self.router.fleet_changed()

    def _forget_stale(self, now_s: float) -> None:
        """Calls placed ``PENDING_MAX_S`` ago with no result (their client went away and LiteLLM
        logged nothing): no longer counted as outstanding on their node."""
        while self._placed and now_s - next(iter(self._placed.values())) >= PENDING_MAX_S:
            self._placed.popitem(last=False)
        while self.pending:
            call_id, p = next(iter(self.pending.items()))
            if now_s - p.at_s < PENDING_MAX_S:
                return
            del self.pending[call_id]
            self.router.finished(p.placement.node_id)
