"""The shared actuator loop: a target's error is counted, logged once per message, and retried; a clean
exit restores the plain state unless told to keep the last one."""

from __future__ import annotations

import asyncio
import logging

import pytest
from fleetloop.edges.actuate import loop
from fleetloop.edges.actuate.loop import reconcile_forever
from fleetloop.edges.actuate.worker_list.actuator import WorkerListActuator, WorkerListError
from fleetloop.edges.actuate.worker_list.mapping import WorkerMap
from fleetloop.router.state import DesiredState
from fleetloop.schemas.decisions import Decision, PolicyStamp, RoutingDecision


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


class Workers:
    """A router's worker list in memory (the worker-list actuators' API)."""

    def __init__(self, listed: set[str], *, down: bool = False, hang: bool = False) -> None:
        self.listed, self.down, self.hang = set(listed), down, hang

    async def list_workers(self) -> set[str]:
        if self.down:
            raise WorkerListError("router at http://127.0.0.1:1: connection refused")
        return set(self.listed)

    async def add_worker(self, url: str) -> None:
        if self.hang:
            await asyncio.sleep(3600)
        self.listed.add(url)

    async def remove_worker(self, url: str) -> None:
        self.listed.discard(url)

    async def close(self) -> None:
        pass


URLS = ("http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:8003")


def _exit_with(api: Workers, *, restore: bool) -> set[str]:
    """The actuator holds a fresh routing decision naming only the first worker, is stopped at once
    (SIGTERM), and exits: what the router lists then."""
    state = DesiredState()
    stamp = PolicyStamp(name="t", version=1, hash="0" * 16, mode="enforce")
    body = RoutingDecision(entity="pool/chat", reason="r", pool_id="chat", weights={"chat/0": 1.0})
    state.accept(Decision(ts_ms=1, tick_id=1, policy=stamp, body=body), 0.0)
    wmap = WorkerMap({"chat": {f"chat/{i}": u for i, u in enumerate(URLS)}})
    act = WorkerListActuator(api, wmap, state, fail_static_s=30.0, now=lambda: 1.0, period_s=0.01)

    async def scenario() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, stop.set)  # a few passes, then SIGTERM
        await act.run(stop, restore_on_exit=restore)

    asyncio.run(scenario())
    return api.listed


def test_a_clean_exit_lists_every_mapped_worker_again_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="fleetloop.actuate.worker_list"):
        assert _exit_with(Workers(set(URLS)), restore=True) == set(URLS)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:2] == [f"apply: remove {URLS[1]} (not-a-member)", f"apply: remove {URLS[2]} (not-a-member)"]
    assert lines[2:] == [
        f"restore: add {URLS[1]}",
        f"restore: add {URLS[2]}",
        "exit: plain state restored (2 change(s))",
    ]


def test_keep_state_on_exit_leaves_the_list_as_last_reconciled(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="fleetloop.actuate.worker_list"):
        assert _exit_with(Workers(set(URLS)), restore=False) == {URLS[0]}
    assert caplog.records[-1].getMessage() == "exit: last state kept (--keep-state-on-exit)"


def test_a_restore_that_fails_or_hangs_is_logged_and_the_exit_goes_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "RESTORE_S", 0.05)
    with caplog.at_level(logging.ERROR, logger="fleetloop.actuate.worker_list"):
        _exit_with(Workers(set(URLS), down=True), restore=True)
        _exit_with(Workers({URLS[0]}, hang=True), restore=True)
    assert [r.getMessage() for r in caplog.records][-2:] == [
        "exit: the plain state was not restored: router at http://127.0.0.1:1: connection refused",
        "exit: the plain state was not restored within 0 s",
    ]
