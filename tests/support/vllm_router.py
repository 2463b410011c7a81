"""Start the real ``vllm-router`` or SGLang's router for an integration test, on ports picked at the
last moment.

A port from :func:`free_port` is free when it is picked, not when the router binds it: the kernel
may hand it to an outgoing connection in between (a daemon's Kafka clients open many), and the
router then exits with "Address already in use" after it has waited for its workers. A test that
went on would see only "All connection attempts failed" from the actuator (CI, 2026-12-02). So
each attempt takes fresh ports, an early exit is retried, and anything else fails the test with
the router's own log.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from fleetloop.edges.actuate.sglang_router.launch import router_argv
from fleetloop.router import clock
from tests.support.http import free_port

VLLM_ROUTER = Path(sys.executable).parent / "vllm-router"
ATTEMPTS = 3


async def start_vllm_router(
    worker_urls: list[str],
    policy: str,
    log_path: Path,
    *,
    timeout_s: float = 60.0,
    metrics_port: list[int] | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """The running router and its port, once ``/health`` answers 200. The caller terminates it.
    ``metrics_port``, when given, gets the started router's Prometheus port appended."""
    if not VLLM_ROUTER.exists():
        pytest.fail(f"vllm-router is not installed at {VLLM_ROUTER} (pip install -e '.[dev]' installs it)")

    def argv(port: int) -> list[str]:
        prom = _picked(metrics_port)
        return [
            str(VLLM_ROUTER), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *worker_urls,
            "--policy", policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
        ]  # fmt: skip

    return await start_router("vllm-router", argv, log_path, timeout_s=timeout_s)


async def start_sglang_router(
    worker_urls: list[str],
    policy: str,
    log_path: Path,
    *,
    timeout_s: float = 60.0,
    metrics_port: list[int] | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """SGLang's router (``fleetloop.edges.actuate.sglang_router.launch``), once ``/health`` answers;
    ``metrics_port`` as for :func:`start_vllm_router`."""

    def argv(port: int) -> list[str]:
        prom = _picked(metrics_port)
        return router_argv(worker_urls, port=port, prometheus_port=prom, policy=policy, log_level="info")

    return await start_router("sglang-router", argv, log_path, timeout_s=timeout_s)


def _picked(out: list[int] | None) -> int:
    """A free port for the router's Prometheus page; the last one picked is ``out[-1]``."""
    port = free_port()
    if out is not None:
        out.append(port)
    return port


async def start_router(
    name: str, argv_for: Callable[[int], list[str]], log_path: Path, *, timeout_s: float = 60.0
) -> tuple[subprocess.Popen[bytes], int]:
    """``argv_for(port)`` started, and its port once ``/health`` answers 200."""
    for attempt in range(1, ATTEMPTS + 1):
        port = free_port()
        argv = argv_for(port)
        with log_path.open("ab") as log:
            start = log.tell()
            log.write(f"--- attempt {attempt}: port {port}\n".encode())
            log.flush()
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = clock.monotonic_s() + timeout_s
        async with httpx.AsyncClient(timeout=2.0) as probe:
            while clock.monotonic_s() < deadline and proc.poll() is None:
                try:
                    if (await probe.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                        return proc, port
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
            pytest.fail(f"{name} did not answer /health in {timeout_s:.0f} s: {_tail(log_path)}")
        if b"Address already in use" not in log_path.read_bytes()[start:]:
            pytest.fail(f"{name} exited ({proc.returncode}): {_tail(log_path)}")
    pytest.fail(f"{name} found no free port in {ATTEMPTS} attempts: {_tail(log_path)}")


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-2000:]
