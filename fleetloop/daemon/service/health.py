"""What ``/healthz`` and ``/readyz`` answer from, and the supervision of the daemon's tasks.

Liveness (``/healthz``): the process answers and every task the daemon runs (consumer loop,
ticker, policy follower, broker watch) is alive. A task that ended with an exception fails it;
:func:`supervise` then stops the daemon, so the process exits non-zero with one line naming the
task and why (a supervisor restarts it).

Readiness (``/readyz``): connected to the broker, partitions assigned, the model warm (every
owned partition read up to the committed offset it resumes at), a policy loaded. Each condition
is reported by name, so ``/readyz`` says what it is waiting for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any


class TaskDied(RuntimeError):
    """An internal task of the daemon ended with an exception (or ended while it should run)."""

    def __init__(self, task: str, reason: str) -> None:
        self.task = task
        self.reason = reason
        super().__init__(f"task {task!r} died: {reason}")


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    if text.startswith(f"{name}: "):  # aiokafka's errors name their own type
        return text
    return f"{name}: {text}" if text else name


@dataclass(slots=True)
class Health:
    """Mutable state the daemon keeps up to date; the HTTP face and metrics read it."""

    connected: bool = False
    connection_error: str = ""
    assigned: int = 0
    assigned_once: bool = False
    warm: bool = False
    policy_loaded: bool = False
    tasks: dict[str, asyncio.Task[Any]] = field(default_factory=dict)
    died: TaskDied | None = None
    stopping: bool = False
    # Overload (the ticker holds ticks back, fleetloop.daemon.runtime): the shards in it now, and
    # the boundaries published as skipped for it so far. Reported by /healthz; liveness is unchanged
    # (a daemon in overload is alive and decides the newest boundaries).
    overloaded: list[int] = field(default_factory=list)
    ticks_overload: int = 0

    def dead_tasks(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, t in sorted(self.tasks.items()):
            if not t.done():
                continue
            if t.cancelled():
                if not self.stopping:
                    out[name] = "cancelled"
                continue
            exc = t.exception()
            if exc is not None:
                out[name] = one_line(exc)
            elif not self.stopping:
                out[name] = "returned while the daemon runs"
        return out

    def live(self) -> tuple[bool, dict[str, Any]]:
        dead = self.dead_tasks()
        body: dict[str, Any] = {
            "tasks": {n: ("dead: " + dead[n]) if n in dead else "alive" for n in sorted(self.tasks)},
        }
        if self.died is not None:
            body["died"] = str(self.died)
        if self.overloaded or self.ticks_overload:
            body["overload"] = {"partitions": list(self.overloaded), "ticks_skipped": self.ticks_overload}
        ok = not dead and self.died is None and bool(self.tasks)
        return ok, body

    def ready(self) -> tuple[bool, dict[str, Any]]:
        checks = {
            "connected": self.connected,
            "partitions_assigned": self.assigned_once,
            "model_warm": self.warm,
            "policy_loaded": self.policy_loaded,
        }
        live, _ = self.live()
        checks["tasks_alive"] = live
        body: dict[str, Any] = {"checks": checks, "assigned_partitions": self.assigned}
        if not self.connected and self.connection_error:
            body["connection_error"] = self.connection_error
        return all(checks.values()), body


async def supervise(
    health: Health,
    jobs: Mapping[str, Callable[[], Coroutine[Any, Any, None]]],
    stop: asyncio.Event,
    *,
    on_death: Callable[[TaskDied], None] | None = None,
    grace_s: float = 30.0,
) -> None:
    """Run ``jobs`` as named tasks until ``stop``; the first to die stops the rest and is raised.

    A job returning while ``stop`` is unset counts as dying too: every job is meant to run until
    the daemon stops. On a clean stop the jobs get ``grace_s`` to return by themselves (finishing
    the batch in hand) before they are cancelled.
    """
    tasks: dict[str, asyncio.Task[None]] = {
        name: asyncio.create_task(job(), name=name) for name, job in jobs.items()
    }
    health.tasks.update(tasks)
    stopper = asyncio.create_task(stop.wait(), name="stop")
    died: TaskDied | None = None
    try:
        pending: set[asyncio.Task[Any]] = {*tasks.values(), stopper}
        while died is None and not stop.is_set():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for name, t in sorted(tasks.items()):
                if t in done and not stop.is_set():
                    if t.cancelled():
                        died = TaskDied(name, "cancelled")
                    elif (exc := t.exception()) is not None:
                        died = TaskDied(name, one_line(exc))
                    else:
                        died = TaskDied(name, "returned while the daemon runs")
                    break
    finally:
        health.stopping = died is None
        if died is not None:
            health.died = died
            if on_death is not None:
                on_death(died)
        stop.set()
        stopper.cancel()
        everything: list[asyncio.Task[Any]] = [*tasks.values(), stopper]
        if died is None and tasks:
            # A clean stop: every job watches ``stop``; let each finish what it is doing (the
            # consumer loop publishes and commits its batch) before anything is cancelled.
            await asyncio.wait(tasks.values(), timeout=grace_s)
        for t in everything:
            t.cancel()
        for t in everything:
            try:
                await t
            except asyncio.CancelledError:
                pass
            except Exception:  # noqa: S110 - already reported as the death, or raced with stop
                pass
    if died is not None:
        raise died
