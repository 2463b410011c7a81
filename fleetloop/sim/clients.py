"""Agent clients: tasks of sequential model calls, their sizes, timeouts, retries and deadlines.

- **Arrivals**: Poisson per workload entry, rate ``rate_per_s`` x the active load-spike factor; the
  next arrival is drawn as ``Exp(rate)`` (memoryless, so a rate change simply redraws it).
- **A task** has ``U{calls[0]..calls[1]}`` calls made one after another (an agent waits for each
  answer before its next step). Every call draws prompt and output sizes from a lognormal with the
  given median and ``sigma = ln(max / median) / 3.09`` (so ``max`` is the 99.9th percentile),
  clipped to ``[1, max]``. The task's shared prefix (``shared_prefix_tokens``, one digest per task)
  is the first ``min(shared_prefix_tokens, prompt - 1)`` tokens of every call.
- **Timeout**: for a streaming client (``stream: true``, the default) ``timeout_s`` bounds the wait
  for the first token (a read timeout); once tokens flow the call runs to completion unless the task
  deadline passes, and a client that gives up closes the stream, which aborts the request on the
  engine. A non-streaming client (``stream: false``: agent tool calls and structured output, which
  wait for the whole answer) bounds the whole call, and the engine cannot see it leave: the request
  runs on to completion as an **orphan**, its GPU time counted as waste, while the client's retry
  adds a second copy of the work. That is the work amplification behind retry storms, and it is
  what vLLM users see with non-streaming calls (awslabs/agentcore-rl-toolkit#46 switched to
  streaming "so that vLLM can detect client disconnects and abort orphaned requests";
  vllm-project/vllm#9428, #54947 report generation continuing after the client closed).
- **Retries**: a failed attempt (error, timeout, shed) is retried up to ``max_retries`` times after
  "full jitter" exponential backoff, ``U(0, min(backoff_max_s, backoff_s x 2^attempt))`` (AWS
  Architecture Blog, "Exponential Backoff and Jitter", 2015), if the router's retry budget lets it
  and the retry would start before the deadline.
- **A task fails** when a call fails past its retries or its deadline passes (the call in flight is
  cancelled); it succeeds when its last call returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fleetloop.sim.node import Req
from fleetloop.sim.scenario import Workload

Z_999 = 3.0902  # standard normal quantile of 0.999


def lognormal_tokens(rng: np.random.Generator, median: int, maximum: int) -> int:
    if maximum <= median:
        return median
    sigma = math.log(maximum / median) / Z_999
    x = median * math.exp(sigma * float(rng.standard_normal()))
    return int(min(maximum, max(1.0, round(x))))


def backoff_s(rng: np.random.Generator, base_s: float, cap_s: float, attempt: int) -> float:
    """Full jitter: ``U(0, min(cap, base x 2^attempt))``."""
    return float(rng.random()) * min(cap_s, base_s * (2.0**attempt))


@dataclass(slots=True, eq=False)
class Attempt:
    task: Task
    attempt: int
    pool_id: str
    node_id: str | None
    model: str
    sent_t: float
    budget_ms: int
    req: Req | None = None
    ttft_s: float | None = None
    done: bool = False
    routed_from: str | None = None  # the router's model spill moved it from this pool


@dataclass(slots=True, eq=False)
class Task:
    """One agent task. ``step`` is the index of the call in progress."""

    seq: int
    task_id: str
    workload: int
    spec: Workload
    tenant_id: str
    priority: int
    calls: int
    start_t: float
    deadline_t: float
    prefix_digest: str | None
    step: int = 0
    call_t: float = 0.0  # when the call in progress sent its first attempt
    prompt: int = 0
    output: int = 0
    spend_usd: float = 0.0
    attempt: Attempt | None = None
    outcome: str | None = None  # succeeded | failed
    attempts_cost: list[float] = field(default_factory=list)

    @property
    def last_call(self) -> bool:
        """Whether the call in progress is the task's last (the one whose outcome ends the task)."""
        return self.step + 1 >= self.calls


def new_task(
    seq: int, *, workload_index: int, w: Workload, priority: int, now: float, rng: np.random.Generator
) -> Task:
    lo, hi = w.calls
    calls = int(rng.integers(lo, hi + 1))
    digest = f"x{seq:x}" if w.shared_prefix_tokens > 0 else None
    return Task(
        seq=seq,
        task_id=f"t{seq}",
        workload=workload_index,
        spec=w,
        tenant_id=w.tenant,
        priority=priority,
        calls=calls,
        start_t=now,
        deadline_t=now + w.deadline_s,
        prefix_digest=digest,
    )


def draw_call(task: Task, rng: np.random.Generator) -> None:
    """Size the task's next call (kept across its retries)."""
    w = task.spec
    task.prompt = lognormal_tokens(rng, w.prompt_tokens.median, w.prompt_tokens.max)
    task.output = lognormal_tokens(rng, w.output_tokens.median, w.output_tokens.max)


def prefix_tokens(task: Task) -> int:
    return min(task.spec.shared_prefix_tokens, max(0, task.prompt - 1))
