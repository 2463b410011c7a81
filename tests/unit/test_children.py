"""A child that stops on SIGTERM is let go; one that ignores it is killed after the grace."""

from __future__ import annotations

import asyncio
import signal
import sys

from fleetloop.daemon.children import stop_child

_IGNORES_TERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(60)"
)
_STOPS_ON_TERM = "import time; print('up', flush=True); time.sleep(60)"


async def _run(code: str, grace_s: float) -> int:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    assert await proc.stdout.readline() == b"up\n"  # the handler is installed before we signal
    await stop_child(proc, grace_s)
    assert proc.returncode is not None
    return proc.returncode


def test_a_polite_child_ends_by_sigterm_and_a_stubborn_one_by_sigkill() -> None:
    assert asyncio.run(_run(_STOPS_ON_TERM, 30.0)) == -signal.SIGTERM
    assert asyncio.run(_run(_IGNORES_TERM, 0.5)) == -signal.SIGKILL
