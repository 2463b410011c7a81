"""Child processes of a bench stack run: start with a log file each, wait until they answer, stop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import httpx

from fleetloop import clock
from fleetloop.daemon.children import die_with_parent, stop_child
from fleetloop.daemon.cli_common import UsageError

START_TIMEOUT_S = 90.0
STOP_GRACE_S = 15.0
# What a router's log says when its port was taken between picking it and binding it.
BIND_FAILED = ("Address already in use", "cannot bind socket")
START_ATTEMPTS = 3

PIPE_LINE_LIMIT = 256 * 2**20  # an agents process's result is one line (its TTFTs with it)

Procs = dict[str, asyncio.subprocess.Process]


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fleetloop_argv(*args: str) -> list[str]:
    """``fleetloop ARGS`` as a child of this interpreter."""
    return [sys.executable, "-m", "fleetloop.cli.main", *args]


async def spawn(
    argv: list[str],
    logdir: Path,
    name: str,
    *,
    stdin: bool = False,
    stdout: bool = False,
    env: dict[str, str] | None = None,
) -> asyncio.subprocess.Process:
    """``argv`` in a session of its own that dies with this process, its output in ``NAME.log``
    (``stdout``: its standard output is a pipe instead; ``stdin``: so is its input), in ``env``
    (default: this process's)."""
    with (logdir / f"{name}.log").open("ab") as log:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE if stdout else log,
            stderr=log,
            start_new_session=True,
            limit=PIPE_LINE_LIMIT,
            preexec_fn=die_with_parent,  # a pre-resolved libc call, no lock: see die_with_parent
            env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
        )


async def stop(proc: asyncio.subprocess.Process) -> None:
    await stop_child(proc, STOP_GRACE_S)


async def wait_http(url: str, procs: Procs, logdir: Path) -> None:
    """Until ``url`` answers below 500; a child that exits first is a one-line error with its log's tail."""
    deadline = clock.monotonic_s() + START_TIMEOUT_S
    async with httpx.AsyncClient(timeout=2.0) as c:
        while clock.monotonic_s() < deadline:
            for name, p in procs.items():
                if p.returncode is not None:
                    tail = (logdir / f"{name}.log").read_text(errors="replace")[-400:]
                    raise UsageError(f"fleetloop bench stack: {name} exited ({p.returncode}): {tail!r}")
            with contextlib.suppress(httpx.HTTPError):
                if (await c.get(url)).status_code < 500:
                    return
            await asyncio.sleep(0.2)
    raise UsageError(f"fleetloop bench stack: {url} did not answer within {START_TIMEOUT_S:g} s")


async def start_answering(
    name: str,
    argv_for: Callable[[int], list[str]],
    probe: str,
    logdir: Path,
    procs: Procs,
    *,
    env: dict[str, str] | None = None,
) -> int:
    """Start ``argv_for(port)`` as ``procs[name]`` on a port picked just before, and return the
    port once ``probe`` answers. Another process can take a picked port before the child binds it
    (the fleet's, the broker's and the agents' connections use the same ephemeral range), so a
    start whose log says so is retried on fresh ports, its log kept as ``NAME-attempt<N>.log``.
    Any other failure is the user's to see."""
    for attempt in range(1, START_ATTEMPTS + 1):
        port = free_port()
        procs[name] = await spawn(argv_for(port), logdir, name, env=env)
        try:
            await wait_http(f"http://127.0.0.1:{port}{probe}", procs, logdir)
        except UsageError:
            log = logdir / f"{name}.log"
            bind_failed = any(m in log.read_text(errors="replace") for m in BIND_FAILED)
            if procs[name].returncode is None or not bind_failed or attempt == START_ATTEMPTS:
                raise
            log.rename(logdir / f"{name}-attempt{attempt}.log")
            continue
        return port
    raise AssertionError("unreachable: the last attempt returns or raises")
