"""The scenario's agent clients, over real HTTP with the official ``openai`` SDK.

Same workload model as the simulator's clients (:mod:`fleetloop.sim.clients`: Poisson task
arrivals, sequential calls, lognormal sizes, full-jitter backoff), one seeded generator stream per
workload. Per call the client asks the fleet's router for a node (the newest routing, breaker,
admission and retry-budget state from ``control.state``), then calls that node's
``/v1/chat/completions`` with ``AsyncOpenAI`` (``max_retries=0``: retries are the agent's own),
carrying the task, call, tenant and priority in ``X-Fleetloop-*`` headers with the prompt's size
and shared prefix.

- **Streaming** call (``client.stream``, the default): ``timeout_s`` bounds the wait for the first
  token; after it only the task deadline does. Giving up closes the stream, so the node sees the
  disconnect and aborts the request.
- **Non-streaming** call: ``timeout_s`` bounds the whole call; giving up drops the connection, which
  the node cannot see: the request runs on as an orphan.
- ``router_url``: every call goes to that one URL instead (a real router in front of the fleet:
  vllm-router, HAProxy); the agent picks no node, asks no retry budget and publishes no outcome
  (the router's own log is the outcome source); the message is text of the prompt's real size
  (:func:`fleetloop.edges.fleet.server.prompt_text`), its shared prefix the same text in every
  call, so a router that hashes prompts (``cache_aware``) sees the prefix as in production and one
  that drops the client's headers (SGLang's router) still delivers the prompt's size.
- Connection refused or a 5xx is an ``error``; a router that places the call nowhere, ``shed``: no
  node from fleetloop's router, or behind a router URL its 429 (LiteLLM's "no deployments
  available", a rate limiter's refusal), by the rule HAProxy's log is read with
  (:func:`fleetloop.edges.answers.answer_outcome`).
  Each attempt's outcome goes to ``fleet.requests`` keyed by pool (the last call of a task says
  whether the task succeeded). ``cost_usd`` is 0: a client cannot see GPU cost; fleetloop takes it
  from the nodes' telemetry (``cost_rate_usd_per_h``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import openai
from openai import AsyncOpenAI

from fleetloop.edges.answers import answer_outcome
from fleetloop.edges.fleet.live import LiveFleet
from fleetloop.edges.fleet.server import HDR_PREFIX, HDR_PREFIX_TOKENS, HDR_PROMPT_TOKENS, prompt_text
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.sim.clients import Task, backoff_s, draw_call, new_task, prefix_tokens

Publish = Callable[[RequestOutcome], None]


@dataclass(slots=True)
class AgentStats:
    tasks_started: int = 0
    tasks_succeeded: int = 0
    tasks_failed: int = 0
    p0_started: int = 0
    p0_succeeded: int = 0
    p0_failed: int = 0
    sent: int = 0
    ok: int = 0
    errors: int = 0
    timeouts: int = 0
    shed: int = 0
    retries: int = 0
    ttft_ms: list[float] = field(default_factory=list)

    def add(self, other: AgentStats) -> None:
        """Count ``other``'s tasks and calls in too (agents split over processes)."""
        for f in fields(self):
            if f.name == "ttft_ms":
                self.ttft_ms.extend(other.ttft_ms)
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def summary(self) -> dict[str, Any]:
        ttft = sorted(self.ttft_ms)

        def pct(q: float) -> float | None:
            return round(ttft[min(len(ttft) - 1, max(0, math.ceil(q * len(ttft)) - 1))], 1) if ttft else None

        # Rates are over tasks started, as the simulator's (fleetloop/sim/accounting.py): a task
        # still in flight when the run ended (``unfinished``) counts against them, not for them.
        started, p0 = self.tasks_started, self.p0_started
        return {
            "tasks": {
                "started": started,
                "succeeded": self.tasks_succeeded,
                "failed": self.tasks_failed,
                "unfinished": started - self.tasks_succeeded - self.tasks_failed,
                "success_rate": round(self.tasks_succeeded / started, 4) if started else None,
                "p0_started": p0,
                "p0_succeeded": self.p0_succeeded,
                "p0_failed": self.p0_failed,
                "p0_unfinished": p0 - self.p0_succeeded - self.p0_failed,
                "p0_success_rate": round(self.p0_succeeded / p0, 4) if p0 else None,
            },
            "requests": {
                "sent": self.sent,
                "ok": self.ok,
                "errors": self.errors,
                "timeouts": self.timeouts,
                "shed": self.shed,
                "retries": self.retries,
            },
            "latency": {"ttft_p50_ms": pct(0.5), "ttft_p99_ms": pct(0.99)},
        }


@dataclass(frozen=True, slots=True)
class _Attempt:
    pool_id: str
    node_id: str | None
    model: str
    ttft_ms: float | None
    e2e_ms: float
    tokens: int
    budget_ms: int
    routed_from: str | None = None  # the router's model spill moved it from this pool


class Agents:
    """Runs the scenario's workloads against ``fleet`` until an end in fleet time; tasks then finish."""

    def __init__(
        self,
        fleet: LiveFleet,
        *,
        publish: Publish | None = None,
        rate_scale: float = 1.0,
        router_url: str | None = None,
    ) -> None:
        self.fleet = fleet
        self.router_url = router_url.rstrip("/") if router_url else None
        self.scenario = fleet.scenario
        self.publish = publish
        self.rate_scale = rate_scale
        self.stats = AgentStats()
        n = len(self.scenario.workload)
        streams = fleet.rng_agents.spawn(2 * n + 1)
        self._rng_arrivals = [np.random.default_rng(streams[i]) for i in range(n)]
        self._rng_tasks = [np.random.default_rng(streams[n + i]) for i in range(n)]
        self._rng_backoff = np.random.default_rng(streams[2 * n])
        self._priority = {t.id: t.priority for t in self.scenario.tenants}
        self._seq = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wake: list[asyncio.Event] = [asyncio.Event() for _ in range(n)]
        self._http = openai.DefaultAsyncHttpxClient()  # the SDK's own pooled client, shared by every node
        self._clients: dict[str, AsyncOpenAI] = {}
        fleet.on_spike = self._respike

    def _respike(self) -> None:
        for ev in self._wake:
            ev.set()

    def _client(self, url: str) -> AsyncOpenAI:
        c = self._clients.get(url)
        if c is None:
            c = AsyncOpenAI(base_url=f"{url}/v1", api_key="fleetloop", max_retries=0, http_client=self._http)
            self._clients[url] = c
        return c

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def run(self, until_t: float, drain_s: float) -> None:
        """Arrivals until fleet time ``until_t`` (an end, not a length: ``fleet.t() + seconds`` for a
        window from now), then wait up to ``drain_s`` for tasks to end."""
        arrivals = [asyncio.create_task(self._arrivals(i, until_t)) for i in range(len(self._wake))]
        try:
            await asyncio.gather(*arrivals)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(drain_s):
                    while self._tasks:
                        await asyncio.wait(set(self._tasks))
        finally:
            for t in arrivals:
                t.cancel()
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*arrivals, *self._tasks, return_exceptions=True)
            await self._http.aclose()

    async def _arrivals(self, i: int, until_t: float) -> None:
        w = self.scenario.workload[i]
        rng = self._rng_arrivals[i]
        wake = self._wake[i]
        fleet = self.fleet
        while True:
            rate = w.rate_per_s * self.rate_scale * fleet.rate_factor(w.tenant)
            wait = float(rng.exponential(1.0 / rate))
            due = fleet.t() + wait
            if due >= until_t:
                wait = until_t - fleet.t()
            wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, wait)):
                    await wake.wait()
                    continue  # the rate changed: redraw (memoryless)
            if fleet.t() >= until_t - 1e-6:
                return
            self._seq += 1
            task = new_task(
                self._seq,
                workload_index=i,
                w=w,
                priority=self._priority[w.tenant],
                now=fleet.t(),
                rng=self._rng_tasks[i],
            )
            self.stats.tasks_started += 1
            self.stats.p0_started += task.priority == 0
            t = asyncio.create_task(self._task(task))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _task(self, task: Task) -> None:
        ok = True
        for step in range(task.calls):
            task.step = step
            draw_call(task, self._rng_tasks[task.workload])
            if not await self._call(task, last=task.last_call):
                ok = False
                break
        if ok:
            self.stats.tasks_succeeded += 1
            self.stats.p0_succeeded += task.priority == 0
        else:
            self.stats.tasks_failed += 1
            self.stats.p0_failed += task.priority == 0

    async def _call(self, task: Task, *, last: bool) -> bool:
        fleet = self.fleet
        w = task.spec
        client = w.client
        attempt = 0
        while True:
            now = fleet.t()
            budget_s = max(0.0, min(client.timeout_s, task.deadline_t - now))
            if self.router_url is not None:
                routed, routed_ttft = await self._routed_call(task, budget_s)
                if routed == "ok":
                    self.stats.ok += 1
                    if routed_ttft is not None:
                        self.stats.ttft_ms.append(routed_ttft)
                    return True
                self._count(routed)
                if (
                    fleet.t() < task.deadline_t - 1e-9
                    and attempt < client.max_retries
                    and (t := fleet.t() + backoff_s(
                        self._rng_backoff, client.backoff_s, client.backoff_max_s, attempt
                    )) < task.deadline_t
                ):  # fmt: skip
                    self.stats.retries += 1
                    await asyncio.sleep(max(0.0, t - fleet.t()))
                    attempt += 1
                    continue
                return False
            route = fleet.router.pick(
                w.models, task.priority, task.prefix_digest,
                new_task=task.step == 0, budget_ms=budget_s * 1000.0, now_s=now,
                prompt_tokens=task.prompt,
            )  # fmt: skip
            pool_id = route.pool_id or sorted(fleet.pools)[0]
            model = fleet.pools[pool_id].model if pool_id in fleet.pools else w.models[0]
            node = route.node
            sent_t = fleet.t()
            ttft_ms: float | None = None
            tokens = 0
            if node is None or budget_s <= 0:
                kind = "shed" if node is None else "timeout"
            else:
                self.stats.sent += 1
                fleet.router.started(node.node_id)
                try:
                    kind, ttft_ms, tokens = await self._node_call(task, node.node_id, model, budget_s)
                finally:
                    fleet.router.finished(node.node_id)
            a = _Attempt(
                pool_id=pool_id,
                node_id=node.node_id if node is not None else None,
                model=model,
                ttft_ms=ttft_ms,
                e2e_ms=(fleet.t() - sent_t) * 1000.0,
                tokens=tokens,
                budget_ms=int(budget_s * 1000.0),
                routed_from=route.routed_from,
            )
            if kind == "ok":
                self.stats.ok += 1
                if ttft_ms is not None:
                    self.stats.ttft_ms.append(ttft_ms)
                self._emit(task, attempt, a, "ok", last=last)
                return True
            self._count(kind)
            final = fleet.t() >= task.deadline_t - 1e-9
            retry_at: float | None = None
            if not final and attempt < client.max_retries:
                t = fleet.t() + backoff_s(self._rng_backoff, client.backoff_s, client.backoff_max_s, attempt)
                if t < task.deadline_t and fleet.router.allow_retry(
                    pool_id, task.tenant_id, kind, now_s=fleet.t()
                ):
                    retry_at = t
            if retry_at is None:
                self._emit(task, attempt, a, kind, last=True, failed=True)
                return False
            self.stats.retries += 1
            outcome = "shed" if kind == "shed" else "retry"
            self._emit(task, attempt, a, outcome, last=False)
            await asyncio.sleep(max(0.0, retry_at - fleet.t()))
            attempt += 1

    async def _routed_call(self, task: Task, budget_s: float) -> tuple[str, float | None]:
        """One attempt through the single router URL: the router, not the agent, picks the node (no
        outcome is published: the router's own log is the outcome source, as HAProxy's is)."""
        assert self.router_url is not None
        if budget_s <= 0:
            return "timeout", None
        self.stats.sent += 1
        kind, ttft, _ = await self._http_call(task, self.router_url, task.spec.models[0], budget_s)
        return kind, ttft

    def _count(self, kind: str) -> None:
        if kind == "error":
            self.stats.errors += 1
        elif kind == "timeout":
            self.stats.timeouts += 1
        else:
            self.stats.shed += 1

    async def _node_call(
        self, task: Task, node_id: str, model: str, budget_s: float
    ) -> tuple[str, float | None, int]:
        ln = self.fleet.live.get(node_id)
        if ln is None or not ln.port:
            return "error", None, 0
        return await self._http_call(task, ln.url, model, budget_s)

    async def _http_call(
        self, task: Task, url: str, model: str, budget_s: float
    ) -> tuple[str, float | None, int]:
        """One attempt over HTTP: (``ok`` | ``error`` | ``timeout`` | ``shed``, TTFT ms, output tokens)."""
        fleet = self.fleet
        api = self._client(url)
        headers = {
            "X-Fleetloop-Task": task.task_id,
            "X-Fleetloop-Call": str(task.step),
            "X-Fleetloop-Tenant": task.tenant_id,
            "X-Fleetloop-Priority": str(task.priority),
            HDR_PROMPT_TOKENS: str(task.prompt),
        }
        # Sent on every last call, to a router or straight to a node: a router that logs calls ends
        # the task on it (x-fleetloop-final); a node, like every fleetloop header, ignores it.
        if task.last_call:
            headers["X-Fleetloop-Final"] = "1"
        if task.prefix_digest is not None:
            headers[HDR_PREFIX] = task.prefix_digest
            headers[HDR_PREFIX_TOKENS] = str(prefix_tokens(task))
        text = f"{task.task_id} call {task.step}"
        if self.router_url is not None:
            # Through a router the prompt is text of its real size, its shared prefix the same text
            # in every call: a router that hashes prompts (cache_aware) matches what it would match
            # in production, and one that forwards no client header (SGLang's) still delivers the
            # prompt's size and prefix to the node.
            text = prompt_text(task.prompt, task.prefix_digest, prefix_tokens(task), text)
        messages: list[Any] = [{"role": "user", "content": text}]
        start = fleet.t()
        deadline_left = max(0.001, task.deadline_t - start)
        try:
            if not task.spec.client.stream:
                async with asyncio.timeout(budget_s):
                    resp = await api.chat.completions.create(
                        model=model, messages=messages, max_tokens=task.output, stream=False,
                        extra_headers=headers, timeout=deadline_left,
                    )  # fmt: skip
                return "ok", None, resp.usage.completion_tokens if resp.usage else task.output
            ttft: float | None = None
            tokens = 0
            async with asyncio.timeout(budget_s) as cm:
                stream = await api.chat.completions.create(
                    model=model, messages=messages, max_tokens=task.output, stream=True,
                    stream_options={"include_usage": True}, extra_headers=headers, timeout=deadline_left,
                )  # fmt: skip
                try:
                    async for chunk in stream:
                        if ttft is None and chunk.choices:
                            ttft = (fleet.t() - start) * 1000.0
                            loop = asyncio.get_running_loop()
                            cm.reschedule(loop.time() + max(0.0, task.deadline_t - fleet.t()))
                        if chunk.usage is not None:
                            tokens = chunk.usage.completion_tokens
                finally:
                    await stream.close()  # a client that gives up closes the stream: the node aborts
            return "ok", ttft, tokens
        except (TimeoutError, openai.APITimeoutError):
            return "timeout", None, 0
        except openai.APIStatusError as exc:  # the router's or node's answer: 429 is a shed
            return answer_outcome(exc.status_code), None, 0
        except openai.OpenAIError:  # refused, reset, a stream the node broke off
            return "error", None, 0

    def _emit(
        self, task: Task, attempt: int, a: _Attempt, outcome: str, *, last: bool, failed: bool = False
    ) -> None:
        if self.publish is None:
            return
        task_outcome = ("failed" if failed else "succeeded") if last and outcome != "retry" else None
        pool_id, node_id, model, ttft_ms, e2e_ms, tokens = (
            a.pool_id,
            a.node_id if outcome != "shed" else None,
            a.model,
            a.ttft_ms,
            a.e2e_ms,
            a.tokens,
        )
        if outcome != "shed" and node_id is None:
            return
        self.publish(
            RequestOutcome(
                ts_ms=self.fleet.wall_ms(),
                request_id=f"{task.task_id}.{task.step}",
                attempt=min(attempt, 100),
                workflow_id=task.task_id,
                step_index=task.step,
                tenant_id=task.tenant_id,
                priority=task.priority,
                latency_budget_ms=int(
                    max(0.0, min(task.spec.client.timeout_s, task.deadline_t - task.start_t)) * 1000
                ),
                pool_id=pool_id,
                node_id=node_id,
                model=model,
                prompt_tokens=task.prompt,
                output_tokens=max(0, tokens),
                prefix_digest=task.prefix_digest,
                ttft_ms=round(ttft_ms, 3) if ttft_ms is not None else None,
                e2e_ms=round(max(0.0, e2e_ms), 3),
                outcome=outcome,
                task_outcome=task_outcome,
                routed_from=a.routed_from,
            )
        )
