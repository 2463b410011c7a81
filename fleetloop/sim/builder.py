"""Scenario documents built in code: the small two-tenant fleet that ``fleetloop demo`` runs and the
tests simulate. Gold's copilot tasks (priority 0, several calls sharing a prefix) and free's single
chatbot calls (priority 2) over pools of one model each; each user states only what differs (its
pools, faults, and any workload field it changes), so the workload is written once.

The result is a plain document (a dict, as a scenario file parses to), for
:func:`fleetloop.sim.scenario.parse_scenario`; a caller may change it first.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Final

# The demo's workload; a scenario changes a field by naming it in ``copilot`` or ``chatbot``.
COPILOT: Final[Mapping[str, Any]] = {
    "kind": "copilot",
    "tenant": "gold",
    "rate_per_s": 0.6,
    "calls": [3, 6],
    "prompt_tokens": {"median": 1500, "max": 12000},
    "output_tokens": {"median": 200, "max": 1500},
    "shared_prefix_tokens": 1000,
    "models": ["llama-8b"],
    "deadline_s": 45,
    "client": {"timeout_s": 8, "max_retries": 2},
}
CHATBOT: Final[Mapping[str, Any]] = {
    "kind": "chatbot",
    "tenant": "free",
    "rate_per_s": 2.0,
    "calls": [1, 1],
    "prompt_tokens": {"median": 600, "max": 6000},
    "output_tokens": {"median": 200, "max": 1500},
    "models": ["llama-8b"],
    "deadline_s": 30,
    "client": {"timeout_s": 8, "max_retries": 2},
}
TENANTS: Final = ({"id": "gold", "priority": 0}, {"id": "free", "priority": 2})


def pool(
    pool_id: str,
    model: str,
    gpu: str,
    nodes: int,
    *,
    cold_start_s: float,
    min_nodes: int | None = None,
    max_nodes: int | None = None,
) -> dict[str, Any]:
    """A pool of ``nodes`` nodes; fixed at that size unless ``min_nodes``/``max_nodes`` say else."""
    return {
        "id": pool_id,
        "model": model,
        "gpu": gpu,
        "nodes": nodes,
        "min_nodes": nodes if min_nodes is None else min_nodes,
        "max_nodes": nodes if max_nodes is None else max_nodes,
        "cold_start_s": cold_start_s,
    }


def two_tenant_scenario(
    name: str,
    *,
    seed: int,
    duration_s: int,
    slo: Mapping[str, int],
    pools: Sequence[Mapping[str, Any]],
    faults: Sequence[Mapping[str, Any]] = (),
    copilot: Mapping[str, Any] | None = None,
    chatbot: Mapping[str, Any] | None = None,
    description: str | None = None,
) -> dict[str, Any]:
    """The scenario document: ``pools`` serving gold's copilot tasks and free's chatbot calls
    (:data:`COPILOT`, :data:`CHATBOT` with the fields ``copilot`` and ``chatbot`` name replaced),
    with ``faults``. A fresh document each call: changing it changes nothing else."""
    doc: dict[str, Any] = {"name": name}
    if description is not None:
        doc["description"] = description
    doc |= {
        "seed": seed,
        "duration_s": duration_s,
        "slo": dict(slo),
        "pools": list(pools),
        "tenants": list(TENANTS),
        "workload": [{**COPILOT, **(copilot or {})}, {**CHATBOT, **(chatbot or {})}],
        "faults": list(faults),
    }
    return copy.deepcopy(doc)
