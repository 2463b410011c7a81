"""Wait for a condition, not for a time: poll a predicate until it holds or a deadline passes.

A fixed ``sleep(2)`` before an assertion is either too long (the suite waits for nothing) or too
short on a loaded machine (the test flakes). ``wait_until`` returns as soon as the condition holds
and fails the test with what it was waiting for when it never does. Sleep only where a test needs
elapsed time itself (an outage, ticks that must pass), and say so in a comment.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from fleetloop import clock

T = TypeVar("T")

INTERVAL_S = 0.05


def _timed_out(what: str, timeout_s: float, last: object) -> str:
    return f"timed out after {timeout_s:g} s waiting for {what} (last value: {last!r:.300})"


async def wait_until(
    predicate: Callable[[], T | Awaitable[T]],
    timeout_s: float = 30.0,
    what: str = "the condition",
    *,
    interval_s: float = INTERVAL_S,
) -> T:
    """Poll ``predicate`` (sync or async) every ``interval_s`` until it returns something truthy;
    return that value. Fails the test naming ``what`` after ``timeout_s`` (an async predicate still
    running then is cancelled). An exception raised by the predicate propagates at once: a condition
    that cannot be evaluated is a failure, not a wait.
    """
    value: object = None
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            while True:
                value = predicate()
                if inspect.isawaitable(value):
                    value = await value
                if value:
                    return value  # type: ignore[return-value]
                await asyncio.sleep(interval_s)
    except TimeoutError:
        if not deadline.expired():
            raise  # the predicate's own
        pytest.fail(_timed_out(what, timeout_s, value), pytrace=False)


def wait_until_sync(
    predicate: Callable[[], T],
    timeout_s: float = 30.0,
    what: str = "the condition",
    *,
    interval_s: float = INTERVAL_S,
) -> T:
    """:func:`wait_until` for code without an event loop (threads, subprocesses, sync tests)."""
    deadline = clock.monotonic_s() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if clock.monotonic_s() >= deadline:
            pytest.fail(_timed_out(what, timeout_s, value), pytrace=False)
        time.sleep(interval_s)
