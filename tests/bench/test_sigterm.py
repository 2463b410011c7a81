"""While a bench runs (``fleetloop.bench.common.sigterm_as_ctrl_c``), SIGTERM does what Ctrl-C does:
KeyboardInterrupt where the code is, or, inside ``asyncio.run``, the main task cancelled (its
``finally`` awaiting what it needs) and then KeyboardInterrupt; and the SIGTERM handler from before
is back after the block, however the block ends.

Each test sends this process a real SIGTERM. A sentinel handler stands before the block, so a
helper that did not take SIGTERM over, or did not give it back, shows as the sentinel being called
(and the process is never left to Python's default, which would end the test run). ``fleetloop
bench latency`` is held to the rule with its broker and run stood in for; ``fleetloop bench stack``
by its system test (``test_stack.py``), which stops a real run."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import pytest
from fleetloop import clock
from fleetloop.bench.common import sigterm_as_ctrl_c


class _Sentinel:
    """A SIGTERM handler that only counts."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.calls += 1


@contextmanager
def _handlers(sigterm: Callable[[int, FrameType | None], Any], sigint: Any) -> Iterator[None]:
    before = signal.signal(signal.SIGTERM, sigterm), signal.signal(signal.SIGINT, sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])


@pytest.fixture
def sentinel() -> Iterator[_Sentinel]:
    """The sentinel on SIGTERM, and Ctrl-C as Python leaves it in a terminal (KeyboardInterrupt)."""
    s = _Sentinel()
    with _handlers(s, signal.default_int_handler):
        yield s


def _sigterm_and_wait(until: Callable[[], bool] | None = None) -> None:
    """SIGTERM to this process, then wait (up to 5 s) for ``until``; without ``until``, for an
    exception from the handler, and fail if none came."""
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = clock.monotonic_s() + 5.0
    while clock.monotonic_s() < deadline:  # the handler runs in the main thread at its next check
        if until is not None and until():
            return
        time.sleep(0.01)
    if until is None:
        pytest.fail("SIGTERM did not interrupt the block")


def test_sigterm_in_the_block_is_a_keyboard_interrupt_and_the_handler_is_back_after(
    sentinel: _Sentinel,
) -> None:
    with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c():
        _sigterm_and_wait()
    assert sentinel.calls == 0
    assert signal.getsignal(signal.SIGTERM) is sentinel
    _sigterm_and_wait(until=lambda: sentinel.calls > 0)  # after the block: the one from before
    assert sentinel.calls == 1


def test_a_block_that_ends_normally_gives_the_handler_back(sentinel: _Sentinel) -> None:
    with sigterm_as_ctrl_c():
        assert signal.getsignal(signal.SIGTERM) is not sentinel
    assert signal.getsignal(signal.SIGTERM) is sentinel


def test_inside_asyncio_run_the_main_task_is_cancelled_and_its_cleanup_awaits(
    sentinel: _Sentinel,
) -> None:
    seen: list[str] = []

    async def main() -> None:
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            await asyncio.sleep(0.01)  # a cleanup that awaits (a bench stops its processes)
            seen.append("cleaned up")

    with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c():
        asyncio.run(main())
    assert seen == ["cancelled", "cleaned up"]
    assert sentinel.calls == 0
    assert signal.getsignal(signal.SIGTERM) is sentinel


def test_sigterm_still_interrupts_when_ctrl_c_is_ignored() -> None:
    """A background job started by a script ignores SIGINT; SIGTERM must still stop the bench."""
    s = _Sentinel()
    with _handlers(s, signal.SIG_IGN):
        with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c():
            _sigterm_and_wait()
        assert s.calls == 0
        assert signal.getsignal(signal.SIGTERM) is s


class _Broker:
    """What ``fleetloop bench latency`` uses of the broker it starts."""

    bootstrap_servers = "127.0.0.1:1"
    pid = None

    def __enter__(self) -> _Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_bench_latency_stops_its_run_on_sigterm_as_on_ctrl_c(
    sentinel: _Sentinel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench's run (which starts the daemons and stops them in its ``finally``) is cancelled, its
    cleanup runs, and the bench ends with KeyboardInterrupt, as on Ctrl-C."""
    from fleetloop.bench import latency

    seen: list[str] = []

    async def run(*_: object) -> dict[str, Any]:
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.01)  # the daemons stopped
            seen.append("stopped")
        return {}

    async def no_topics(*_: object) -> None:
        pass

    monkeypatch.setattr(latency, "start_broker", lambda kind: _Broker())
    monkeypatch.setattr(latency, "ensure_topics", no_topics)
    monkeypatch.setattr(latency, "_run", run)
    monkeypatch.setattr(latency, "quiet_client_logs", lambda: None)
    monkeypatch.setattr(latency, "configure", lambda **_: None)
    args = argparse.Namespace(nodes=16, daemons=1, trials=1, outcomes_per_node=1.0, broker="tansu", json=True)
    with pytest.raises(KeyboardInterrupt):
        latency.handle(args)
    assert seen == ["stopped"]
    assert sentinel.calls == 0
    assert signal.getsignal(signal.SIGTERM) is sentinel
