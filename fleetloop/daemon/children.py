"""Child processes a command starts (brokers aside): stopped politely, then for good."""

from __future__ import annotations

import asyncio
import contextlib
import signal


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
