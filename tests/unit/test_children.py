"""A process a command starts with ``die_with_parent`` stops when the command is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from fleetloop import clock
from fleetloop.bench import latency, sizing
from fleetloop.bench.common import stop_processes
from fleetloop.bench.stack import procs as stack_procs
from fleetloop.daemon.children import die_with_parent

# The parent starts a child the way the bench starts its daemons, prints the child's pid, waits.
_PARENT = """
import subprocess, sys, time
from fleetloop.daemon.children import die_with_parent
kw = {"preexec_fn": die_with_parent} if sys.argv[1] == "on" else {}
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True, **kw)
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _orphan_after_kill(mode: str, wait_s: float) -> bool:
    """Whether the child is still alive ``wait_s`` after its parent was SIGKILLed (asked as soon as
    it is gone)."""
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, mode], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = clock.monotonic_s() + wait_s
        while _alive(child) and clock.monotonic_s() < deadline:
            time.sleep(0.05)
        return _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_dies_with_its_sigkilled_parent() -> None:
    assert not _orphan_after_kill("on", wait_s=10.0)
    # Without it the child, in a session of its own, outlives the parent (what the bench did): the
    # kernel signals a child with the parent's death at once, so a second shows the difference.
    assert _orphan_after_kill("off", wait_s=1.0)


def test_the_bench_starts_its_children_with_it() -> None:
    """The commands that start long-lived children in sessions of their own pass it."""
    for module in (latency, sizing, stack_procs):
        with open(module.__file__ or "", encoding="utf-8") as f:
            assert "preexec_fn=die_with_parent" in f.read(), module.__name__
    assert callable(die_with_parent)


def test_the_bench_stops_its_daemons_and_kills_one_that_ignores_sigterm() -> None:
    """``stop_processes`` (the sizing and latency benches' one way to stop their daemons): every
    running one gets SIGTERM, one that ignores it is killed after the timeout, one that has already
    exited is left as it was."""
    ignores = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True);"
            " time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    obeys = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    done = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    done.wait(10)
    assert ignores.stdout is not None
    ignores.stdout.readline()  # its handler is set
    try:
        stop_processes([ignores, obeys, done], timeout_s=1.0)
        assert obeys.returncode == -signal.SIGTERM
        assert ignores.returncode == -signal.SIGKILL
        assert done.returncode == 3
    finally:
        for p in (ignores, obeys):
            if p.poll() is None:
                p.kill()
                p.wait()
        ignores.stdout.close()
