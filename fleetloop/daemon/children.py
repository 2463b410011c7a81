"""Child processes a command starts (brokers aside): stopped politely, then for good."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def _resolve_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up once in the parent (a child between fork and exec should call
    an already-resolved function, not load a library)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    fn: Callable[..., int] = libc.prctl
    return fn


_PRCTL = _resolve_prctl()


def die_with_parent() -> None:
    """Ask the kernel to SIGTERM this process when its parent dies (Linux ``PR_SET_PDEATHSIG``).

    Used as ``preexec_fn`` for the processes a command starts in sessions of their own (the bench's
    daemons, brokers, proxies), and first thing in a ``spawn``-ed worker: when the command is
    SIGKILLed (a CI timeout, an OOM kill) nothing is left running and holding ports or CPU. A
    no-op where the call does not exist. SIGTERM, not SIGKILL: a daemon still stops cleanly.

    As a ``preexec_fn`` it runs between fork and exec in a parent that may have threads (the log
    writer): it calls a libc function resolved before the fork and takes no lock, which is what
    makes that safe here. Start such children from the thread that lives as long as the command
    (the main thread): the kernel signals when the forking *thread* exits."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


async def stop_child(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM, wait up to ``grace_s`` for a clean exit (reports, commits), then SIGKILL."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
