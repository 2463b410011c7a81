"""The ``x-fleetloop-*`` request headers a caller sends so a router can say whose call it routed, and
what a missing one means. One table for every router integration that reads them (HAProxy's log,
LiteLLM's callback); the emulated fleet's agents send them (:mod:`fleetloop.edges.fleet.agents`).

| header | RequestOutcome field | when absent |
|---|---|---|
| ``x-fleetloop-request`` | ``request_id`` | the router's own id for the call |
| ``x-fleetloop-attempt`` | ``attempt`` | 0 |
| ``x-fleetloop-task`` | ``workflow_id`` | the request id |
| ``x-fleetloop-call`` (index in the task) | ``step_index`` | 0 |
| ``x-fleetloop-tenant`` | ``tenant_id`` | ``anonymous`` |
| ``x-fleetloop-priority`` | ``priority`` | the integration's default (1) |
| ``x-fleetloop-budget-ms`` | ``latency_budget_ms`` | 0 (unknown) |
| ``x-fleetloop-prefix`` | ``prefix_digest`` | none |
| ``x-fleetloop-prompt-tokens`` | ``prompt_tokens`` | 0 (unknown) |
| ``x-fleetloop-final`` (``1``/``true``: last) | ``task_outcome``: ``succeeded`` if ok | last if no task |

A caller that knows which call ends its task says so with ``x-fleetloop-final: 1``. A router sees
only the call, not the task, so without it no call it reports ends a named task: the daemon's ledger
then lets the task go only after its handoff horizon, and until then counts it as open. A call that
names no task (neither ``x-fleetloop-task`` nor ``x-fleetloop-final``) is a task of its own, known by
the call's id, and its own last call: its success ends it. Left open, every such call would count as
an open task for the whole horizon, and the ledger's open count, which holds a pool's scale-down
while tasks accumulate, would climb with the call rate wherever calls come without fleetloop's
headers (HAProxy or LiteLLM before callers send them; the per-worker counts of vllm-router and
SGLang's router, which carry no call's headers at all). A final call that fails carries no task
outcome (the caller may retry it; only the caller knows when it gives up).

A value that is not a number where one is wanted counts as absent; the schema's own bounds (an id's
characters, a priority of 0-9) are the caller's :class:`~fleetloop.schemas.requests.RequestOutcome`
to enforce.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

PREFIX = "x-fleetloop-"
HEADERS = (
    "request",
    "attempt",
    "task",
    "call",
    "tenant",
    "priority",
    "budget-ms",
    "prefix",
    "prompt-tokens",
    "final",
)
DEFAULT_PRIORITY = 1


@dataclass(frozen=True, slots=True)
class CallHeaders:
    """What the headers say of one call (the fields of its RequestOutcome they fill)."""

    request_id: str
    attempt: int
    workflow_id: str
    step_index: int
    tenant_id: str
    priority: int
    latency_budget_ms: int
    prefix_digest: str | None
    prompt_tokens: int
    final: bool = False  # the task's last call (``x-fleetloop-final: 1``)

    def outcome_fields(self, outcome: str) -> dict[str, Any]:
        """The fields of the call's RequestOutcome the headers fill, ``task_outcome`` included
        (:func:`task_end`), as they are: the schema refuses what is out of its bounds."""
        return {
            "request_id": self.request_id,
            "attempt": self.attempt,
            "workflow_id": self.workflow_id,
            "step_index": self.step_index,
            "tenant_id": self.tenant_id,
            "priority": self.priority,
            "latency_budget_ms": self.latency_budget_ms,
            "prompt_tokens": self.prompt_tokens,
            "prefix_digest": self.prefix_digest,
            "task_outcome": task_end(self, outcome),
        }


def task_end(call: CallHeaders, outcome: str) -> Literal["succeeded"] | None:
    """The ``task_outcome`` a router's record of ``call`` carries: ``succeeded`` when the caller said
    it is its task's last call and it succeeded; else none (a failed last call may be retried, and
    only the caller knows when it gives up)."""
    return "succeeded" if call.final and outcome == "ok" else None


def _int(v: str, default: int) -> int:
    try:
        return int(v)
    except ValueError:
        return default


def call_headers(values: Mapping[str, str], *, request_id: str, default_priority: int) -> CallHeaders:
    """The table above over ``values`` (header name without ``x-fleetloop-`` -> its text, ``""`` or
    missing when absent); ``request_id`` is the router's own id for the call."""

    def get(name: str) -> str:
        return values.get(name) or ""

    rid = get("request") or request_id
    return CallHeaders(
        request_id=rid,
        attempt=_int(get("attempt"), 0),
        workflow_id=get("task") or rid,
        step_index=_int(get("call"), 0),
        tenant_id=get("tenant") or "anonymous",
        priority=_int(get("priority"), default_priority),
        latency_budget_ms=_int(get("budget-ms"), 0),
        prefix_digest=get("prefix") or None,
        prompt_tokens=max(0, _int(get("prompt-tokens"), 0)),
        final=get("final").strip().lower() in ("1", "true") if get("final") else not get("task"),
    )
