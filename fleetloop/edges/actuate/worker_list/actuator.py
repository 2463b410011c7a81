"""Keep a router's worker list at fleetloop's desired membership: the loop and the command line that
``fleetloop actuate vllm-router`` and ``fleetloop actuate sglang-router`` share.

Each router module gives its HTTP calls (:class:`WorkerListApi`: list, add, remove); this module
follows ``control.state`` and, every period (and at once when new state arrives), reads the list,
adds the workers that should be in before removing the ones that should not (an add returns once
the router lists the worker, so the list never empties on the way), and re-asserts drift: a
difference on a worker whose target did not change since it was last asserted (someone's manual
change, a restart of the router) is applied again and logged as ``drift``. Workers the router lists
that the map does not know are left alone. With ``--metrics-url`` the same process publishes the
router's per-worker outcome counts to ``fleet.requests`` (:mod:`.outcomes`, :mod:`.report`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol
from urllib.parse import urlparse

import httpx

from fleetloop.edges.actuate.loop import Reconciler, keep_state_arg
from fleetloop.edges.actuate.worker_list.mapping import (
    WorkerMap,
    WorkerMapError,
    desired_workers,
    load_worker_map,
    plan,
)
from fleetloop.edges.actuate.worker_list.outcomes import OutcomeCounter, Translator
from fleetloop.edges.actuate.worker_list.report import MetricsError, OutcomeReporter
from fleetloop.edges.cli import EdgeUsageError as UsageError
from fleetloop.edges.cli import connection_from, one_line_errors, start_following
from fleetloop.kafka_security import bootstrap_arg
from fleetloop.router import clock
from fleetloop.router.follow import StateFollower, StateOnly
from fleetloop.router.publish import OutcomePublisher
from fleetloop.router.state import DesiredState
from fleetloop.topic_layout import TopicLayoutError


class WorkerListError(Exception):
    """The router's API failed (unreachable, an error status, an answer it cannot parse): the pass
    is retried on the next period."""


class WorkerListApi(Protocol):
    async def list_workers(self) -> set[str]: ...
    async def add_worker(self, url: str) -> None: ...
    async def remove_worker(self, url: str) -> None: ...
    async def close(self) -> None: ...


class HttpApi:
    """A router's HTTP API: ``_call`` raises :class:`WorkerListError` (one line naming the router)
    for a failed connection or an error status."""

    router: ClassVar[str]

    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s)

    async def close(self) -> None:
        await self._client.aclose()

    async def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = await self._client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise WorkerListError(f"{self.router} at {self.base_url}: {exc or type(exc).__name__}") from None
        if r.status_code >= 400:
            raise WorkerListError(f"{self.router} {method} {path}: HTTP {r.status_code} {r.text[:200]}")
        return r


@dataclass(slots=True)
class Stats:
    reconciles: int = 0
    added: int = 0
    removed: int = 0
    drift: int = 0
    errors: int = 0
    last_error: str = ""


class WorkerListActuator(Reconciler):
    """One router's worker list kept at :func:`desired_workers`. A subclass names its logger."""

    target_error: ClassVar[type[Exception]] = WorkerListError
    log: ClassVar[logging.Logger] = logging.getLogger("fleetloop.actuate.worker_list")

    def __init__(
        self,
        api: WorkerListApi,
        wmap: WorkerMap,
        state: DesiredState,
        *,
        fail_static_s: float,
        now: Callable[[], float],
        period_s: float = 0.5,
    ) -> None:
        self.api, self.wmap, self.state = api, wmap, state
        self.fail_static_s, self.now, self.period_s = fail_static_s, now, period_s
        self.stats = Stats()
        self.wake = asyncio.Event()
        self._asserted: dict[str, bool] = {}

    async def reconcile(self) -> list[tuple[str, str, str, str]]:
        """One pass; returns (action, url, why, apply|drift) for each change made."""
        return await self._pass(self.state, restoring=False)

    async def restore(self) -> list[tuple[str, str, str, str]]:
        """Every mapped worker listed: the membership of a state that holds no decision
        (fail-static), whatever is held. Each change is tagged ``restore``."""
        return await self._pass(DesiredState(), restoring=True)

    async def _pass(self, state: DesiredState, *, restoring: bool) -> list[tuple[str, str, str, str]]:
        want = desired_workers(state, self.wmap, self.now(), self.fail_static_s)
        present = await self.api.list_workers()
        steps = sorted(plan(want, present), key=lambda s: s[0] != "add")  # adds first
        done = []
        for action, url, why in steps:
            kind = "drift" if self._asserted.get(url) == want[url][0] else "apply"
            if action == "add":
                await self.api.add_worker(url)
                self.stats.added += 1
            else:
                await self.api.remove_worker(url)
                self.stats.removed += 1
            if restoring:
                kind = "restore"
                self.log.info("restore: %s %s", action, url)
            elif kind == "drift":
                self.stats.drift += 1
                self.log.warning(
                    "drift: %s was %s (want %s, %s); re-asserted",
                    url,
                    "absent" if action == "add" else "present",
                    action,
                    why,
                )
            else:
                self.log.info("apply: %s %s (%s)", action, url, why)
            done.append((action, url, why, kind))
        self._asserted = {u: p for u, (p, _) in want.items()}
        self.stats.reconciles += 1
        return done

    def failed(self, message: str) -> None:
        self.stats.errors += 1
        self.stats.last_error = message

    def last_error(self) -> str:
        return self.stats.last_error


def register(
    act_sub: Any,
    router: str,
    api: Callable[[str], WorkerListApi],
    actuator: type[WorkerListActuator],
    outcomes: OutcomeCounter,
) -> None:
    """``router`` under ``fleetloop actuate`` (the group: :mod:`fleetloop.edges.actuate.command`):
    its flags, and a handler that runs :func:`run` with ``api(url)``; ``outcomes`` is where its
    metrics page counts each worker's calls (``--metrics-url``)."""
    p = act_sub.add_parser(
        router, help=f"control.state -> {router}'s worker list; its outcome counters -> fleet.requests"
    )
    add_arguments(p, router)
    prog = f"fleetloop actuate {router}"

    @one_line_errors
    def handle(args: argparse.Namespace) -> int:
        wmap = checked(args)
        return asyncio.run(run(args, wmap, api(args.url), actuator, prog, outcomes=outcomes))

    p.set_defaults(handler=handle)


def add_arguments(p: argparse.ArgumentParser, router: str) -> None:
    """The flags both worker-list actuators take."""
    p.add_argument("--url", required=True, metavar="URL", help=f"{router}'s base URL (loopback)")
    p.add_argument("--worker-map", required=True, metavar="FILE", help="YAML: pool -> node id -> worker URL")
    bootstrap_arg(p, required=True)
    p.add_argument("--period-s", type=float, default=0.5, help="reconcile period (default 0.5, 0.05-60)")
    p.add_argument("--fail-static-s", type=float, default=30.0, help="keep the last state this long (30)")
    keep_state_arg(p, "every mapped worker listed")
    p.add_argument(
        "--metrics-url",
        metavar="URL",
        help=f"{router}'s Prometheus page (http://127.0.0.1:PORT/metrics): publish its per-worker "
        "outcome counts to fleet.requests",
    )
    p.add_argument("--metrics-period-s", type=float, default=1.0, help="scrape period (default 1.0, 0.1-10)")
    p.add_argument(
        "--model", default="unknown", help="the model the workers serve, in each published record (unknown)"
    )


_IDENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,199}$")  # the schemas' Ident


def _loopback(flag: str, value: str, want: str) -> None:
    """A one-line :class:`UsageError` unless ``value`` is an ``http://`` URL on loopback."""
    url = urlparse(value)
    host = url.hostname or ""
    if not value.startswith("http://") or host not in ("127.0.0.1", "localhost", "::1"):
        raise UsageError(f"{flag} {value!r}: want {want} (loopback only)")
    try:
        port = url.port  # urllib refuses a port past 65535 here; the HTTP client would deep in a connect
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise UsageError(f"{flag} {value!r}: the port must be in 1..65535")


def checked(args: argparse.Namespace) -> WorkerMap:
    """The flags' values checked (one-line :class:`UsageError` for a bad one), and the worker map."""
    _loopback("--url", args.url, "http://127.0.0.1:PORT")
    if args.metrics_url is not None:
        _loopback("--metrics-url", args.metrics_url, "http://127.0.0.1:PORT/metrics")
    if not 0.1 <= args.metrics_period_s <= 10:
        raise UsageError("--metrics-period-s must be in [0.1, 10]")
    if not _IDENT.match(args.model):
        raise UsageError(f"--model {args.model!r}: want a name of letters, digits and _.:/@- (up to 200)")
    if not 0.05 <= args.period_s <= 60:
        raise UsageError("--period-s must be in [0.05, 60]")
    if not 0 < args.fail_static_s <= 3600:
        raise UsageError("--fail-static-s must be in (0, 3600]")
    try:
        return load_worker_map(args.worker_map)
    except WorkerMapError as exc:
        raise UsageError(str(exc)) from None


async def run(
    args: argparse.Namespace,
    wmap: WorkerMap,
    api: WorkerListApi,
    actuator: type[WorkerListActuator],
    prog: str,
    *,
    outcomes: OutcomeCounter,
) -> int:
    """Check the router answers, follow ``control.state`` and reconcile until SIGINT/SIGTERM; with
    ``--metrics-url``, publish the router's per-worker outcome counts meanwhile."""
    try:
        await api.list_workers()
    except WorkerListError as exc:
        await api.close()
        raise UsageError(str(exc)) from None
    sink = StateOnly(args.fail_static_s)
    act = actuator(
        api, wmap, sink.state, fail_static_s=args.fail_static_s, now=clock.monotonic_s, period_s=args.period_s
    )
    follower = StateFollower(
        sink, connection_from(args), topic_prefix=args.topic_prefix, on_accepted=lambda _: act.wake.set()
    )
    publisher: OutcomePublisher | None = None
    reporting: asyncio.Task[None] | None = None
    stop = asyncio.Event()
    reporter: OutcomeReporter | None = None
    try:
        if args.metrics_url is not None:
            publisher = OutcomePublisher(connection_from(args), topic_prefix=args.topic_prefix)
            try:
                await publisher.start()
            except TopicLayoutError as exc:
                raise UsageError(f"{prog}: {exc}") from None
            translator = Translator(outcomes, wmap, model=args.model, run_id=secrets.token_hex(4))
            reporter = OutcomeReporter(
                args.metrics_url,
                translator,
                publisher,
                period_s=args.metrics_period_s,
                now_ms=clock.wall_ms,
                log=act.log,
            )
            try:
                await reporter.start()
            except MetricsError as exc:
                raise UsageError(f"{prog}: --metrics-url: {exc}") from None
        await start_following(follower, prog, connection_from(args))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if reporter is not None:
            reporting = asyncio.create_task(reporter.run(stop), name="fleetloop-router-outcomes")
            act.log.info(
                "publishing the outcomes %s counts per worker (%s) every %.2f s",
                outcomes.router, outcomes.metric, args.metrics_period_s,
            )  # fmt: skip
        act.log.info("following control.state; reconciling %s every %.2f s", args.url, args.period_s)
        await act.run(stop, restore_on_exit=not args.keep_state_on_exit)
        return 0
    finally:
        stop.set()
        if reporting is not None:
            await reporting
        elif reporter is not None:
            await reporter.close()
        if publisher is not None:
            await publisher.stop()
        with contextlib.suppress(Exception):
            await follower.stop()
        await api.close()
