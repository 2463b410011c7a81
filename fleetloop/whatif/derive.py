"""A recorded window as a scenario (pure: decoded records in, a validated scenario out; no I/O).

Input: the window ``[from_ms, to_ms)`` in event time, and the ``RequestOutcome`` and
``NodeTelemetry`` records read from ``fleet.requests`` and ``fleet.telemetry`` (any order). Tasks
are the window's: a workflow whose first call (step 0) was *sent* inside the window
(sent = ``ts_ms - e2e_ms``). Their later outcomes count even past ``to_ms``, as the simulator also
runs a scenario's tasks to their end after arrivals stop.

Workload, one entry per tenant (its most common priority):
- ``rate_per_s`` = the tenant's tasks started in the window / the window's seconds (Poisson in the
  simulator), outside the window's longest burst of arrivals when there is one: that burst becomes
  a ``load_spike`` fault (all tenants; see :func:`_spike` for when a burst counts).
- ``calls`` = [min, max] of the calls of its succeeded tasks (highest step index + 1); with none
  succeeded, the most steps any task reached. ``kind``: ``chatbot`` when every task is one call,
  else by the median calls: <= 20 ``copilot``, <= 200 ``research``, more ``autonomous`` (a label).
- ``prompt_tokens`` over one record per call (retries repeat the size), ``output_tokens`` over the
  calls answered ``ok``: median and max (the simulator's lognormal puts its 99.9th percentile at max).
- ``shared_prefix_tokens``: with prefix digests on the calls, the median over multi-call tasks of the
  most prompt tokens a later call found cached (a lower bound: a miss finds nothing); else 0.
- ``models``: the models the tenant's calls ran on, most calls first.
- ``client.timeout_s``: the largest ``latency_budget_ms`` (a router's budget is the client's timeout
  or what is left of the deadline, whichever is less). ``deadline_s``: from the attempts whose budget
  was the deadline's rest: ``sent - task start + budget`` (median); when no attempt was cut by its
  deadline, the longest task seen (a lower bound, noted). ``max_retries``: the highest attempt index
  seen (a tenant that never retried takes the fleet's highest, noted). ``stream: false`` when a
  call timed out mid-answer (a first token and ``e2e`` at its budget, not the task's last call):
  only a non-streaming client gives up after tokens flowed. A call that ended past its budget
  (a node lost under a streaming call after the budget, retried as an error) is no such timeout.

Fleet, one pool per ``pool_id`` seen in telemetry inside the window:
- ``model``, ``gpu`` mapped to the simulator's catalog by name (``NVIDIA-H100-80GB-HBM3`` -> H100,
  ``meta-llama/Llama-3.1-8B-Instruct`` -> llama-8b); an unknown one is a :class:`DeriveError`.
  ``gpus_per_node`` only where it differs from the catalog's choice and is a power of two (the
  simulator models tensor parallelism, which splits attention heads evenly; 6 GPUs are pipeline
  stages too, which it does not model, so the catalog's choice stands) (and ``precision: fp8`` when
  the model fits that many GPUs in FP8 only; the telemetry does not say).
- ``nodes``: those reporting in the pool's first two intervals; ``min_nodes``/``max_nodes``: the
  fewest/most nodes reporting in any two-interval bucket of the window (the recorded autoscaler's
  range; bounds the candidate's autoscaler to it too).
- ``cold_start_s`` when a node was seen booting (cold or loading, then warm): the median boot.
- ``engine`` (and ``engine_version``): the serving engine the pool ran, given to :func:`derive`
  per pool (``fleetloop whatif --engine``), else the one its telemetry names most
  (``NodeTelemetry.engine``, which ``fleetloop scrape`` sets from the runtime it reads), at that
  engine's current release; a pool with neither (records from before the field, or naming an
  engine without a runtime profile) is simulated as vLLM V1 (noted). The engine sets the simulated
  node's per-request and per-step costs, batching and KV share (:mod:`fleetloop.perf.engines`).

Faults (``at_s`` relative to ``from_ms``):
- ``degrade``: a node whose TBT p50 (TTFT p50 where a pool reports no TBT) is >= 2.5x the median of
  its pool's other nodes' reports within 5 intervals of it (in pools of more than 32 nodes, of all
  its nodes' reports: one median per interval), for 3 of its reports in a row, until 3 in a row
  under 1.5x (no reports, e.g. while its breaker is open, do not end it). Its start moves back over
  the reports right before it in which the node was busy but finished no token to time (a healthy
  busy node always does). ``factor`` = the lower quartile of the ratios over the episode: a slowed
  node that queues runs larger batches and its TBT grows past the slowdown itself, which its
  lightly loaded reports show. A one-node pool has no peers: noted, not derived.
- Faults are read until the window's tasks resolved (the simulator runs them past ``to_ms`` too).
- ``crash``: a node that stops reporting 3+ intervals before the window ends while its pool goes on,
  not draining, and with work in flight at its last report or a failed call on it after that (a
  node an autoscaler removed idle leaves neither: noted, not a fault).
- ``preempt``: a node that reported ``warm`` and then ``cold``/``loading`` without draining.
- A node that was not in the pool at the start is named by pool (``count: 1``).

Observed KPIs (the fidelity check's reference, same definitions as ``fleetloop sim``):
- task success = succeeded / (succeeded + failed) over the window's tasks (unresolved ones are
  counted apart); priority-0 success likewise;
- TTFT p99 over the ``ok`` calls of the window's tasks;
- cost per successful task = fleet spend (every node's ``cost_rate_usd_per_h`` x ``interval_ms``
  over the window and until its last task resolved: provisioned time, idle included, as the
  simulator counts it) / tasks succeeded. Without cost rates in telemetry, the outcomes' own
  ``cost_usd`` (attributed GPU time only; ``cost_source`` says which).
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from fleetloop.perf.catalog import GPUS, MODELS, node_spec
from fleetloop.perf.engines import DEFAULT_ENGINE, DEFAULT_FAMILY, ENGINES, FAMILIES
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.telemetry import NodeTelemetry
from fleetloop.sim.scenario import Scenario, ScenarioError, parse_scenario

DEGRADE_ON = 2.5  # ratio to the pool's median that starts a degrade episode
DEGRADE_OFF = 1.5  # ratio under which it ends
SUSTAIN = 3  # reports in a row to start or end an episode
PEER_SPAN = 5  # a report is compared with its pool's other nodes' reports this many intervals around it
SPIKE_FACTOR = 2.0  # a burst's buckets hold at least this many times the median bucket's arrivals
SPIKE_MIN_BUCKETS = 2
SPIKE_MIN_BASE = 5  # arrivals in the median bucket below which bursts are not looked for
EXACT_PEERS = 32  # above this many nodes in a pool, the median includes the node's own reports
CRASH_SILENT_INTERVALS = 3
DEFAULT_SLO = {"ttft_ms": 2000, "tbt_ms": 100}


class DeriveError(ValueError):
    """The window cannot be made into a scenario. ``str()`` is one line."""


@dataclass(frozen=True, slots=True)
class Observed:
    """What the window's tasks did on the real fleet (see the module docstring for definitions)."""

    tasks_started: int
    tasks_succeeded: int
    tasks_failed: int
    tasks_unresolved: int
    success_rate: float | None
    p0_tasks: int
    p0_success_rate: float | None
    ttft_p99_ms: float | None
    fleet_cost_usd: float
    cost_source: str  # telemetry | outcomes
    cost_per_successful_task_usd: float | None
    costed_until_ms: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Derived:
    scenario: Scenario
    document: dict[str, Any]  # the scenario as a YAML-ready mapping
    observed: Observed
    notes: tuple[str, ...]


@dataclass(slots=True)
class _Task:
    tenant: str
    priorities: Counter[int] = field(default_factory=Counter)
    start_ms: float = math.inf  # sent time of its first step-0 attempt
    last_ms: int = 0
    outcome: str | None = None
    steps: int = 0  # highest step index seen + 1
    prompts: dict[int, int] = field(default_factory=dict)
    outputs: list[int] = field(default_factory=list)
    models: Counter[str] = field(default_factory=Counter)
    attempts: list[tuple[float, int]] = field(default_factory=list)  # (sent ms, budget ms)
    cached_later: int = 0  # most prompt tokens found cached by a call after the first
    prefix: bool = False
    ttfts: list[float] = field(default_factory=list)
    non_streaming: bool = False
    max_attempt: int = 0
    cost_usd: float = 0.0


def derive(
    outcomes: Iterable[RequestOutcome],
    telemetry: Sequence[NodeTelemetry],
    *,
    from_ms: int,
    to_ms: int,
    name: str = "whatif",
    seed: int = 1,
    engines: Mapping[str, tuple[str, str | None]] | None = None,
) -> Derived:
    """The window's workload, fleet and faults as a validated scenario, and what was observed.
    ``engines``: pool id (or ``*`` for every pool) -> (engine, release family or None for the
    engine's default), as the scrape that recorded the pool read it."""
    if to_ms <= from_ms:
        raise DeriveError(f"the window is empty or reversed (from {from_ms} ms, to {to_ms} ms)")
    notes: list[str] = []
    failures: dict[str, list[int]] = defaultdict(list)
    tasks = _tasks(outcomes, failures)
    started = {k: t for k, t in tasks.items() if from_ms <= t.start_ms < to_ms}
    if not started:
        raise DeriveError(
            f"no task started in the window ({len(tasks)} workflows on fleet.requests, none with its "
            "first call sent between --from and --to)"
        )
    tel = sorted((t for t in telemetry if from_ms <= t.ts_ms < to_ms), key=lambda t: (t.ts_ms, t.node_id))
    if not tel:
        raise DeriveError("no node telemetry in the window: the fleet's shape cannot be derived")
    window_s = (to_ms - from_ms) / 1000.0
    pools, index, pool_notes = _pools(tel)
    notes.extend(pool_notes)
    notes.extend(_engines(pools, engines or {}, _reported_engines(tel)))
    spike = _spike([t.start_ms for t in started.values()], from_ms, to_ms)
    tenants, workload, wl_notes = _workload(started, window_s, spike, from_ms)
    notes.extend(wl_notes)
    served = {p["model"] for p in pools}
    for w in workload:
        if not served.intersection(w["models"]):
            w["models"] = [*w["models"], *sorted(served)]
            notes.append(
                f"tenant {w['tenant']}: its calls' models are not served by any pool in the window; "
                f"it may fall back to {', '.join(sorted(served))}"
            )
    # Faults until the window's tasks resolved: the simulator runs them past --to as well.
    until = max(to_ms, *(t.last_ms + 1 for t in started.values()))
    tel_faults = sorted(
        (t for t in telemetry if from_ms <= t.ts_ms < until), key=lambda t: (t.ts_ms, t.node_id)
    )
    faults, fault_notes = _faults(tel_faults, failures, index, from_ms, until)
    notes.extend(fault_notes)
    if spike is not None:
        at, dur, factor = spike
        faults.append({"at_s": at, "kind": "load_spike", "factor": factor, "duration_s": dur})
        faults.sort(key=lambda f: (f["at_s"], f["kind"], f.get("node") or f.get("pool") or ""))
    document: dict[str, Any] = {
        "name": name,
        "description": (
            f"derived by fleetloop whatif from the recorded window {from_ms}..{to_ms} (epoch ms): "
            f"{len(started)} tasks, {len(tel)} telemetry records"
        ),
        "seed": seed,
        "duration_s": round(window_s, 3),
        "slo": dict(DEFAULT_SLO),
        "pools": pools,
        "tenants": tenants,
        "workload": workload,
        "faults": faults,
    }
    try:
        scenario = parse_scenario(document, "<derived scenario>")
    except ScenarioError as exc:
        raise DeriveError(str(exc)) from None
    observed = _observed(started, telemetry, from_ms, to_ms)
    return Derived(scenario=scenario, document=document, observed=observed, notes=tuple(notes))


# -- tasks and workload -----------------------------------------------------------------------------


def _tasks(
    outcomes: Iterable[RequestOutcome], failures: dict[str, list[int]]
) -> dict[tuple[str, str], _Task]:
    """Outcomes by task; ``failures`` collects, per node, when a call placed on it failed."""
    tasks: dict[tuple[str, str], _Task] = {}
    for o in outcomes:
        if o.diverted_to is not None:  # a moved call's copy (diverted_copy): the call is counted once
            continue
        key = (o.tenant_id, o.workflow_id)
        t = tasks.get(key)
        if t is None:
            t = tasks[key] = _Task(tenant=o.tenant_id)
        sent = o.ts_ms - o.e2e_ms
        t.priorities[o.priority] += 1
        if o.step_index == 0:
            t.start_ms = min(t.start_ms, sent)
        t.last_ms = max(t.last_ms, o.ts_ms)
        t.steps = max(t.steps, o.step_index + 1)
        t.prompts.setdefault(o.step_index, o.prompt_tokens)
        t.models[o.model] += 1
        t.attempts.append((sent, o.latency_budget_ms))
        t.max_attempt = max(t.max_attempt, o.attempt)
        t.cost_usd += o.cost_usd
        if o.prefix_digest is not None:
            t.prefix = True
            if o.step_index > 0:
                t.cached_later = max(t.cached_later, o.cached_prompt_tokens)
        if o.outcome in ("error", "retry") and o.node_id is not None:
            failures[o.node_id].append(o.ts_ms)
        if o.outcome == "ok":
            t.outputs.append(o.output_tokens)
            if o.ttft_ms is not None:
                t.ttfts.append(o.ttft_ms)
        elif (
            o.outcome in ("timeout", "retry")
            and o.task_outcome is None
            and o.ttft_ms is not None
            and o.latency_budget_ms > 0
            and abs(o.e2e_ms - o.latency_budget_ms) <= 5  # ended at its budget: the client's timer
        ):
            t.non_streaming = True
        if o.task_outcome is not None:
            t.outcome = o.task_outcome
    return tasks


def _median_int(xs: Sequence[float]) -> int:
    return max(1, round(float(np.median(np.asarray(xs, dtype=np.float64)))))


def _kind(calls: Sequence[int]) -> str:
    if calls and max(calls) == 1:
        return "chatbot"
    med = float(np.median(calls)) if calls else 1.0
    return "copilot" if med <= 20 else "research" if med <= 200 else "autonomous"


def _spike(starts: Sequence[float], from_ms: int, to_ms: int) -> tuple[float, float, float] | None:
    """The longest burst of task arrivals: (at_s, duration_s, factor), or None.

    Arrivals are counted in buckets of max(10 s, window / 30). The base is the median bucket (the
    burst itself does not move it); a burst is 2+ buckets in a row at >= 2x the base, looked for only
    when the base is >= 5 arrivals a bucket (below, Poisson noise alone makes such runs). Its factor
    is the burst's rate over the rate outside it."""
    window_s = (to_ms - from_ms) / 1000.0
    bucket_s = max(10.0, window_s / 30.0)
    nb = int(window_s // bucket_s)
    if nb < 4:
        return None
    counts = [0] * nb
    for s in starts:
        k = int((s - from_ms) / 1000.0 // bucket_s)
        if 0 <= k < nb:
            counts[k] += 1
    base = float(np.median(counts))
    if base < SPIKE_MIN_BASE:
        return None
    hot = [c >= SPIKE_FACTOR * base for c in counts]
    best: tuple[int, int] | None = None
    i = 0
    while i < nb:
        if not hot[i]:
            i += 1
            continue
        j = i
        while j < nb and hot[j]:
            j += 1
        if j - i >= SPIKE_MIN_BUCKETS and (best is None or j - i > best[1] - best[0]):
            best = (i, j)
        i = j
    if best is None:
        return None
    i, j = best
    inside_s = (j - i) * bucket_s
    inside_n = sum(counts[i:j])
    outside_rate = (len(starts) - inside_n) / max(1e-9, window_s - inside_s)
    if outside_rate <= 0:
        return None
    return (
        round(i * bucket_s, 1),
        round(inside_s, 1),
        round(min(1000.0, inside_n / inside_s / outside_rate), 2),
    )


def _workload(
    started: dict[tuple[str, str], _Task],
    window_s: float,
    spike: tuple[float, float, float] | None,
    from_ms: int,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    notes: list[str] = []
    by_tenant: dict[str, list[_Task]] = defaultdict(list)
    for t in started.values():
        by_tenant[t.tenant].append(t)
    tenants: list[dict[str, Any]] = []
    workload: list[dict[str, Any]] = []
    fleet_retries = max(t.max_attempt for t in started.values())
    for tenant in sorted(by_tenant):
        ts = by_tenant[tenant]
        prio: Counter[int] = Counter()
        for t in ts:
            prio.update(t.priorities)
        tenants.append({"id": tenant, "priority": prio.most_common(1)[0][0]})
        done_calls = [t.steps for t in ts if t.outcome == "succeeded"]
        if done_calls:
            lo, hi = min(done_calls), max(done_calls)
        else:
            lo = hi = max(t.steps for t in ts)
            notes.append(
                f"tenant {tenant}: no task succeeded; calls per task is the most steps reached ({hi})"
            )
        prompts = [p for t in ts for p in t.prompts.values()]
        outputs = [o for t in ts for o in t.outputs] or [1]
        if not any(t.outputs for t in ts):
            notes.append(f"tenant {tenant}: no call answered ok; output tokens unknown (1)")
        models: Counter[str] = Counter()
        for t in ts:
            models.update(t.models)
        model_names = []
        for m, _ in sorted(models.items(), key=lambda kv: (-kv[1], kv[0])):
            name = catalog_model(m)
            if name not in model_names:
                model_names.append(name)
        budgets = [b for t in ts for _, b in t.attempts]
        timeout_ms = max(budgets) if budgets else 0
        if timeout_ms <= 0:
            timeout_ms = 30_000
            notes.append(f"tenant {tenant}: no latency budget on its calls; client timeout 30 s assumed")
        cut = [sent - t.start_ms + b for t in ts for sent, b in t.attempts if 0 <= b < timeout_ms - 2]
        if cut:
            deadline_s = round(float(np.median(cut)) / 1000.0, 3)
        else:
            resolved = [t.last_ms - t.start_ms for t in ts if t.outcome is not None]
            longest = max(resolved) if resolved else timeout_ms * max(hi, 1)
            deadline_s = math.ceil(max(longest, timeout_ms) / 1000.0)
            notes.append(
                f"tenant {tenant}: no call was cut by its deadline; deadline_s {deadline_s} is the longest "
                "task seen (a lower bound)"
            )
        prefix_tasks = [t.cached_later for t in ts if t.prefix and t.steps > 1]
        shared = _median_int(prefix_tasks) if prefix_tasks and max(prefix_tasks) > 0 else 0
        retries = max(t.max_attempt for t in ts)
        if retries == 0 and fleet_retries > 0:
            retries = fleet_retries
            notes.append(
                f"tenant {tenant}: no retry seen; max_retries {retries} as the other tenants' clients"
            )
        client: dict[str, Any] = {"timeout_s": round(timeout_ms / 1000.0, 3), "max_retries": min(20, retries)}
        if any(t.non_streaming for t in ts):
            client["stream"] = False
        entry: dict[str, Any] = {
            "kind": _kind([t.steps for t in ts if t.outcome == "succeeded"] or [hi]),
            "tenant": tenant,
            "rate_per_s": round(_base_rate(ts, window_s, spike, from_ms), 6),
            "calls": [lo, hi],
            "prompt_tokens": {"median": _median_int(prompts), "max": max(1, *prompts)},
            "output_tokens": {"median": _median_int(outputs), "max": max(1, *outputs)},
            "shared_prefix_tokens": min(shared, 1_000_000),
            "models": model_names,
            "deadline_s": deadline_s,
            "client": client,
        }
        for k in ("prompt_tokens", "output_tokens"):
            d = entry[k]
            d["median"] = min(d["median"], 1_000_000)
            d["max"] = min(max(d["max"], d["median"]), 1_000_000)
        workload.append(entry)
    return tenants, workload, notes


# -- the fleet ----------------------------------------------------------------------------------------


def _base_rate(
    ts: Sequence[_Task], window_s: float, spike: tuple[float, float, float] | None, from_ms: int
) -> float:
    """Arrivals per second outside a burst (the burst is a ``load_spike`` fault on top of it)."""
    if spike is None:
        return len(ts) / window_s
    at, dur, _ = spike
    outside = [t for t in ts if not at <= (t.start_ms - from_ms) / 1000.0 < at + dur]
    return max(1e-6, len(outside) / (window_s - dur))


def catalog_gpu(name: str) -> str:
    """A reported GPU type as the catalog's name (``NVIDIA-H100-80GB-HBM3`` -> ``H100``)."""
    if name in GPUS:
        return name
    up = name.upper().replace(" ", "").replace("-", "")
    for known in sorted(GPUS, key=len, reverse=True):
        if known.upper() in up:
            return known
    raise DeriveError(
        f"GPU type {name!r} in telemetry is not in the simulator's catalog ({', '.join(sorted(GPUS))})"
    )


def catalog_model(name: str) -> str:
    """A reported model as the catalog's name (``meta-llama/Llama-3.1-8B-Instruct`` -> ``llama-8b``)."""
    if name in MODELS:
        return name
    low = name.lower()
    size = re.search(r"(?<![0-9.])([0-9]+)b\b", low.replace("_", "-"))
    family = "qwen" if "qwen" in low else "llama" if "llama" in low else None
    if size is not None and family is not None:
        guess = f"{family}-{size.group(1)}b"
        if guess in MODELS:
            return guess
    raise DeriveError(f"model {name!r} is not in the simulator's catalog ({', '.join(sorted(MODELS))})")


def _node_index(pool: str, initial: Sequence[str]) -> dict[str, int]:
    """Recorded node ids -> the simulator's ``<pool>/<index>`` indices (identity when they are already
    ``<pool>/0..n-1``, else in sorted order)."""
    ids = sorted(initial)
    nums = []
    for n in ids:
        head, _, tail = n.rpartition("/")
        if head != pool or not tail.isdigit():
            break
        nums.append(int(tail))
    if len(nums) == len(ids) and sorted(nums) == list(range(len(ids))):
        return {n: int(n.rpartition("/")[2]) for n in ids}
    return {n: i for i, n in enumerate(ids)}


def _pools(
    tel: Sequence[NodeTelemetry],
) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]], list[str]]:
    notes: list[str] = []
    by_pool: dict[str, list[NodeTelemetry]] = defaultdict(list)
    for t in tel:
        by_pool[t.pool_id].append(t)
    pools: list[dict[str, Any]] = []
    index: dict[str, dict[str, int]] = {}
    for pool_id in sorted(by_pool):
        rs = by_pool[pool_id]
        interval = _median_int([r.interval_ms for r in rs])
        bucket = 2 * interval
        t0, t_last = rs[0].ts_ms, rs[-1].ts_ms
        initial = sorted({r.node_id for r in rs if r.ts_ms < t0 + bucket})
        index[pool_id] = _node_index(pool_id, initial)
        full = (t_last + 1 - t0) // bucket  # whole buckets only: a cut one would read as nodes lost
        seen: dict[int, set[str]] = defaultdict(set)
        for r in rs:
            k = (r.ts_ms - t0) // bucket
            if k < full:
                seen[k].add(r.node_id)
        counts = [len(seen.get(k, ())) for k in range(full)] or [len(initial)]
        nodes = len(initial)
        model = catalog_model(Counter(r.model for r in rs).most_common(1)[0][0])
        gpu = catalog_gpu(Counter(r.gpu_type for r in rs).most_common(1)[0][0])
        gpus = Counter(r.gpu_count for r in rs).most_common(1)[0][0]
        entry: dict[str, Any] = {
            "id": pool_id,
            "model": model,
            "gpu": gpu,
            "nodes": nodes,
            "min_nodes": min(*counts, nodes),
            "max_nodes": max(*counts, nodes),
        }
        if gpus != node_spec(model, gpu).gpus and not gpus & (gpus - 1):
            entry["gpus_per_node"] = gpus
            if (
                node_spec(model, gpu, gpus).kv_capacity_tokens
                < 1024
                <= node_spec(model, gpu, gpus, "fp8").kv_capacity_tokens
            ):
                entry["precision"] = "fp8"
                notes.append(f"pool {pool_id}: {model} fits {gpus} x {gpu} in fp8 only: precision fp8")
        boots = _boot_times(rs)
        if boots:
            entry["cold_start_s"] = round(float(np.median(boots)) / 1000.0, 1)
        pools.append(entry)
        if len(initial) < len({r.node_id for r in rs}):
            notes.append(
                f"pool {pool_id}: {len({r.node_id for r in rs}) - len(initial)} node(s) joined during the "
                "window (the simulated autoscaler decides its own)"
            )
    return pools, index, notes


def engine_arg(text: str) -> tuple[str, tuple[str, str | None]]:
    """``[POOL=]ENGINE[:FAMILY]`` (``fleetloop whatif --engine``) as (pool or ``*``, (engine,
    family)). A ValueError names what is wrong, in one line."""
    pool, eq, rest = text.partition("=")
    if not eq:
        pool, rest = "*", text
    engine, colon, family = rest.partition(":")
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r} in {text!r} (known: {', '.join(ENGINES)})")
    if colon and family not in FAMILIES[engine]:
        raise ValueError(
            f"{engine} has no profile {family!r} in {text!r} (known: {', '.join(FAMILIES[engine])})"
        )
    if not pool:
        raise ValueError(f"an empty pool name in {text!r}")
    return pool, (engine, family if colon else None)


def _reported_engines(tel: Sequence[NodeTelemetry]) -> dict[str, str]:
    """Per pool, the engine its telemetry names most (``NodeTelemetry.engine``, ties to the first
    name), among the engines that have a runtime profile; a pool whose records name none is left out."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for t in tel:
        if t.engine in ENGINES:
            counts[t.pool_id][t.engine] += 1
    out: dict[str, str] = {}
    for pool_id, c in counts.items():
        top = max(c.values())
        out[pool_id] = min(e for e, n in c.items() if n == top)
    return out


def _engines(
    pools: list[dict[str, Any]],
    engines: Mapping[str, tuple[str, str | None]],
    reported: Mapping[str, str] | None = None,
) -> list[str]:
    """Set each pool's engine from ``engines`` (its own entry, else ``*``), else from the engine its
    telemetry names (``reported``, at that engine's current release); a pool named there that the
    window does not hold, and a pool with neither, are noted."""
    notes: list[str] = []
    ids = {p["id"] for p in pools}
    unknown = sorted(set(engines) - ids - {"*"})
    if unknown:
        notes.append(f"--engine names pool(s) not in the window: {', '.join(unknown)}")
    for p in pools:
        given = engines.get(p["id"], engines.get("*"))
        if given is None and reported is not None and p["id"] in reported:
            given = (reported[p["id"]], None)
        if given is None:
            notes.append(
                f"pool {p['id']}: telemetry does not name the serving engine; simulated as "
                f"{DEFAULT_ENGINE} {DEFAULT_FAMILY[DEFAULT_ENGINE]} (whatif --engine names it)"
            )
            continue
        engine, family = given
        p["engine"] = engine
        if family is not None:
            p["engine_version"] = family
    return notes


def _boot_times(rs: Sequence[NodeTelemetry]) -> list[int]:
    first_cold: dict[str, int] = {}
    boots: list[int] = []
    for r in rs:
        if r.weights_state in ("cold", "loading"):
            first_cold.setdefault(r.node_id, r.ts_ms - r.interval_ms)
        elif r.node_id in first_cold:
            boots.append(r.ts_ms - first_cold.pop(r.node_id))
    return boots


# -- faults ---------------------------------------------------------------------------------------------


def _faults(
    tel: Sequence[NodeTelemetry],
    failures: dict[str, list[int]],
    index: dict[str, dict[str, int]],
    from_ms: int,
    to_ms: int,
) -> tuple[list[dict[str, Any]], list[str]]:
    notes: list[str] = []
    faults: list[dict[str, Any]] = []
    by_pool: dict[str, list[NodeTelemetry]] = defaultdict(list)
    for t in tel:
        by_pool[t.pool_id].append(t)

    def at(ts: float) -> float:
        return round(max(0.0, (ts - from_ms) / 1000.0), 1)

    def target(pool: str, node: str) -> dict[str, Any]:
        i = index[pool].get(node)
        return {"node": f"{pool}/{i}"} if i is not None else {"pool": pool, "count": 1}

    for pool in sorted(by_pool):
        rs = by_pool[pool]
        interval = _median_int([r.interval_ms for r in rs])
        nodes = sorted({r.node_id for r in rs})
        for node, start, end, factor in _degrades(rs, interval):
            fault: dict[str, Any] = {"at_s": at(start), "kind": "degrade", **target(pool, node)}
            fault["factor"] = factor
            if end is not None:
                fault["duration_s"] = max(0.1, round((end - start) / 1000.0, 1))
            faults.append(fault)
        if len(nodes) < 2:
            notes.append(f"pool {pool}: one node, no peers to compare: slowdowns not derived")
        last_pool_ts = rs[-1].ts_ms
        by_node: dict[str, list[NodeTelemetry]] = defaultdict(list)
        for r in rs:
            by_node[r.node_id].append(r)
        for node in nodes:
            series = by_node[node]
            for prev, cur in itertools.pairwise(series):
                if prev.weights_state == "warm" and cur.weights_state != "warm" and not prev.draining:
                    faults.append(
                        {"at_s": at(cur.ts_ms - cur.interval_ms), "kind": "preempt", **target(pool, node)}
                    )
            last = series[-1]
            silent = CRASH_SILENT_INTERVALS * interval
            if last.draining or last.ts_ms + silent > min(to_ms, last_pool_ts):
                continue
            busy = last.running_requests + last.queue_depth > 0
            failed_after = any(ts >= last.ts_ms - interval for ts in failures.get(node, ()))
            if busy or failed_after:
                faults.append({"at_s": at(last.ts_ms), "kind": "crash", **target(pool, node)})
            else:
                notes.append(
                    f"node {node} stopped reporting idle at {at(last.ts_ms)} s (a scale-in, or a crash "
                    "with nothing in flight): not a fault"
                )
    faults.sort(key=lambda f: (f["at_s"], f["kind"], f.get("node") or f.get("pool") or ""))
    return faults, notes


def _degrades(rs: Sequence[NodeTelemetry], interval: int) -> list[tuple[str, int, int | None, float]]:
    """Slow-down episodes in one pool: (node, start ms, end ms or None, factor)."""
    has_tbt = any(r.tbt_p50_ms is not None for r in rs)
    buckets: dict[int, dict[str, float]] = defaultdict(dict)
    stamp: dict[int, int] = {}
    stalled: dict[str, list[tuple[int, bool]]] = defaultdict(
        list
    )  # node -> (interval start, busy, no figure)
    for r in rs:
        v = r.tbt_p50_ms if has_tbt else r.ttft_p50_ms
        stalled[r.node_id].append((r.ts_ms - r.interval_ms, (v is None or v <= 0) and r.running_requests > 0))
        if v is None or v <= 0:
            continue
        b = r.ts_ms // interval
        buckets[b][r.node_id] = v
        stamp.setdefault(b, r.ts_ms - r.interval_ms)
    ratios: dict[str, list[tuple[int, float]]] = defaultdict(list)
    many = len({r.node_id for r in rs}) > EXACT_PEERS
    for b in sorted(buckets):
        near = [buckets.get(k, {}) for k in range(b - PEER_SPAN, b + PEER_SPAN + 1)]
        if many:  # one median per interval: a node's own reports are a negligible share of it
            span = np.fromiter((x for vals in near for x in vals.values()), dtype=np.float64)
            ref = float(np.median(span))
            for node, v in buckets[b].items():
                ratios[node].append((stamp[b], v / ref))
            continue
        for node, v in buckets[b].items():
            peers = [x for vals in near for n, x in vals.items() if n != node]
            if peers:
                ratios[node].append((stamp[b], v / float(np.median(peers))))
    out: list[tuple[str, int, int | None, float]] = []
    for node in sorted(ratios):
        series = ratios[node]
        i = 0
        while i + SUSTAIN <= len(series):
            if not all(r >= DEGRADE_ON for _, r in series[i : i + SUSTAIN]):
                i += 1
                continue
            start = _backdate(stalled[node], series[i][0])
            j = i
            end: int | None = None
            while j < len(series):
                if j + SUSTAIN <= len(series) and all(r < DEGRADE_OFF for _, r in series[j : j + SUSTAIN]):
                    end = series[j][0]
                    break
                j += 1
            episode = [r for _, r in series[i:j]]
            factor = round(float(np.percentile(episode, 25)), 1)
            out.append((node, start, end, max(1.0, min(factor, 1000.0))))
            i = j + SUSTAIN if end is not None else len(series)
    return out


def _backdate(reports: Sequence[tuple[int, bool]], first_slow: int) -> int:
    """A slowdown began at its first slow report, or earlier: the reports right before it in which
    the node was busy yet finished no token to measure (a healthy busy node always does) were slow."""
    start = first_slow
    for at, stalled in reversed([x for x in reports if x[0] < first_slow]):
        if not stalled:
            break
        start = at
    return start


# -- what was observed ---------------------------------------------------------------------------------


def _observed(
    started: dict[tuple[str, str], _Task], tel: Sequence[NodeTelemetry], from_ms: int, to_ms: int
) -> Observed:
    ts = list(started.values())
    succeeded = sum(1 for t in ts if t.outcome == "succeeded")
    failed = sum(1 for t in ts if t.outcome == "failed")
    p0 = [t for t in ts if t.priorities.most_common(1)[0][0] == 0]
    p0_done = [t for t in p0 if t.outcome is not None]
    ttft = np.asarray([x for t in ts for x in t.ttfts], dtype=np.float64)
    until = max(to_ms, *(t.last_ms for t in ts))
    rate_cost = sum(
        r.cost_rate_usd_per_h * r.interval_ms / 3_600_000.0 for r in tel if from_ms < r.ts_ms <= until
    )
    if rate_cost > 0:
        cost, source = rate_cost, "telemetry"
    else:
        cost, source = sum(t.cost_usd for t in ts), "outcomes"
    return Observed(
        tasks_started=len(ts),
        tasks_succeeded=succeeded,
        tasks_failed=failed,
        tasks_unresolved=len(ts) - succeeded - failed,
        success_rate=_r(succeeded / (succeeded + failed)) if succeeded + failed else None,
        p0_tasks=len(p0),
        p0_success_rate=(
            _r(sum(1 for t in p0_done if t.outcome == "succeeded") / len(p0_done)) if p0_done else None
        ),
        ttft_p99_ms=_r(float(np.percentile(ttft, 99)), 3) if ttft.size else None,
        fleet_cost_usd=_r(cost) or 0.0,
        cost_source=source,
        cost_per_successful_task_usd=_r(cost / succeeded) if succeeded else None,
        costed_until_ms=until,
    )


def _r(x: float, nd: int = 9) -> float:
    return round(float(x), nd)
