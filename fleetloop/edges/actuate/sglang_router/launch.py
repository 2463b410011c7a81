"""The command line that starts SGLang's router on loopback, for a bench arm or a test.

``sglang_router.launch_router`` from the ``sglang-router`` wheel, bound to ``host`` (it binds every
interface by default), with its Prometheus exporter on loopback too (its default is
``0.0.0.0:29000``). Its own health checks, retries and circuit breaker stay as it ships them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

POLICIES = ("cache_aware", "power_of_two", "round_robin", "random")


def router_argv(
    worker_urls: Sequence[str],
    *,
    port: int,
    prometheus_port: int,
    policy: str = "cache_aware",
    host: str = "127.0.0.1",
    log_level: str = "warn",
) -> list[str]:
    """``argv`` of an SGLang router over ``worker_urls`` with ``policy``, listening on ``host:port``."""
    if policy not in POLICIES:
        raise ValueError(f"sglang-router policy {policy!r}: one of {', '.join(POLICIES)}")
    return [
        sys.executable, "-m", "sglang_router.launch_router",
        "--host", host, "--port", str(port),
        "--worker-urls", *worker_urls,
        "--policy", policy,
        "--prometheus-host", host, "--prometheus-port", str(prometheus_port),
        "--log-level", log_level,
    ]  # fmt: skip
