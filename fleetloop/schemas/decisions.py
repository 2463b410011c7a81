"""Decisions: desired state that fleetloop publishes, keyed by entity.

Every decision is absolute (weights, states, thresholds, targets; never a delta), so publishing it
twice is harmless and a router keeps the newest by ``tick_id``. The envelope stamps the policy
(name, version, hash, mode), the tick and the input offsets it was computed from, which is what
makes a replay comparable byte for byte. Each body carries a reason code and the inputs that drove it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Field, ValidationError
from pydantic_core import from_json, to_json

from fleetloop.schemas.base import (
    MAX_TICK_ID,
    EpochMs,
    Figure,
    Fraction,
    Ident,
    NonNegFloat,
    NonNegInt,
    Tokens,
    Wire,
)
from fleetloop.schemas.policy import Mode

BreakerStateName = Literal["closed", "open", "half_open"]
Offset = Annotated[int, Field(ge=0, le=2**63 - 1)]  # a Kafka offset
Picker = Literal["weighted-random", "round-robin", "least-request-p2c", "least-outstanding", "llm-d-epp"]


class _Body(Wire):
    entity: str = Field(min_length=1)
    reason: str = Field(min_length=1, description="kebab-case reason code")
    inputs: dict[str, Figure] = Field(default_factory=dict, description="the figures that drove it")


class RoutingDecision(_Body):
    """Share of a pool's traffic per node. Weights are >= 0 and sum to 1 (empty: no node can serve;
    the router then fails static on its last state, then plain load balancing)."""

    kind: Literal["routing"] = "routing"
    pool_id: Ident
    weights: dict[str, NonNegFloat]
    picker: Picker = Field(
        default="weighted-random",
        description="how the router picks per call among nodes with weight > 0: by weight, in turn, "
        "the less loaded of two random picks by its own outstanding count (Envoy LEAST_REQUEST), "
        "or the fewest of its own outstanding calls per unit of weight (HAProxy leastconn), "
        "or llm-d's endpoint picker in its default profile (queue, KV-cache and prefix-cache scores, "
        "the best taken)",
    )
    by_priority: dict[str, dict[str, NonNegFloat]] = Field(
        default_factory=dict, description="priority class -> weights, where it differs from `weights`"
    )
    prefix_affinity: dict[str, tuple[str, ...]] = Field(
        default_factory=dict, description="prefix digest -> nodes holding it warm, best first"
    )
    spill_to: tuple[Ident, ...] = Field(
        default=(), description="pools to send overflow to, in order, when this one cannot meet budgets"
    )
    max_prompt_tokens: Tokens | None = Field(
        default=None,
        description="the longest prompt (tokens) a node of this pool holds in its KV cache; a longer prompt "
        "goes to another pool of an acceptable model that holds it, when one does (none: no limit known)",
    )
    slo_prompt_tokens: dict[str, Tokens] = Field(
        default_factory=dict,
        description="priority class -> the longest prompt one node of this pool prefills on its own "
        "within that class's TTFT SLO; a call admitted here with a longer prompt goes to a pool of the "
        "same model in `spill_to` whose figure it is within, when that pool's picked node has nothing "
        "queued (empty: unknown)",
    )


class BreakerDecision(_Body):
    """Circuit-breaker state of one node. ``enforced`` is false when the breaker tripped but the
    engine did not eject (shadow mode, or the max-ejected share was reached): "detected" vs
    "enforced", as in Envoy's outlier detection.

    Change-only: a node's record is published every tick while its state is not ``closed``; a
    closed node's only when its state fields (``state``, ``enforced``, ``probe_frac``, ``until_ms``,
    ``reason``, ``ejections``) change, and as a keyframe at least once every 30 ticks (staggered by
    node id). No record for a node on a tick means its newest record still holds: keep the newest
    record per node (``control.state``, compacted by ``breaker/node/<id>``, does)."""

    kind: Literal["breaker"] = "breaker"
    pool_id: Ident
    node_id: Ident
    state: BreakerStateName
    enforced: bool = True
    probe_frac: Fraction = 0.0
    until_ms: EpochMs | None = None
    ejections: NonNegInt = 0


class AdmissionDecision(_Body):
    """Shed thresholds for a pool: a call of priority ``p`` is rejected when the chosen node's
    queue depth is at or above ``max_queue_depth[p]``; ``new_task_max_queue_depth[p]`` applies to the
    first call of a task (later calls of a task that has already spent money are protected).
    ``max_outstanding[p]`` (and ``new_task_max_outstanding[p]``) do the same on the node's
    outstanding work, queue depth plus running requests: under continuous batching the queue stays
    empty until the KV cache fills, so outstanding work is the signal that moves first.
    ``new_task_max_outstanding[p]`` binds only on a node with calls queued: one with none admits
    the first call into its running batch at once, which costs the batch time between tokens,
    while a shed first call is a lost task. A class absent from a table has no limit of that kind.

    ``reject_if_budget_below_ms`` sheds a call whose remaining latency budget is known and below it
    (0: no such threshold). A call with no deadline (budget 0 or absent: ``x-fleetloop-budget-ms``
    unset) is never shed for its budget, and neither is a call of priority
    ``budget_protected_priority`` or better: those classes are shed only by their queue and
    outstanding limits, which the engine floors (the envelope's ``protected_priority``, which it
    copies here; -1 protects none). A record without the field (an older daemon) protects
    priority 0, the envelope's default."""

    kind: Literal["admission"] = "admission"
    pool_id: Ident
    max_queue_depth: dict[str, NonNegInt]
    new_task_max_queue_depth: dict[str, NonNegInt] = Field(default_factory=dict)
    reject_if_budget_below_ms: NonNegInt = 0
    max_outstanding: dict[str, NonNegInt] = Field(
        default_factory=dict, description="priority class -> limit on queue depth + running requests"
    )
    new_task_max_outstanding: dict[str, NonNegInt] = Field(
        default_factory=dict, description="the same for the first call of a task"
    )
    budget_protected_priority: int = Field(
        default=0, ge=-1, le=9, description="this priority and better are never shed for their budget"
    )


RetryExempt = Literal["shed", "error"]


class RetryBudgetDecision(_Body):
    """Retries allowed for a pool (and tenant, when set): at most ``retry_ratio`` x requests over
    the window, plus ``min_retries_per_s`` so a quiet pool can still retry (Finagle RetryBudget).

    ``exempt_retries_of`` names failed-attempt outcomes whose retry the router lets through without
    spending the budget: ``shed`` (the call never ran) and ``error`` (its node dropped it: a crash, a
    preemption). Their original is gone, so the retry replaces work instead of adding a copy; the
    budget keeps bounding retries of timed-out calls, the retry storm. Empty: every retry counts."""

    kind: Literal["retry_budget"] = "retry_budget"
    pool_id: Ident
    tenant_id: Ident | None = None
    retry_ratio: Fraction
    min_retries_per_s: NonNegFloat
    retries_allowed_now: NonNegInt
    exempt_retries_of: tuple[RetryExempt, ...] = Field(default=(), max_length=2)


class AutoscaleDecision(_Body):
    """Desired node count for a pool, and its drain list: every node asked to drain that is still
    in the pool (held by the engine until the node is gone or a rising target takes it back), in
    the order asked, each step's best candidates first."""

    kind: Literal["autoscale"] = "autoscale"
    pool_id: Ident
    current_nodes: NonNegInt
    desired_nodes: NonNegInt
    drain: tuple[Ident, ...] = ()


class BatchingDecision(_Body):
    """Per-pool cap on tokens per batch iteration (the "share" lever)."""

    kind: Literal["batching"] = "batching"
    pool_id: Ident
    max_batch_tokens: NonNegInt


class FleetDecision(_Body):
    """Fleet-wide figures, folded from every shard's summary by ``fleetloop rollup`` (the second
    stage; key ``fleet/fleet`` on ``control.state``). Not a lever: no router acts on it. ``reason``
    is ``complete`` when every live shard reported the boundary, else ``partial`` (the shards
    behind contribute their newest, older summary)."""

    kind: Literal["fleet"] = "fleet"
    shards: NonNegInt
    shards_behind: NonNegInt = 0
    pools: NonNegInt
    nodes: NonNegInt
    cost_rate_usd_per_h: NonNegFloat
    requests_w: NonNegInt
    retries_w: NonNegInt
    retries_allowed: NonNegInt
    retry_budget_used_frac: NonNegFloat | None = Field(
        description="retries in the window over the retries the pools' budgets allow (None: no budget)"
    )
    tasks_succeeded: NonNegInt
    tasks_failed: NonNegInt
    tasks_handed_off: NonNegInt = 0  # let go by a shard after going quiet there (not an outcome)
    fleet_cost_usd: NonNegFloat
    spend_on_failed_usd: NonNegFloat
    cost_per_successful_task_usd: NonNegFloat | None


DecisionBody = Annotated[
    RoutingDecision
    | BreakerDecision
    | AdmissionDecision
    | RetryBudgetDecision
    | AutoscaleDecision
    | BatchingDecision
    | FleetDecision,
    Field(discriminator="kind"),
]
DecisionKind = Literal["routing", "breaker", "admission", "retry_budget", "autoscale", "batching", "fleet"]


class PolicyStamp(Wire):
    name: str
    version: int = Field(ge=1, le=MAX_TICK_ID)
    hash: str = Field(pattern=r"^[0-9a-f]{16}$", description="sha256 of the canonical document, 16 hex")
    mode: Mode


class Decision(Wire):
    """The envelope on ``control.decisions`` (every decision) and ``control.state`` (latest per key)."""

    ts_ms: EpochMs
    tick_id: int = Field(ge=0, le=MAX_TICK_ID)
    policy: PolicyStamp
    input_offsets: dict[str, Offset] = Field(
        default_factory=dict, description="'topic:partition' -> next offset folded into the model"
    )
    body: DecisionBody

    @property
    def key(self) -> str:
        """The compaction key: one desired state per kind and entity."""
        return f"{self.body.kind}/{self.body.entity}"


# The form of a control.state record, in its headers. None: every enforced decision every tick (the
# first form). ``state_form`` 2: each key when what it asks for changes, and every key re-sent at least
# every ``refresh_ms`` (fleetloop.daemon.act.state_changes); a reader keeps a routing decision fresh
# for its fail-static TTL plus that refresh (fleetloop.router.state.DesiredState.routing_fresh).
FORM_HEADER = "fleetloop.state_form"
REFRESH_HEADER = "fleetloop.refresh_ms"
CHANGE_ONLY_FORM = b"2"


def state_headers(refresh_ms: int) -> list[tuple[str, bytes]]:
    """The headers of a change-only record on ``control.state`` (none for the every-tick form)."""
    if refresh_ms <= 0:
        return []
    return [(FORM_HEADER, CHANGE_ONLY_FORM), (REFRESH_HEADER, str(refresh_ms).encode())]


def refresh_s_of(headers: Any) -> float:
    """A ``control.state`` record's refresh period in seconds from its headers (0: the every-tick
    form, or headers this reader does not understand)."""
    form = refresh = None
    for k, v in headers or ():
        if k == FORM_HEADER:
            form = bytes(v)
        elif k == REFRESH_HEADER:
            refresh = bytes(v)
    if form != CHANGE_ONLY_FORM or refresh is None:
        return 0.0
    try:
        ms = int(refresh)
    except ValueError:
        return 0.0
    return ms / 1000.0 if 0 < ms <= 3_600_000 else 0.0


# kind -> body model, read off DecisionBody itself, so a kind added there is known here.
_BODIES: dict[str, type[_Body]] = {
    str(cls.model_fields["kind"].default): cls for cls in get_args(get_args(DecisionBody)[0])
}
_NEWER_ONLY = frozenset({"extra_forbidden", "union_tag_invalid"})


def decision_from_newer(raw: bytes | str, dropped: list[str] | None = None) -> Decision | None:
    """A ``control.state`` record as a router or actuator reads it, which may be older than the
    daemon that wrote it.

    A record this version's :class:`Decision` accepts is returned as it is (every record of the same
    version: the one parse of the fast path). A record it refuses *only* for names it does not know
    is a newer daemon's: a field this version lacks is dropped (envelope, policy stamp or body), and
    a body of a kind it lacks gives ``None``, to be skipped, not counted as malformed. Anything
    else wrong (a bound, a type, a missing field, bad JSON) raises the strict read's
    ``ValidationError``, unknown names or not: the known fields are held to their bounds as ever.

    The contract that makes dropping safe, for whoever adds to these models: a new field may only
    add to what a decision says, so a reader that ignores it still acts correctly on the rest (as
    ``RoutingDecision.slo_prompt_tokens`` did: without it a router routes by the weights alone). A
    change of meaning of what a reader already knows is a new kind. So the daemon may be upgraded
    before its routers: an older router keeps following the state instead of failing static on it.

    ``dropped``, when given, receives what was left out (``body.<field>``, ``policy.<field>``,
    ``<field>``, or ``kind <name>``), so a reader can say it is older than its writer.
    """
    try:
        return Decision.model_validate_json(raw)
    except ValidationError as exc:
        if not {e["type"] for e in exc.errors()} <= _NEWER_ONLY:
            raise
        data = from_json(raw)  # parsed once already: it is JSON
        if not isinstance(data, dict) or not isinstance(data.get("body"), dict):
            raise
        body: dict[str, object] = data["body"]
        kind = body.get("kind")
        if not isinstance(kind, str):
            raise
        cls = _BODIES.get(kind)
        out = dropped if dropped is not None else []
        if cls is None:
            out.append(f"kind {kind}")
            return None
        known = _known(Decision, data, "", out)
        known["body"] = _known(cls, body, "body.", out)
        stamp = known.get("policy")
        if isinstance(stamp, dict):
            known["policy"] = _known(PolicyStamp, stamp, "policy.", out)
        return Decision.model_validate_json(to_json(known))


def _known(model: type[Wire], data: dict[str, object], where: str, dropped: list[str]) -> dict[str, object]:
    dropped.extend(f"{where}{k}" for k in data if k not in model.model_fields)
    return {k: v for k, v in data.items() if k in model.model_fields}
