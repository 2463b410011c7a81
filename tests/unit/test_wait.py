"""The polling helper integration tests wait with instead of fixed sleeps (tests/support/wait.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from tests.support.wait import wait_until, wait_until_sync


def _third_call() -> tuple[list[int], Callable[[], int]]:
    calls: list[int] = []

    def pred() -> int:
        calls.append(1)
        return len(calls) if len(calls) >= 3 else 0

    return calls, pred


async def test_wait_until_returns_the_first_truthy_value_as_soon_as_it_holds() -> None:
    calls, pred = _third_call()
    assert await wait_until(pred, timeout_s=5, interval_s=0.001) == 3
    assert len(calls) == 3


async def test_wait_until_awaits_an_async_predicate() -> None:
    seen: list[int] = []

    async def pred() -> str:
        seen.append(1)
        return "ready" if len(seen) == 2 else ""

    assert await wait_until(pred, timeout_s=5, interval_s=0.001) == "ready"


async def test_wait_until_fails_the_test_naming_what_it_waited_for() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"timed out after 0.05 s waiting for the ticks .*\[\]"):
        await wait_until(list, 0.05, "the ticks", interval_s=0.01)


async def test_wait_until_lets_a_predicate_error_through_at_once() -> None:
    def broken() -> bool:
        raise KeyError("gone")

    with pytest.raises(KeyError):
        await wait_until(broken, timeout_s=60)


def test_wait_until_sync_polls_and_times_out_the_same_way() -> None:
    calls, pred = _third_call()
    assert wait_until_sync(pred, timeout_s=5, interval_s=0.001) == 3
    assert len(calls) == 3
    with pytest.raises(pytest.fail.Exception, match="waiting for a file"):
        wait_until_sync(lambda: None, timeout_s=0.02, interval_s=0.005, what="a file")


async def test_wait_until_cancels_a_predicate_still_running_at_the_deadline() -> None:
    async def hangs() -> bool:
        await asyncio.sleep(60)
        return True

    with pytest.raises(pytest.fail.Exception, match="waiting for an answer"):
        await asyncio.wait_for(wait_until(hangs, 0.05, "an answer"), 5)
