"""Virtual time for the runtime's unit tests: an event loop whose clock moves only when every task
waits, and then jumps straight to the next timer; and the fake clock the runtime reads it through.

The runtime waits with asyncio (sleeps, timeouts, ``asyncio.wait``) and reads time through its
injected clock (:class:`fleetloop.daemon.runtime.port.Clock`). On :class:`VirtualTimeLoop` every such
wait ends at its virtual deadline at once, in the order the deadlines fall, after everything that
could run before it has run: a ticker's hour runs in milliseconds, and the same test decides the
same things every time. :class:`FakeClock` reads the loop's time: its monotonic seconds are the
loop's, its wall clock the same instant in epoch milliseconds.

Work on a real thread or process is not in virtual time: drive the runtime with an inline offload
(``tests/support/memory_broker.py``). A loop where every task waits and nothing is scheduled
raises instead of hanging.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")
IDLE_LIMIT_S = 10.0  # real seconds a loop with nothing scheduled waits for a thread before it raises


class _JumpingSelector:
    """The loop's selector: what is ready now (the loop's own wake-up pipe) is returned at once;
    otherwise the loop's time jumps by the timeout it would have slept."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._real = selectors.DefaultSelector()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready:
            return ready
        if timeout is None:
            ready = self._real.select(IDLE_LIMIT_S)
            if not ready:
                raise RuntimeError("virtual time: every task waits and nothing is scheduled")
            return ready
        if timeout > 0:
            self._loop.jump(timeout)
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, start_s: float = 1_000.0) -> None:
        self._now = start_s
        super().__init__(selector=_JumpingSelector(self))  # type: ignore[arg-type]

    def time(self) -> float:
        return self._now

    def jump(self, seconds: float) -> None:
        self._now += seconds


class FakeClock:
    """The runtime's clock on a :class:`VirtualTimeLoop`."""

    def __init__(self, loop: VirtualTimeLoop, wall_ms: int) -> None:
        self._loop = loop
        self._base_ms = wall_ms - round(loop.time() * 1000)

    def monotonic_s(self) -> float:
        return self._loop.time()

    def wall_ms(self) -> int:
        return self._base_ms + round(self._loop.time() * 1000)

    def thread_sched_s(self) -> tuple[float, float]:
        return self._loop.time(), 0.0


def run_virtual(main: Callable[[FakeClock], Awaitable[T]], *, wall_ms: int = 1_800_000_000_000) -> T:
    """Run ``main(clock)`` to its end on a fresh virtual-time loop whose wall clock starts at ``wall_ms``."""
    loop = VirtualTimeLoop()
    clock = FakeClock(loop, wall_ms)
    try:
        return loop.run_until_complete(main(clock))
    finally:
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def sleep_until(clock: FakeClock, wall_ms: int) -> None:
    """Let virtual time run until the wall clock reads ``wall_ms``."""
    await asyncio.sleep(max(0, wall_ms - clock.wall_ms()) / 1000.0)
