"""``fleetloop actuate haproxy``: apply control.state to HAProxy through its runtime API.

``fleetloop actuate haproxy --runtime-api ADDR --backend-map FILE --bootstrap-servers HOST:PORT
[--log-listen 127.0.0.1:PORT] [--period-s 0.5] [--fail-static-s 30] [--keep-state-on-exit] [--once]
[--json]``

It follows ``control.state``, keeps every declared HAProxy server at its target (weights, maint,
drain, maxconn; see mapping.py for the table and what is not mapped), re-asserts it when HAProxy
drifts, and, with ``--log-listen``, turns HAProxy's request log into RequestOutcomes on
``fleet.requests``. ``--once`` reconciles once after catching up and exits (``--json``: what it did).
On SIGTERM or SIGINT it puts every mapped server back ready at the plain weight with no maxconn
(what HAProxy is without fleetloop), logging each change, unless ``--keep-state-on-exit``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from typing import Any

import orjson

from fleetloop.edges.actuate.haproxy.actuator import BackendMapError, HaproxyActuator, load_backend_map
from fleetloop.edges.actuate.haproxy.logs import LogParser, listen_udp
from fleetloop.edges.actuate.haproxy.mapping import BackendMap
from fleetloop.edges.actuate.haproxy.runtime_api import RuntimeApi, RuntimeApiError, parse_address
from fleetloop.edges.actuate.loop import keep_state_arg
from fleetloop.edges.cli import EdgeUsageError as UsageError
from fleetloop.edges.cli import connection_from, one_line_errors, start_following
from fleetloop.kafka_security import bootstrap_arg
from fleetloop.router import clock
from fleetloop.router.follow import StateFollower, StateOnly
from fleetloop.router.publish import OutcomePublisher
from fleetloop.topic_layout import TopicLayoutError


def register(act_sub: Any) -> None:
    """``haproxy`` under ``fleetloop actuate`` (the group: :mod:`fleetloop.edges.actuate.command`)."""
    p = act_sub.add_parser(
        "haproxy", help="control.state -> HAProxy runtime API; HAProxy log -> fleet.requests"
    )
    p.add_argument("--runtime-api", required=True, metavar="ADDR", help="unix:/path, /path or 127.0.0.1:PORT")
    p.add_argument(
        "--backend-map", required=True, metavar="FILE", help="YAML: pool -> backend, node -> server"
    )
    bootstrap_arg(p, required=True)
    p.add_argument("--log-listen", metavar="HOST:PORT", help="receive HAProxy's log (syslog over UDP) here")
    p.add_argument("--period-s", type=float, default=0.5, help="reconcile period (default 0.5, 0.05-60)")
    p.add_argument("--fail-static-s", type=float, default=30.0, help="keep the last state this long (30)")
    keep_state_arg(p, "every mapped server ready at equal weight, no maxconn")
    p.add_argument("--default-priority", type=int, default=1, help="priority of calls without the header")
    p.add_argument("--once", action="store_true", help="catch up, reconcile once, exit")
    p.add_argument("--json", action="store_true", help="with --once: print one JSON object")
    p.set_defaults(handler=handle)


def _listen(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or host not in ("127.0.0.1", "::1", "localhost"):
        raise UsageError(f"--log-listen {addr!r}: want 127.0.0.1:PORT (loopback only)")
    return host, int(port)


@one_line_errors
def handle(args: argparse.Namespace) -> int:
    try:
        parse_address(args.runtime_api)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not 0.05 <= args.period_s <= 60:
        raise UsageError("--period-s must be in [0.05, 60]")
    if not 0 < args.fail_static_s <= 3600:
        raise UsageError("--fail-static-s must be in (0, 3600]")
    if not 0 <= args.default_priority <= 9:
        raise UsageError("--default-priority must be in [0, 9]")
    try:
        bmap = load_backend_map(args.backend_map)
    except BackendMapError as exc:
        raise UsageError(str(exc)) from None
    listen = _listen(args.log_listen) if args.log_listen else None
    return asyncio.run(_main(args, bmap, listen))


async def _report(parser: LogParser, publisher: Any, lag_ms: list[int], stop: asyncio.Event) -> None:
    """Every 10 s, when anything changed: what the log receiver did (so silence is visible too)."""
    log = logging.getLogger("fleetloop.actuate.haproxy")
    last = None
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 10.0)
        st, ps = parser.stats, publisher.stats if publisher is not None else None
        now = (st.lines, st.outcomes, st.malformed, ps.sent if ps else 0, ps.dropped if ps else 0)
        if now != last:
            log.info(
                "log: %d lines, %d outcomes, %d malformed%s; published %d, dropped %d, failed %d; "
                "max log lag %d ms",
                st.lines,
                st.outcomes,
                st.malformed,
                f" (last: {st.last_error})" if st.malformed else "",
                ps.sent if ps else 0,
                ps.dropped if ps else 0,
                ps.failed if ps else 0,
                lag_ms[0],
            )
            last = now
            lag_ms[0] = 0


async def _main(args: argparse.Namespace, bmap: BackendMap, listen: tuple[str, int] | None) -> int:
    api = RuntimeApi(args.runtime_api)
    try:
        await api.run(["show info"])
    except RuntimeApiError as exc:
        raise UsageError(str(exc)) from None
    sink = StateOnly(args.fail_static_s)
    act = HaproxyActuator(
        api, bmap, sink.state, fail_static_s=args.fail_static_s, now=clock.monotonic_s, period_s=args.period_s
    )
    follower = StateFollower(
        sink, connection_from(args), topic_prefix=args.topic_prefix, on_accepted=lambda _: act.wake.set()
    )
    publisher: OutcomePublisher | None = None
    transport: asyncio.DatagramTransport | None = None
    parser = LogParser(bmap.by_server(), args.default_priority)
    lag_ms = [0]
    try:
        await start_following(follower, "fleetloop actuate haproxy", connection_from(args))
        if args.once:
            done = await act.reconcile()
            out = {
                "changes": [
                    {
                        "server": c.slot.name,
                        "field": c.field,
                        "was": c.was,
                        "want": c.want,
                        "why": c.why,
                        "kind": k,
                    }
                    for c, k in done
                ],
                "missing": act.stats.missing,
                "decisions": sink.state.accepted,
            }
            if args.json:
                sys.stdout.write(orjson.dumps(out).decode() + "\n")
            else:
                sys.stderr.write(
                    f"reconciled: {len(done)} change(s), {len(act.stats.missing)} missing slot(s)\n"
                )
            return 0
        if listen is not None:
            publisher = OutcomePublisher(connection_from(args), topic_prefix=args.topic_prefix)
            try:
                await publisher.start()
            except TopicLayoutError as exc:
                raise UsageError(f"fleetloop actuate haproxy: {exc}") from None
            pub = publisher

            def on_line(line: str) -> None:
                o = parser.parse(line)
                if o is not None:
                    lag_ms[0] = max(lag_ms[0], clock.wall_ms() - o.ts_ms)
                    pub.publish(o)

            transport = await listen_udp(listen[0], listen[1], on_line)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        logging.getLogger("fleetloop.edges.actuate.haproxy").info(
            "following control.state (%d decisions held); reconciling %s every %.2f s",
            sink.state.accepted,
            args.runtime_api,
            args.period_s,
        )
        reporter = asyncio.create_task(_report(parser, publisher, lag_ms, stop))
        await act.run(stop, restore_on_exit=not args.keep_state_on_exit)
        await reporter
        return 0
    finally:
        if transport is not None:
            transport.close()
        if publisher is not None:
            await publisher.stop()
        with contextlib.suppress(Exception):
            await follower.stop()
