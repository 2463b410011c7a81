"""An emulated node's ``GET /metrics``, in vLLM 0.33's exposition format.

Names, help texts, label names (``model_name``, ``engine``; ``finished_reason`` on
``vllm:request_success``) and histogram buckets are those of the vllm 0.33.0 wheel
(``vllm/v1/metrics/loggers.py``, ``vllm/v1/metrics/buckets.py``), and the text is what
prometheus_client writes, as vLLM's is, so ``fleetloop scrape --runtime vllm`` reads an emulated
node and a real one the same way. Exposed: the scheduler gauges, KV-cache usage, prefix-cache
queries and hits, preemptions, prompt and generation tokens, request successes by finish reason,
and the TTFT, inter-token latency and end-to-end latency histograms; vLLM's other families
(per-phase timings, speculative decoding, LoRA, ...) are not emulated.

Where the node model differs from vLLM: prefix-cache queries and hits count requests, not tokens
(the rate is what fleetloop reads); a completed request finishes with ``length`` (the emulated
engine generates ``max_tokens``), a request its client abandoned with ``abort``, a lost one (the
prompt can never fit, or the engine died) with ``error``; inter-token latency is observed once per
generated token with its decode step's time, as vLLM does, folded per run of steps.

The text is not made by prometheus_client's ``generate_latest``: the 24 nodes of ``fleetloop bench
stack`` share the emulator's one event loop and are scraped every second, and ``generate_latest``
(metric family objects for every family at every scrape) took over a millisecond a scrape, enough
to push the loop's lag p99 over the bench's bar. :meth:`VllmMetrics.exposition` fills the values
into a template made once per node (help and type lines, label sets, bucket bounds, the
``_created`` samples), each value formatted by prometheus_client's own ``floatToGoString``: the
same bytes as ``generate_latest`` over :meth:`VllmMetrics.collect`, which stays for any registry
user (a test holds the two equal).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import cast

import prometheus_client.utils
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetloop.sim.node import IntervalStats, Node

# vllm 0.33.0, vllm/v1/metrics/buckets.py
TTFT_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS_S: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0,
)  # fmt: skip
E2E_BUCKETS_S: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # vllm/v1/engine/__init__.py

# The families, (name, help), in the order they are written.
PROCESS_START = ("process_start_time_seconds", "Start time of the process since unix epoch in seconds.")
GAUGES = (
    ("vllm:num_requests_running", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
)
COUNTERS = (
    ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    ("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
    ("vllm:prompt_tokens", "Number of prefill tokens processed."),
    ("vllm:generation_tokens", "Number of generation tokens processed."),
)
SUCCESS = ("vllm:request_success", "Count of successfully processed requests.")
HISTOGRAMS = (
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
)


class _Hist:
    """Bucket counts (non-cumulative), sum and count of one histogram series."""

    __slots__ = ("bounds", "counts", "n", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0.0] * (len(bounds) + 1)
        self.total = 0.0
        self.n = 0.0

    def observe(self, value_s: float, weight: float = 1.0) -> None:
        self.counts[bisect.bisect_left(self.bounds, value_s)] += weight
        self.total += value_s * weight
        self.n += weight

    def cumulative(self) -> list[float]:
        """The count at or below each bound (the ``+Inf`` bucket is :attr:`n`)."""
        out: list[float] = []
        cum = 0.0
        for c in self.counts[:-1]:
            cum += c
            out.append(cum)
        return out

    def family(self, name: str, doc: str, labels: list[str], values: list[str]) -> HistogramMetricFamily:
        h = HistogramMetricFamily(name, doc, labels=labels)
        buckets = [(_le(b), c) for b, c in zip(self.bounds, self.cumulative(), strict=True)]
        buckets.append(("+Inf", self.n))
        h.add_metric(values, buckets, self.total)
        return h


def _le(b: float) -> str:
    return repr(float(b))  # prometheus_client writes bucket bounds as floats: "0.001", "10.0"


# A sample value as prometheus_client writes it (``+Inf``, ``1.234567e+06``, ...). The library's
# function has no annotations, which mypy's strict mode will not call; the cast types it.
_go = cast(Callable[[float], str], prometheus_client.utils.floatToGoString)


def _labels(labels: dict[str, str]) -> str:
    """A sample's label set as prometheus_client writes it: sorted by name, values escaped."""
    esc = {k: v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"") for k, v in labels.items()}
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(esc.items())) + "}"


def _head(name: str, doc: str, kind: str) -> str:
    doc = doc.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


class VllmMetrics(Collector):
    """Cumulative vLLM metrics of one node; :meth:`fold` adds a node's interval stats.

    The model name and ``start_s`` are written into the node's template when it is made: they do
    not change afterwards."""

    def __init__(self, node: Node, served_model_name: str, *, start_s: float) -> None:
        self.node = node
        self.labels = ["model_name", "engine"]
        self.values = [served_model_name, "0"]
        self.start_s = start_s  # epoch seconds: process_start_time_seconds and the _created samples
        self.prompt_tokens = 0.0
        self.generation_tokens = 0.0
        self.preemptions = 0.0
        self.prefix_queries = 0.0
        self.prefix_hits = 0.0
        self.success = dict.fromkeys(FINISH_REASONS, 0.0)
        self.ttft = _Hist(TTFT_BUCKETS_S)
        self.itl = _Hist(ITL_BUCKETS_S)
        self.e2e = _Hist(E2E_BUCKETS_S)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._template = self._make_template()

    def fold(self, s: IntervalStats) -> None:
        self.prompt_tokens += s.prompt_tokens
        self.generation_tokens += s.output_tokens
        self.preemptions += s.preemptions
        self.prefix_queries += s.prefix_lookups
        self.prefix_hits += s.prefix_hits
        self.success["length"] += s.completed
        self.success["abort"] += s.timeouts
        self.success["error"] += s.errors
        for ms in s.ttft_ms:
            self.ttft.observe(ms / 1000.0)
        for step_ms, tokens in s.tbt:
            self.itl.observe(step_ms / 1000.0, tokens)

    def observe_e2e(self, seconds: float) -> None:
        self.e2e.observe(seconds)

    def _gauges(self) -> tuple[float, float, float]:
        node = self.node
        kv = min(1.0, node.kv_used / max(1, node.capacity))  # cached-but-unreferenced blocks are free
        return node.running, node.queue_depth, kv

    def _counters(self) -> tuple[float, float, float, float, float]:
        return (
            self.prefix_queries,
            self.prefix_hits,
            self.preemptions,
            self.prompt_tokens,
            self.generation_tokens,
        )

    def _histograms(self) -> tuple[_Hist, _Hist, _Hist]:
        return self.ttft, self.itl, self.e2e

    def exposition(self) -> bytes:
        """The ``GET /metrics`` body: the bytes ``generate_latest(self.registry)`` writes."""
        out = [_go(v) for v in self._gauges()]
        out += [_go(v) for v in self._counters()]
        out += [_go(self.success[reason]) for reason in FINISH_REASONS]
        for h in self._histograms():
            out += [_go(c) for c in h.cumulative()]
            n = _go(h.n)
            out += (n, n, _go(h.total))  # the +Inf bucket, the count, the sum
        return (self._template % tuple(out)).encode()

    def _make_template(self) -> str:
        """The exposition with a ``%s`` where each value of :meth:`exposition` goes, in its order;
        the families, samples and lines are those ``generate_latest`` writes from :meth:`collect`
        (a counter's ``_created`` samples in a gauge family after it)."""
        chunks: list[str] = []  # the text between two values
        text: list[str] = []

        def value() -> None:
            chunks.append("".join(text))
            text.clear()

        base = dict(zip(self.labels, self.values, strict=True))
        lab = _labels(base)
        start = _go(self.start_s)
        name, doc = PROCESS_START
        text += [_head(name, doc, "gauge"), f"{name} {start}\n"]
        for name, doc in GAUGES:
            text += [_head(name, doc, "gauge"), f"{name}{lab} "]
            value()
            text.append("\n")
        for name, doc in COUNTERS:
            text += [_head(f"{name}_total", doc, "counter"), f"{name}_total{lab} "]
            value()
            text += ["\n", _head(f"{name}_created", doc, "gauge"), f"{name}_created{lab} {start}\n"]
        name, doc = SUCCESS
        by_reason = [_labels({**base, "finished_reason": reason}) for reason in FINISH_REASONS]
        text.append(_head(f"{name}_total", doc, "counter"))
        for reason_lab in by_reason:
            text.append(f"{name}_total{reason_lab} ")
            value()
            text.append("\n")
        text.append(_head(f"{name}_created", doc, "gauge"))
        text += [f"{name}_created{reason_lab} {start}\n" for reason_lab in by_reason]
        for (name, doc), h in zip(HISTOGRAMS, self._histograms(), strict=True):
            text.append(_head(name, doc, "histogram"))
            for le in [*map(_le, h.bounds), "+Inf"]:
                text.append(f"{name}_bucket{_labels({**base, 'le': le})} ")
                value()
                text.append("\n")
            for suffix in ("_count", "_sum"):
                text.append(f"{name}{suffix}{lab} ")
                value()
                text.append("\n")
        chunks.append("".join(text))
        return "%s".join(c.replace("%", "%%") for c in chunks)

    def collect(self) -> Iterator[Metric]:
        lab, val = self.labels, self.values
        name, doc = PROCESS_START
        yield GaugeMetricFamily(name, doc, value=self.start_s)
        for (name, doc), v in zip(GAUGES, self._gauges(), strict=True):
            g = GaugeMetricFamily(name, doc, labels=lab)
            g.add_metric(val, v)
            yield g
        for (name, doc), v in zip(COUNTERS, self._counters(), strict=True):
            c = CounterMetricFamily(name, doc, labels=lab)
            c.add_metric(val, v, created=self.start_s)
            yield c
        name, doc = SUCCESS
        ok = CounterMetricFamily(name, doc, labels=[*lab, "finished_reason"])
        for reason in FINISH_REASONS:
            ok.add_metric([*val, reason], self.success[reason], created=self.start_s)
        yield ok
        for (name, doc), h in zip(HISTOGRAMS, self._histograms(), strict=True):
            yield h.family(name, doc, lab, val)
