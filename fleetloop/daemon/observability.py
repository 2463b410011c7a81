"""fleetloop's own telemetry: structured logs (structlog) and traces/metrics (OpenTelemetry).

Logs
    One pipeline for fleetloop's lines and every stdlib logger's (aiokafka, asyncio, OpenTelemetry):
    stdlib records are routed into structlog, so under ``--log-format json`` every line on stderr
    is one JSON object. Repeats are rate-limited: the first line of a kind (logger, event, and an
    optional ``ratelimit_key``) passes, later ones within ``REPEAT_WINDOW_S`` are counted, and the
    count comes out on the next line of that kind or in a periodic summary (``repeated``:
    N, ``window_s``). Warnings and errors are limited; info lines only when they carry a
    ``ratelimit_key``. Rendering happens on the caller's thread; writing happens on a writer thread
    behind a bounded queue, so a slow stderr reader never blocks the event loop: when the queue is
    full the line is dropped and counted (``fleetloop_log_lines_dropped_total`` and a
    ``log lines dropped`` line once the writer catches up). The Kafka client's known transient
    start-up conditions (``TRANSIENT_AT_START``) come out at info in the first ``START_GRACE_S``.

Traces and metrics
    :func:`setup_telemetry` installs the OpenTelemetry SDK providers once per process: metrics are
    read by the Prometheus exporter into fleetloop's own registry (served on ``/metrics``);
    with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set (the standard variable, and the standard
    ``OTEL_EXPORTER_OTLP_*`` ones beside it) traces and metrics are also exported over OTLP/HTTP;
    nothing leaves the process otherwise. ``OTEL_EXPORTER_CONSOLE=1`` prints them on stderr.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import threading
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import IO, Any, Final

import structlog
from aiokafka.errors import GroupCoordinatorNotAvailableError
from opentelemetry import metrics, trace
from prometheus_client import CollectorRegistry

from fleetloop import clock

REPEAT_WINDOW_S: Final = 10.0
QUEUE_LINES: Final = 10_000
_LIMITED_LEVELS: Final = frozenset({"warning", "error", "critical"})

_configured = False
_writer: QueueWriter | None = None
_limiter: RateLimiter | None = None
registry = CollectorRegistry(auto_describe=True)  # what /metrics serves
_telemetry_ready = False


# -- rate limiting -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Window:
    opened_s: float
    suppressed: int
    last: dict[str, Any]


class RateLimiter:
    """A structlog processor: the first line of a kind per window passes, repeats are counted."""

    def __init__(
        self, window_s: float = REPEAT_WINDOW_S, now: Callable[[], float] = clock.monotonic_s
    ) -> None:
        self.window_s = window_s
        self._now = now
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, str, str], _Window] = {}
        self.suppressed_total = 0

    @staticmethod
    def key_of(event_dict: MutableMapping[str, Any]) -> tuple[str, str, str] | None:
        key = event_dict.pop("ratelimit_key", None)
        if key is None and event_dict.get("level") not in _LIMITED_LEVELS:
            return None
        return (str(event_dict.get("logger", "")), str(event_dict.get("event", "")), str(key or ""))

    def __call__(self, _logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> Any:
        key = self.key_of(event_dict)
        if key is None:
            return event_dict
        now = self._now()
        with self._lock:
            w = self._windows.get(key)
            if w is None or now - w.opened_s >= self.window_s:
                if w is not None and w.suppressed:
                    event_dict["repeated"] = w.suppressed
                    event_dict["window_s"] = round(now - w.opened_s, 1)
                self._windows[key] = _Window(now, 0, {})
                if len(self._windows) > 10_000:  # bounded: forget the oldest kinds
                    for k in sorted(self._windows, key=lambda k: self._windows[k].opened_s)[:5_000]:
                        del self._windows[k]
                return event_dict
            w.suppressed += 1
            w.last = dict(event_dict)
            self.suppressed_total += 1
        raise structlog.DropEvent

    def due(self) -> list[dict[str, Any]]:
        """Summary lines for kinds whose window closed with repeats in it (the periodic flush)."""
        now = self._now()
        out: list[dict[str, Any]] = []
        with self._lock:
            for key, w in list(self._windows.items()):
                if now - w.opened_s < self.window_s:
                    continue
                if w.suppressed:
                    line = dict(w.last)
                    line["repeated"] = w.suppressed
                    line["window_s"] = round(now - w.opened_s, 1)
                    out.append(line)
                del self._windows[key]
        return out


# -- non-blocking output -------------------------------------------------------------------------


class QueueWriter:
    """Rendered lines go into a bounded queue; one daemon thread writes them to ``stream``."""

    def __init__(
        self,
        stream: IO[str],
        *,
        maxsize: int = QUEUE_LINES,
        flush_every_s: float = 1.0,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        self.stream = stream
        self.dropped = 0
        self.written = 0
        self._reported = 0
        self._q: queue.Queue[str | None] = queue.Queue(maxsize=maxsize)
        self._flush_every_s = flush_every_s
        self._on_tick = on_tick
        self._thread = threading.Thread(target=self._run, name="fleetloop-log-writer", daemon=True)
        self._thread.start()

    def put(self, line: str) -> None:
        try:
            self._q.put_nowait(line)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while True:
            try:
                line = self._q.get(timeout=self._flush_every_s)
            except queue.Empty:
                line = ""
            if line is None:
                return
            if self._on_tick is not None and line == "":
                self._on_tick()
                continue
            if line:
                self._write(line)
            if self.dropped > self._reported and self._q.qsize() < self._q.maxsize // 2:
                n, self._reported = self.dropped - self._reported, self.dropped
                self._write(_render_notice("log lines dropped", dropped=n, dropped_total=self.dropped))

    def _write(self, line: str) -> None:
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
            self.written += 1
        except (OSError, ValueError):  # a closed or broken stderr: nothing left to tell
            self.dropped += 1

    def close(self, timeout_s: float = 2.0) -> None:
        """Write what is queued (up to ``timeout_s``), then stop the thread."""
        try:
            self._q.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)


class _QueueLogger:
    def __init__(self, writer: QueueWriter) -> None:
        self._writer = writer

    def msg(self, message: str) -> None:
        self._writer.put(message)

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


_render: Callable[[dict[str, Any]], str] | None = None


def _render_notice(event: str, **kw: Any) -> str:
    line = {"event": event, "level": "warning", "logger": "fleetloop.log", **kw}
    return _render(line) if _render is not None else str(line)


# -- stdlib -> structlog -------------------------------------------------------------------------


# Conditions the Kafka client logs at level error and then retries by itself, harmless while a
# process starts: on a cluster's first start the group coordinator is not available until the
# broker has created its offsets topic. Within START_GRACE_S of the logging set-up such a record is
# logged at info; later it keeps its level (a coordinator that stays away is a real problem).
START_GRACE_S: Final = 30.0
TRANSIENT_AT_START: Final[dict[tuple[str, str], tuple[type[BaseException], ...]]] = {
    ("aiokafka.consumer.group_coordinator", "Group Coordinator Request failed: %s"): (
        GroupCoordinatorNotAvailableError,
    ),
}


def start_up_level(record: logging.LogRecord, since_start_s: float) -> int:
    """The level ``record`` is logged at: info for a known transient start-up condition (above)."""
    if since_start_s >= START_GRACE_S or record.levelno < logging.ERROR:
        return record.levelno
    kinds = TRANSIENT_AT_START.get((record.name, str(record.msg)))
    args = record.args if isinstance(record.args, tuple) else ()
    if kinds and args and isinstance(args[0], kinds):
        return logging.INFO
    return record.levelno


class _StdlibBridge(logging.Handler):
    """Every stdlib record (aiokafka, asyncio, opentelemetry ...) through fleetloop's pipeline."""

    def __init__(self) -> None:
        super().__init__()
        self.started_s = clock.monotonic_s()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields: dict[str, Any] = {"logger": record.name, "ratelimit_key": str(record.msg)}
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                fields["error"] = f"{type(exc).__name__}: {exc}"  # one line, never a traceback
            level = start_up_level(record, clock.monotonic_s() - self.started_s)
            structlog.get_logger(record.name).log(level, record.getMessage(), **fields)
        except Exception:
            self.handleError(record)


def configure(level: str = "info", fmt: str = "console", *, stream: IO[str] | None = None) -> None:
    """Process-wide log setup (once): structlog + stdlib bridge + rate limiter + writer thread."""
    global _configured, _writer, _limiter, _render  # noqa: PLW0603 - process-wide logging setup, once
    if _configured:
        return
    _configured = True
    out = stream or sys.stderr
    json_renderer = structlog.processors.JSONRenderer()
    renderer: Any = json_renderer if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    _render = lambda d: str(renderer(None, "", dict(d)))  # noqa: E731 - tiny adapter
    limiter = RateLimiter()

    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)

    def flush_repeats() -> None:
        for line in limiter.due():
            writer.put(str(renderer(None, "", stamp(None, "", line))))

    writer = QueueWriter(out, on_tick=flush_repeats)
    _writer, _limiter = writer, limiter
    atexit.register(writer.close)
    levels = logging.getLevelNamesMapping()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            _logger_field,
            limiter,
            stamp,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(levels[level.upper()]),
        logger_factory=_QueueLoggerFactory(writer),
        cache_logger_on_first_use=True,
    )
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(_StdlibBridge())
    root.setLevel(logging.WARNING)  # the client libraries' info/debug chatter stays out
    logging.captureWarnings(True)


class _QueueLoggerFactory:
    def __init__(self, writer: QueueWriter) -> None:
        self._writer = writer

    def __call__(self, *args: Any) -> _QueueLogger:
        return _QueueLogger(self._writer)


def _logger_field(_logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> Any:
    name = event_dict.pop("logger_name", None)
    if name is not None and "logger" not in event_dict:
        event_dict["logger"] = name
    return event_dict


def logs_dropped() -> int:
    return _writer.dropped if _writer is not None else 0


def logs_suppressed() -> int:
    return _limiter.suppressed_total if _limiter is not None else 0


def shutdown() -> None:
    """Flush queued log lines and exporters (end of a command)."""
    if _writer is not None:
        _writer.close()
    provider = metrics.get_meter_provider()
    with_shutdown = getattr(provider, "shutdown", None)
    if callable(with_shutdown):
        with_shutdown()
    tp = trace.get_tracer_provider()
    tshutdown = getattr(tp, "shutdown", None)
    if callable(tshutdown):
        tshutdown()


def setup_telemetry() -> None:
    """Install the OpenTelemetry providers once per process (see the module docstring)."""
    global _telemetry_ready  # noqa: PLW0603 - process-wide providers, once
    if _telemetry_ready:
        return
    _telemetry_ready = True
    # The SDK is imported here, by the commands that set it up (run, demo); the OTLP exporter only
    # when it is configured.
    from opentelemetry.exporter.prometheus import PrometheusMetricReader  # noqa: PLC0415 - run, demo only
    from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415 - run, demo only
    from opentelemetry.sdk.metrics.export import (  # noqa: PLC0415 - run, demo only
        ConsoleMetricExporter,
        MetricReader,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415 - run, demo only
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415 - run, demo only
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor  # noqa: PLC0415 - run, demo only

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "fleetloop")})
    tracer_provider = TracerProvider(resource=resource)
    readers: list[MetricReader] = [PrometheusMetricReader(registry=registry, scope_info_enabled=False)]
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter  # noqa: PLC0415 - when configured
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415 - when configured

        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    if os.environ.get("OTEL_EXPORTER_CONSOLE") == "1":
        tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter(out=sys.stderr)))
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))


def logger(name: str) -> Any:
    return structlog.get_logger(name, logger_name=name)


tracer = trace.get_tracer("fleetloop")
meter = metrics.get_meter("fleetloop")
