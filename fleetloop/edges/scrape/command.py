"""``fleetloop scrape``: scrape serving runtimes' ``/metrics`` and publish ``NodeTelemetry``.

One asyncio task per target, each on its own schedule (every ``--interval-s``; the targets' rounds
are spread evenly over the interval, as Prometheus offsets each target's scrapes, so N targets make
N requests spread over the interval, not one burst of N on the servers and on this process): GET the
endpoint (timeout: the interval, at most 5 s), parse, convert, publish to ``fleet.telemetry`` keyed by
``--pool``. A target that fails (refused, timed out, HTTP error, bad text, a page without the
runtime's request gauges) publishes nothing for that round, so it goes stale in the daemon's model
(which treats stale as saturated); the others go on. Failures are counted per target and logged
when a target changes state (up <-> down), not on every round, so a dead target cannot flood the log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import signal
import sys
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from aiokafka import AIOKafkaProducer
from rich.console import Console
from rich.table import Table

from fleetloop import clock, term
from fleetloop.edges.cli import EdgeUsageError as UsageError
from fleetloop.edges.cli import connection_from, one_line_errors
from fleetloop.edges.scrape.convert import (
    ConversionError,
    Converter,
    ExpositionError,
    MissingMetrics,
    NodeIdentity,
    parse_exposition,
)
from fleetloop.edges.scrape.page import MAX_PAGE_BYTES, PageTooLarge, read_page
from fleetloop.edges.scrape.runtimes import RUNTIMES
from fleetloop.kafka_security import bootstrap_arg, connect, error_text, shown
from fleetloop.perf.engines import ENGINES
from fleetloop.schemas.telemetry import NodeTelemetry
from fleetloop.schemas.topics import TELEMETRY, topic_name
from fleetloop.topic_layout import TopicLayoutError, require_topics

PROGRESS_EVERY_S = 10.0
MAX_HTTP_TIMEOUT_S = 5.0
_IDENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,199}$")  # schemas.base.Ident


@dataclass(frozen=True, slots=True)
class Target:
    node_id: str
    url: str


def parse_targets(spec: str, pool: str) -> list[Target]:
    """``URL[,URL...]`` or ``NODE_ID=URL`` items; a URL without a path scrapes ``/metrics``.
    Without a node id the node is ``<pool>/<host>:<port>``."""
    out: list[Target] = []
    for raw in (s.strip() for s in spec.split(",")):
        if not raw:
            continue
        node_id, _, url = raw.rpartition("=") if "=" in raw.split("://", 1)[0] else ("", "", raw)
        if "://" not in url:
            url = f"http://{url}"
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"fleetloop scrape: --target {raw!r} is not an http(s) URL")
        try:
            port = parts.port  # ValueError: not a number, or above 65535
        except ValueError:
            port = 0
        if port == 0 or (port is None and parts.netloc.endswith(":")):
            raise UsageError(f"fleetloop scrape: --target {raw!r}: the port must be in 1-65535")
        if parts.path in ("", "/"):
            url = url.rstrip("/") + "/metrics"
        if not node_id:
            node_id = f"{pool}/{parts.hostname}:{port or (443 if parts.scheme == 'https' else 80)}"
        if not _IDENT.match(node_id):  # the record would fail NodeTelemetry's node_id on every scrape
            raise UsageError(
                f"fleetloop scrape: --target {raw!r}: node id {node_id!r} is not a valid identifier"
            )
        out.append(Target(node_id, url))
    if not out:
        raise UsageError("fleetloop scrape: --target names no URL")
    ids = [t.node_id for t in out]
    if len(set(ids)) != len(ids):
        raise UsageError(f"fleetloop scrape: two targets are the same node: {sorted(ids)}")
    return out


@dataclass(slots=True)
class TargetStats:
    target: Target
    converter: Converter
    scrapes_ok: int = 0
    failures: int = 0
    parse_errors: int = 0
    published: int = 0
    up: bool | None = None
    last_error: str = ""
    last: NodeTelemetry | None = field(default=None, repr=False)

    def row(self) -> dict[str, Any]:
        c = self.converter
        return {
            "node_id": self.target.node_id,
            "url": self.target.url,
            "release": c.release.version if c.release else None,
            "up": bool(self.up),
            "scrapes_ok": self.scrapes_ok,
            "failures": self.failures,
            "parse_errors": self.parse_errors,
            "published": self.published,
            "counter_resets": c.resets,
            "last_error": self.last_error or None,
        }


def register(sub: Any) -> None:
    p = sub.add_parser(
        "scrape", help="scrape vLLM / SGLang / TensorRT-LLM / Dynamo /metrics into fleet.telemetry"
    )
    p.add_argument("--runtime", required=True, choices=RUNTIMES, help="what serves the targets")
    p.add_argument(
        "--target",
        required=True,
        metavar="URL[,URL...]",
        help="metrics endpoints (host:port, a URL, or NODE_ID=URL); no path means /metrics",
    )
    p.add_argument("--pool", required=True, metavar="ID", help="the pool these nodes serve (the record key)")
    bootstrap_arg(p, required=True)
    p.add_argument(
        "--interval-s",
        type=float,
        default=1.0,
        help="seconds between scrapes of each target; the targets are spread over it (default 1)",
    )
    p.add_argument("--model", help="model id to report (default: the runtime's model label)")
    p.add_argument("--gpu-type", default="unknown", help="GPU type of these nodes (e.g. H100)")
    p.add_argument("--gpu-count", type=int, default=1, help="GPUs per node (default 1)")
    p.add_argument(
        "--engine",
        choices=ENGINES,
        help="serving engine to report (default: the runtime's own; dynamo's backend is not on its "
        "page, so its records name none unless this is given)",
    )
    p.add_argument("--usd-per-h", type=float, default=0.0, help="what one node costs per hour")
    p.add_argument(
        "--kv-gib", type=float, default=0.0, help="KV-cache memory per node, for hbm_free_gib (default 0)"
    )
    p.add_argument("--duration-s", type=float, help="stop after this long (default: until interrupted)")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead of a table")
    p.set_defaults(handler=cmd_scrape)


def _check(args: argparse.Namespace) -> None:
    if not 0.05 <= args.interval_s <= 60:
        raise UsageError(f"fleetloop scrape: --interval-s must be in [0.05, 60], got {args.interval_s}")
    if not 1 <= args.gpu_count <= 64:
        raise UsageError(f"fleetloop scrape: --gpu-count must be in [1, 64], got {args.gpu_count}")
    if not 0 <= args.usd_per_h < 1e6 or not 0 <= args.kv_gib < 1e6:
        raise UsageError("fleetloop scrape: --usd-per-h and --kv-gib must be >= 0")
    if args.duration_s is not None and not args.duration_s > 0:  # NaN too
        raise UsageError("fleetloop scrape: --duration-s must be > 0")
    for name, val in (("--pool", args.pool), ("--model", args.model), ("--gpu-type", args.gpu_type)):
        if val is not None and not _IDENT.match(val):
            raise UsageError(f"fleetloop scrape: {name} {val!r} is not a valid identifier")


@one_line_errors
def cmd_scrape(args: argparse.Namespace) -> int:
    _check(args)
    targets = parse_targets(args.target, args.pool)
    stats = asyncio.run(_run(args, targets))
    rows = [s.row() for s in stats]
    if args.json:
        sys.stdout.write(json.dumps({"runtime": args.runtime, "pool": args.pool, "targets": rows}) + "\n")
    else:
        _print_table(args, rows)
    return 0


async def _run(args: argparse.Namespace, targets: list[Target]) -> list[TargetStats]:
    err = term.console(stderr=True)
    conn = connection_from(args)
    producer = AIOKafkaProducer(**connect(conn), acks="all", linger_ms=5)
    try:
        async with asyncio.timeout(30):
            # Once, before the first send names the topic (which would auto-create a missing one).
            await require_topics(conn, args.topic_prefix, [TELEMETRY], cleanup=True)
            await producer.start()
    except TopicLayoutError as exc:
        with contextlib.suppress(Exception):
            await producer.stop()
        raise UsageError(f"fleetloop scrape: {exc}") from None
    except Exception as exc:
        with contextlib.suppress(Exception):
            await producer.stop()
        raise UsageError(f"fleetloop scrape: cannot use Kafka at {shown(conn)}: {error_text(exc)}") from None
    topic = topic_name(args.topic_prefix, TELEMETRY)
    stats = [
        TargetStats(
            t,
            Converter(
                args.runtime,
                NodeIdentity(
                    node_id=t.node_id,
                    pool_id=args.pool,
                    model=args.model,
                    gpu_type=args.gpu_type,
                    gpu_count=args.gpu_count,
                    usd_per_h=args.usd_per_h,
                    kv_gib=args.kv_gib,
                    engine=args.engine,
                ),
            ),
        )
        for t in targets
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    err.print(
        f"[bold]fleetloop scrape[/bold]: {len(targets)} {args.runtime} target(s) -> {topic} "
        f"(pool {args.pool}) every {args.interval_s:g} s"
    )
    timeout = httpx.Timeout(min(args.interval_s, MAX_HTTP_TIMEOUT_S))
    limits = httpx.Limits(max_connections=max(10, len(targets)))
    started = clock.monotonic_s()
    try:
        async with httpx.AsyncClient(timeout=timeout, limits=limits, follow_redirects=False) as http:
            tasks = [
                asyncio.create_task(
                    _scrape_target(
                        s, http, producer, topic=topic, args=args, stop=stop, err=err,
                        offset_s=scrape_offset_s(i, len(stats), args.interval_s),
                    )
                )
                for i, s in enumerate(stats)
            ]  # fmt: skip
            tasks.append(asyncio.create_task(_progress(stats, stop, err, started)))
            if args.duration_s is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), args.duration_s)
            else:
                await stop.wait()
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        await producer.flush()
    finally:
        await producer.stop()
    return stats


def scrape_offset_s(index: int, n_targets: int, interval_s: float) -> float:
    """When in each interval target ``index`` of ``n_targets`` is scraped: evenly spread, the first
    at once. All at the same instant, a scraper of N targets sent N requests in one burst each
    interval: N expositions rendered at once on a server that hosts several nodes (the emulated
    fleet) and N pages parsed at once here, a stall of N times one page every interval."""
    return interval_s * index / n_targets if n_targets > 0 else 0.0


async def _scrape_target(
    s: TargetStats,
    http: httpx.AsyncClient,
    producer: AIOKafkaProducer,
    *,
    topic: str,
    args: argparse.Namespace,
    stop: asyncio.Event,
    err: Console,
    offset_s: float = 0.0,
) -> None:
    interval = args.interval_s
    next_at = clock.monotonic_s() + offset_s
    if offset_s > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), offset_s)
    key = args.pool.encode()
    while not stop.is_set():
        error = await _scrape_once(s, http, producer, topic, key)
        now_up = error is None
        if now_up != s.up:
            if now_up:
                rel = s.converter.release.version if s.converter.release else "?"
                err.print(f"[green]up[/green]   {s.target.node_id} ({s.target.url}, {args.runtime} {rel})")
            else:
                err.print(
                    f"[red]down[/red] {s.target.node_id} ({s.target.url}): {error} — stale until it answers"
                )
        s.up = now_up
        next_at += interval
        delay = next_at - clock.monotonic_s()
        if delay < 0:  # fell behind (slow target): skip the missed rounds, never burst
            next_at = clock.monotonic_s()
            delay = 0.0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)


async def _scrape_once(
    s: TargetStats, http: httpx.AsyncClient, producer: AIOKafkaProducer, topic: str, key: bytes
) -> str | None:
    """One round for one target: the error text, or None if it answered with good exposition."""
    try:
        async with http.stream("GET", s.target.url) as resp:
            if resp.status_code != 200:
                raise httpx.HTTPStatusError(f"HTTP {resp.status_code}", request=resp.request, response=resp)
            text = await read_page(resp, MAX_PAGE_BYTES)
    except PageTooLarge as exc:
        s.parse_errors += 1
        s.last_error = str(exc)
        return s.last_error
    except httpx.HTTPError as exc:
        s.failures += 1
        s.last_error = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
        return s.last_error
    try:
        expo = parse_exposition(text)
        rec = s.converter.update(expo, ts_ms=clock.wall_ms(), mono_ms=round(clock.monotonic_s() * 1000))
    except MissingMetrics as exc:  # another server's page: down and stale, never an idle node
        s.parse_errors += 1
        s.last_error = f"{exc} at {s.target.url} ({exc.hint})"
        return s.last_error
    except (ExpositionError, ConversionError) as exc:
        s.parse_errors += 1
        s.last_error = str(exc)
        return s.last_error
    s.scrapes_ok += 1
    if rec is not None:
        await producer.send(topic, value=orjson.dumps(rec.model_dump(mode="json")), key=key)
        s.published += 1
        s.last = rec
    return None


async def _progress(stats: list[TargetStats], stop: asyncio.Event, err: Console, started: float) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PROGRESS_EVERY_S)
        if stop.is_set():
            return
        up = sum(1 for s in stats if s.up)
        err.print(
            f"[dim]{clock.monotonic_s() - started:5.0f}s[/dim] {up}/{len(stats)} up  "
            f"published {sum(s.published for s in stats)}  failures {sum(s.failures for s in stats)}  "
            f"bad exposition {sum(s.parse_errors for s in stats)}"
        )


def _print_table(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    out = term.console()
    t = Table(title=f"fleetloop scrape — {args.runtime}, pool {args.pool}")
    for col in ("node", "release", "up", "ok", "failed", "bad text", "published", "resets", "last error"):
        t.add_column(col, justify="left" if col in ("node", "release", "last error") else "right")
    for r in rows:
        t.add_row(
            r["node_id"],
            r["release"] or "-",
            "yes" if r["up"] else "no",
            str(r["scrapes_ok"]),
            str(r["failures"]),
            str(r["parse_errors"]),
            str(r["published"]),
            str(r["counter_resets"]),
            (r["last_error"] or "")[:60],
        )
    out.print(t)
