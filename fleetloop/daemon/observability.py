"""fleetloop's own telemetry: structured logs (structlog) and traces/metrics (OpenTelemetry).

Logs go to stderr as JSON lines (``--log-format json``) or readable key=value lines. Spans and
counters use the OpenTelemetry SDK; with ``OTEL_EXPORTER_CONSOLE=1`` they are printed on stderr,
otherwise they are kept in process (an OTLP exporter can be wired by the deployment).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

_configured = False


def configure(level: str = "info", fmt: str = "console") -> None:
    global _configured  # noqa: PLW0603 - process-wide logging setup, once
    if _configured:
        return
    _configured = True
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
    renderer: Any = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    resource = Resource.create({"service.name": "fleetloop"})
    tracer_provider = TracerProvider(resource=resource)
    readers = []
    if os.environ.get("OTEL_EXPORTER_CONSOLE") == "1":
        tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter(out=sys.stderr)))
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))


def logger(name: str) -> Any:
    return structlog.get_logger(name)


tracer = trace.get_tracer("fleetloop")
meter = metrics.get_meter("fleetloop")
