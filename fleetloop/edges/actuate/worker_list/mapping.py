"""Desired state -> a router's worker list. Pure: no I/O, no clock (``now_s`` comes in).

vllm-router and SGLang's router balance over their workers by their own policy (cache_aware,
power_of_two, round_robin, ...); the only lever either exposes at runtime is the worker list (the
HTTP calls differ: :mod:`fleetloop.edges.actuate.vllm_router`,
:mod:`fleetloop.edges.actuate.sglang_router`). So, per mapped node:

- in the pool's fresh routing with weight > 0, no enforced open breaker, not on autoscale's drain
  list -> worker present;
- breaker ``open`` (enforced), weight 0, absent from routing (not provisioned), or draining ->
  worker removed;
- breaker ``half_open`` with weight > 0 -> present, at a full share (no weights: the probe and the
  slow-start ramp are not mapped);
- no fresh routing for ``fail_static_s`` -> every mapped worker present (plain load balancing);
- a fresh decision that would remove every mapped worker of a pool -> its workers not behind an
  enforced open breaker present (every one, if all are): fleetloop never empties a pool (the router
  library's rotation rule, :mod:`fleetloop.router.state`).

Not mapped (:data:`UNMAPPED`): weights (and so probe shares and slow start), ``by_priority``,
``prefix_affinity`` (the routers' cache_aware policies do their own), ``spill_to``,
``max_prompt_tokens``, ``slo_prompt_tokens``, shed thresholds, retry budgets (both routers have
their own retries and circuit breaker, configured at start), batching caps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fleetloop.router.state import DesiredState, rotation
from fleetloop.user_input import UserInputError, read_yaml

UNMAPPED: dict[str, str] = {
    "routing.weights (values)": "no per-worker weight: a present worker takes its policy's share",
    "breaker half_open / slow start": "a returning worker takes a full share at once",
    "routing.by_priority": "no priority classes",
    "routing.prefix_affinity": "its cache_aware policy keeps its own prefix tree",
    "routing.spill_to": "one router serves one worker list",
    "routing.max_prompt_tokens": "one router serves one worker list",
    "routing.slo_prompt_tokens": "one router serves one worker list",
    "admission.*": "no shed thresholds per worker",
    "retry_budget": "its own retries and breaker, set at start",
    "batching.max_batch_tokens": "an engine setting",
}


class WorkerMapError(ValueError):
    """A worker map the actuator cannot use (one line, for the CLI)."""


@dataclass(frozen=True, slots=True)
class WorkerMap:
    pools: Mapping[str, Mapping[str, str]]  # pool -> node id -> worker URL

    def urls(self) -> set[str]:
        return {u for nodes in self.pools.values() for u in nodes.values()}


def load_worker_map(path: str | Path) -> WorkerMap:
    """``pools: {chat: {chat/0: http://127.0.0.1:8001, chat/1: http://127.0.0.1:8002}}``: pool ->
    node id -> the worker URL the router is given."""
    try:
        doc = read_yaml(path)
    except UserInputError as exc:
        raise WorkerMapError(f"--worker-map {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("pools"), dict) or not doc["pools"]:
        raise WorkerMapError(f"--worker-map {path}: want a mapping with a non-empty 'pools' mapping")
    pools: dict[str, dict[str, str]] = {}
    seen: set[str] = set()
    for pool_id, nodes in sorted(doc["pools"].items()):
        if not isinstance(nodes, dict) or not nodes:
            raise WorkerMapError(f"--worker-map {path}: pools.{pool_id}: want node id -> worker URL")
        for node_id, url in nodes.items():
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise WorkerMapError(f"--worker-map {path}: pools.{pool_id}.{node_id}: want an http(s) URL")
            if url in seen:
                raise WorkerMapError(f"--worker-map {path}: {url} is mapped twice")
            seen.add(url)
        pools[str(pool_id)] = {str(n): str(u) for n, u in nodes.items()}
    return WorkerMap(pools)


def desired_workers(
    state: DesiredState, wmap: WorkerMap, now_s: float, fail_static_s: float
) -> dict[str, tuple[bool, str]]:
    """worker URL -> (present?, why): the router library's rotation rule
    (:func:`fleetloop.router.state.rotation`) over each pool's mapped nodes."""
    out: dict[str, tuple[bool, str]] = {}
    for pool_id, nodes in sorted(wmap.pools.items()):
        rot = rotation(state, pool_id, sorted(nodes), now_s, fail_static_s)
        for node_id in sorted(nodes):
            out[nodes[node_id]] = (rot.serves(node_id), rot.why[node_id])
    return out


def plan(want: Mapping[str, tuple[bool, str]], present: set[str]) -> list[tuple[str, str, str]]:
    """(``add`` | ``remove``, url, why) to move the router's worker list from ``present`` to ``want``."""
    steps: list[tuple[str, str, str]] = []
    for url in sorted(want):
        should, why = want[url]
        if should and url not in present:
            steps.append(("add", url, why))
        elif not should and url in present:
            steps.append(("remove", url, why))
    return steps
