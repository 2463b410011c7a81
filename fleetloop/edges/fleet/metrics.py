"""An emulated node's ``GET /metrics``, in vLLM 0.33's exposition format.

Names, help texts, label names (``model_name``, ``engine``; ``finished_reason`` on
``vllm:request_success``) and histogram buckets are those of the vllm 0.33.0 wheel
(``vllm/v1/metrics/loggers.py``, ``vllm/v1/metrics/buckets.py``), and the text is written by
prometheus_client, as vLLM's is, so ``fleetloop scrape --runtime vllm`` reads an emulated node and
a real one the same way. Exposed: the scheduler gauges, KV-cache usage, prefix-cache queries and
hits, preemptions, prompt and generation tokens, request successes by finish reason, and the TTFT,
inter-token latency and end-to-end latency histograms; vLLM's other families (per-phase timings,
speculative decoding, LoRA, ...) are not emulated.

Where the node model differs from vLLM: prefix-cache queries and hits count requests, not tokens
(the rate is what fleetloop reads); a completed request finishes with ``length`` (the emulated
engine generates ``max_tokens``), a request its client abandoned with ``abort``, a lost one (the
prompt can never fit, or the engine died) with ``error``; inter-token latency is observed once per
generated token with its decode step's time, as vLLM does, folded per run of steps.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
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

    def family(self, name: str, doc: str, labels: list[str], values: list[str]) -> HistogramMetricFamily:
        h = HistogramMetricFamily(name, doc, labels=labels)
        cum = 0.0
        buckets: list[tuple[str, float]] = []
        for b, c in zip(self.bounds, self.counts, strict=False):
            cum += c
            buckets.append((_le(b), cum))
        buckets.append(("+Inf", self.n))
        h.add_metric(values, buckets, self.total)
        return h


def _le(b: float) -> str:
    return repr(float(b))  # prometheus_client writes bucket bounds as floats: "0.001", "10.0"


class VllmMetrics(Collector):
    """Cumulative vLLM metrics of one node; :meth:`fold` adds a node's interval stats."""

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

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        lab, val = self.labels, self.values
        node = self.node
        yield GaugeMetricFamily(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            value=self.start_s,
        )

        def gauge(name: str, doc: str, v: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=lab)
            g.add_metric(val, v)
            return g

        def counter(name: str, doc: str, v: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=lab)
            c.add_metric(val, v, created=self.start_s)
            return c

        yield gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", node.running
        )
        yield gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", node.queue_depth
        )
        kv = min(1.0, node.kv_used / max(1, node.capacity))  # cached-but-unreferenced blocks are free
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv)
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            self.prefix_queries,
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            self.prefix_hits,
        )
        yield counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", self.preemptions
        )
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens)
        yield counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", self.generation_tokens
        )
        ok = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*lab, "finished_reason"],
        )
        for reason in FINISH_REASONS:
            ok.add_metric([*val, reason], self.success[reason], created=self.start_s)
        yield ok
        yield self.ttft.family(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lab, val
        )
        yield self.itl.family(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lab, val
        )
        yield self.e2e.family(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lab, val
        )
