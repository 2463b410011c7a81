"""The shared actuator loop: a target's error is counted, logged once per message, and retried."""

from __future__ import annotations

import asyncio
import logging

import pytest
from fleetloop.edges.actuate.loop import reconcile_forever


class TargetDown(Exception):
    pass


def test_target_errors_are_retried_logged_once_and_other_errors_propagate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> tuple[list[str], int]:
        stop, wake = asyncio.Event(), asyncio.Event()
        seen: list[str] = []
        passes = 0

        async def reconcile() -> None:
            nonlocal passes
            passes += 1
            if passes <= 3:
                raise TargetDown("socket refused")
            if passes == 4:
                raise TargetDown("bad answer")
            stop.set()

        def failed(message: str) -> None:
            seen.append(message)

        await reconcile_forever(
            reconcile,
            stop=stop,
            wake=wake,
            period_s=0.01,
            target_error=TargetDown,
            on_error=failed,
            last_error=lambda: seen[-1] if seen else "",
            log=logging.getLogger("test.actuate"),
        )
        return seen, passes

    with caplog.at_level(logging.ERROR, logger="test.actuate"):
        seen, passes = asyncio.run(scenario())
    assert passes == 5
    assert seen == ["socket refused"] * 3 + ["bad answer"]
    assert [r.getMessage() for r in caplog.records] == [
        "socket refused (retrying every 0.0 s)",
        "bad answer (retrying every 0.0 s)",
    ]

    async def broken() -> None:
        async def reconcile() -> None:
            raise KeyError("a bug, not the target")

        await reconcile_forever(
            reconcile,
            stop=asyncio.Event(),
            wake=asyncio.Event(),
            period_s=0.01,
            target_error=TargetDown,
            on_error=lambda m: None,
            last_error=lambda: "",
            log=logging.getLogger("test.actuate"),
        )

    with pytest.raises(KeyError):
        asyncio.run(broken())


def test_a_wake_runs_the_next_pass_before_the_period() -> None:
    async def scenario() -> int:
        stop, wake = asyncio.Event(), asyncio.Event()
        passes = 0

        async def reconcile() -> None:
            nonlocal passes
            passes += 1
            if passes >= 3:
                stop.set()

        async def poke() -> None:
            while not stop.is_set():
                await asyncio.sleep(0.01)
                wake.set()

        poker = asyncio.ensure_future(poke())
        await asyncio.wait_for(
            reconcile_forever(
                reconcile,
                stop=stop,
                wake=wake,
                period_s=3600,
                target_error=TargetDown,
                on_error=lambda m: None,
                last_error=lambda: "",
                log=logging.getLogger("test.actuate"),
            ),
            timeout=30,
        )
        await poker
        return passes

    assert asyncio.run(scenario()) == 3
