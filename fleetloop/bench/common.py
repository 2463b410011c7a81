"""What the benchmarks share: progress lines, percentiles, RSS, the exponent of a log-log fit,
the one-line checks of their flags, the broker they start, the daemons they stop and what SIGTERM
does while they run."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

import numpy as np

from fleetloop.daemon.brokers import BrokerStartError, ProcessBroker, start_broker
from fleetloop.daemon.cli_common import UsageError, quiet_client_logs
from fleetloop.daemon.observability import configure


def progress(msg: str) -> None:
    sys.stderr.write(f"{msg}\n")
    sys.stderr.flush()


def pct(xs: Sequence[float], q: float) -> float:
    """The q-quantile (0..100) by the nearest-rank rule: an observed value, never an interpolation."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[max(0, math.ceil(q / 100.0 * len(s)) - 1)]


def rss_mib() -> float:
    """The process's resident set size now (Linux /proc), MiB."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return math.nan


def growth_exponent(sizes: Sequence[float], values: Sequence[float]) -> float | None:
    """The slope of log(value) against log(size): 1.0 is linear, 2.0 quadratic."""
    pts = [(s, v) for s, v in zip(sizes, values, strict=True) if s > 0 and v > 0]
    if len(pts) < 2:
        return None
    xs = np.log([p[0] for p in pts])
    ys = np.log([p[1] for p in pts])
    return float(np.polyfit(xs, ys, 1)[0])


def within(cmd: str, flag: str, value: float, lo: float, hi: float) -> None:
    """Refuse ``value`` outside ``lo..hi`` with one line naming the command and the flag."""
    if not lo <= value <= hi:
        raise UsageError(f"fleetloop bench {cmd}: {flag} must be within {_num(lo)}..{_num(hi)}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def sizes_arg(cmd: str, text: str, lo: int, hi: int) -> list[int]:
    """``--nodes 1000,10000``: the distinct sizes, ascending, each within ``lo..hi``."""
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"fleetloop bench {cmd}: --nodes: not a list of integers: {text!r}") from None
    if not sizes or any(n < lo or n > hi for n in sizes):
        raise UsageError(f"fleetloop bench {cmd}: --nodes: each size must be within {lo}..{hi}")
    return sizes


@contextmanager
def bench_broker(cmd: str, kind: str) -> Iterator[ProcessBroker]:
    """A real broker of ``kind`` for one bench run, stopped after it.

    The daemon's own log lines go to stderr and only problems are logged; the Kafka client's log is
    silenced (a bench reports connection problems itself). A broker that cannot start is one line.
    """
    quiet_client_logs()
    configure(level="warning")
    progress(f"fleetloop bench {cmd}: starting {kind}")
    try:
        broker = start_broker(kind)
    except BrokerStartError as exc:
        raise UsageError(f"fleetloop bench {cmd}: {exc}") from None
    with broker:
        yield broker


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float = 30.0) -> None:
    """The bench's child processes (daemons) stopped: all asked to stop at once (SIGTERM, so they
    shut down cleanly in parallel), then each waited for, and killed if it has not exited within
    ``timeout_s``."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):  # Ctrl-C ignored or left to the OS (a background job): still stop
        handler = signal.default_int_handler
    handler(signum, frame)


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """For the block, SIGTERM (a timeout, a supervisor, ``kill``) does what Ctrl-C does, and the
    previous SIGTERM handler is back after it.

    What Ctrl-C does is whatever handles SIGINT when the signal comes: outside an event loop,
    KeyboardInterrupt where the code is; inside ``asyncio.run``, its main task is cancelled (its
    ``finally`` blocks run, awaiting what they need) and ``asyncio.run`` then raises
    KeyboardInterrupt. Either way a bench's ``finally`` blocks stop its broker and child processes;
    Python's default for SIGTERM exits at once and leaves them running. Main thread only, as for
    any signal handler."""
    previous = signal.signal(signal.SIGTERM, _as_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
