"""Which exposed metric feeds which ``NodeTelemetry`` field, per serving runtime and release.

Every name, label and unit below was read from the runtime's released source (the wheel from the
package registry, ``pip download --no-deps``), except TensorRT-LLM, whose wheels live on
NVIDIA's own package index (unreachable from here; the PyPI ``tensorrt-llm`` only redirects installs to
there): its names come from the TensorRT-LLM and tensorrtllm_backend source on GitHub, cited per
release. Names are *sample* names as prometheus_client's text parser reports them (a counter's always
ends in ``_total``, which the parser adds when an exporter such as Triton's omits it; a histogram
by its base name, whose ``_bucket`` samples are read).

A runtime has several releases whose spellings differ (vLLM V0 -> V1 renamed
``gpu_cache_usage_perc`` -> ``kv_cache_usage_perc``, ``time_per_output_token_seconds`` ->
``inter_token_latency_seconds``, ``gpu_prefix_cache_*`` -> ``prefix_cache_*``; TensorRT-LLM's
Triton backend and ``trtllm-serve`` share nothing). :func:`detect` picks, per scrape, the release
whose names the exposition carries most of (a histogram counts by its ``_bucket`` samples), so one
``--runtime vllm`` reads every vLLM release listed here; a page that carries none of a runtime's
names has no release. A page whose names fit several releases equally (only the request gauges,
which every vLLM release spells alike) gets no release it cannot show: it is an *unknown* release
(:attr:`Release.candidates` holds the ones it may be), which the converter reads only where all of
them read the page alike.

What a page needs to be read (:data:`CORE_FIELDS`, :data:`LOAD_FIELDS`): a page without any of the
runtime's core names (request gauges, KV usage) is some other server's; one without both request
gauges would make a record claiming an idle node (every missing field reads 0), so it is refused too.

Field kinds (how :mod:`fleetloop.edges.scrape.convert` folds the samples that match a source):

- ``gauge_sum``: gauges summed over matching series (one series per engine / DP rank);
- ``gauge_max``: the largest matching gauge (a fraction: the fullest engine decides);
- ``counter``: the increase since the previous scrape, summed over matching series;
- ``histogram``: bucket increases since the previous scrape, summed over series, then quantiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["gauge_sum", "gauge_max", "counter", "histogram"]

# NodeTelemetry fields (and two helpers) a runtime can feed, with how each is folded.
FIELD_KINDS: dict[str, Kind] = {
    "running_requests": "gauge_sum",
    "queue_depth": "gauge_sum",
    "kv_cache_used_frac": "gauge_max",
    "prefix_cache_hit_frac": "gauge_max",  # a runtime's own hit-rate gauge
    "prefix_hits": "counter",  # or hit/query counters (tokens), from which the interval's rate comes
    "prefix_queries": "counter",
    "preemptions": "counter",
    "prompt_tokens": "counter",
    "output_tokens": "counter",
    "requests_completed": "counter",
    "errors": "counter",
    "timeouts": "counter",
    "ttft": "histogram",
    "tbt": "histogram",
}


# The fields that tell a runtime's page from any other server's: its request gauges and KV usage.
CORE_FIELDS: tuple[str, ...] = ("running_requests", "queue_depth", "kv_cache_used_frac")
# Without one of these the record would say "nothing running, nothing waiting": an idle node.
LOAD_FIELDS: tuple[str, ...] = ("running_requests", "queue_depth")


@dataclass(frozen=True, slots=True)
class Source:
    """Samples named ``name`` whose labels match ``where`` (label -> allowed values), times ``scale``
    to reach the field's unit (histograms: to milliseconds)."""

    name: str
    where: tuple[tuple[str, tuple[str, ...]], ...] = ()
    scale: float = 1.0

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k) in allowed for k, allowed in self.where)

    def describe(self) -> str:
        cond = ",".join(f"{k}={'/'.join(v)}" for k, v in self.where)
        return f"`{self.name}{{{cond}}}`" if cond else f"`{self.name}`"


def _s(name: str, scale: float = 1.0, **where: tuple[str, ...]) -> tuple[Source, ...]:
    return (Source(name, tuple(sorted(where.items())), scale),)


@dataclass(frozen=True, slots=True)
class Release:
    """One release's spelling: ``fields`` maps a field to its sources (first one present wins)."""

    runtime: str
    version: str
    source: str  # where the names were read
    fields: dict[str, tuple[Source, ...]]
    model_labels: tuple[str, ...] = ("model_name",)
    notes: tuple[str, ...] = field(default=())
    # Not empty: the page's names fit each of these releases equally, so which one it is is unknown;
    # ``fields`` then holds every source any of them reads (the converter checks they agree).
    candidates: tuple[Release, ...] = ()

    def names(self) -> frozenset[str]:
        return frozenset(s.name for srcs in self.fields.values() for s in srcs)

    def names_of(self, fields: tuple[str, ...]) -> frozenset[str]:
        return frozenset(s.name for f in fields for s in self.fields.get(f, ()))


_MS = 1000.0  # seconds -> milliseconds

VLLM_V1_OK = ("stop", "length", "repetition")

RELEASES: dict[str, tuple[Release, ...]] = {
    "vllm": (
        Release(
            "vllm",
            "0.33.0 (V1)",
            "vllm 0.33.0 wheel: vllm/v1/metrics/loggers.py, vllm/v1/metrics/buckets.py, "
            "vllm/v1/engine/__init__.py (FinishReason)",
            {
                "running_requests": _s("vllm:num_requests_running"),
                "queue_depth": _s("vllm:num_requests_waiting"),
                "kv_cache_used_frac": _s("vllm:kv_cache_usage_perc"),
                "prefix_hits": _s("vllm:prefix_cache_hits_total"),
                "prefix_queries": _s("vllm:prefix_cache_queries_total"),
                "preemptions": _s("vllm:num_preemptions_total"),
                "prompt_tokens": _s("vllm:prompt_tokens_total"),
                "output_tokens": _s("vllm:generation_tokens_total"),
                "requests_completed": _s("vllm:request_success_total", finished_reason=VLLM_V1_OK),
                "errors": _s("vllm:request_success_total", finished_reason=("error",)),
                "timeouts": _s("vllm:request_success_total", finished_reason=("abort",)),
                "ttft": _s("vllm:time_to_first_token_seconds", _MS),
                "tbt": _s("vllm:inter_token_latency_seconds", _MS),
            },
            notes=("`finished_reason=abort` counts requests their client aborted: fleetloop's timeouts",),
        ),
        Release(
            "vllm",
            "0.8.5 (V1, before the renames)",
            "vllm 0.8.5 wheel: vllm/v1/metrics/loggers.py, vllm/v1/engine/__init__.py (FinishReason)",
            {
                "running_requests": _s("vllm:num_requests_running"),
                "queue_depth": _s("vllm:num_requests_waiting"),
                "kv_cache_used_frac": _s("vllm:gpu_cache_usage_perc"),
                "prefix_hits": _s("vllm:gpu_prefix_cache_hits_total"),
                "prefix_queries": _s("vllm:gpu_prefix_cache_queries_total"),
                "preemptions": _s("vllm:num_preemptions_total"),
                "prompt_tokens": _s("vllm:prompt_tokens_total"),
                "output_tokens": _s("vllm:generation_tokens_total"),
                "requests_completed": _s("vllm:request_success_total", finished_reason=("stop", "length")),
                "timeouts": _s("vllm:request_success_total", finished_reason=("abort",)),
                "ttft": _s("vllm:time_to_first_token_seconds", _MS),
                "tbt": _s("vllm:time_per_output_token_seconds", _MS),
            },
        ),
        Release(
            "vllm",
            "0.6.6 (V0)",
            "vllm 0.6.6 wheel: vllm/engine/metrics.py",
            {
                "running_requests": _s("vllm:num_requests_running"),
                "queue_depth": _s("vllm:num_requests_waiting"),
                "kv_cache_used_frac": _s("vllm:gpu_cache_usage_perc"),
                "prefix_cache_hit_frac": _s("vllm:gpu_prefix_cache_hit_rate"),
                "preemptions": _s("vllm:num_preemptions_total"),
                "prompt_tokens": _s("vllm:prompt_tokens_total"),
                "output_tokens": _s("vllm:generation_tokens_total"),
                "requests_completed": _s("vllm:request_success_total"),
                "ttft": _s("vllm:time_to_first_token_seconds", _MS),
                "tbt": _s("vllm:time_per_output_token_seconds", _MS),
            },
            notes=("V0's prefix hit rate is the engine's own gauge (since start), not the interval's",),
        ),
    ),
    "sglang": (
        Release(
            "sglang",
            "0.5.23",
            "sglang 0.5.23 wheel: sglang/srt/observability/metrics_collector.py",
            {
                "running_requests": _s("sglang:num_running_reqs"),
                "queue_depth": _s("sglang:num_queue_reqs"),
                "kv_cache_used_frac": _s("sglang:token_usage"),
                "prefix_cache_hit_frac": _s("sglang:cache_hit_rate"),
                "preemptions": _s("sglang:num_retracted_requests_total"),
                "prompt_tokens": _s("sglang:prompt_tokens_total"),
                "output_tokens": _s("sglang:generation_tokens_total"),
                "requests_completed": _s("sglang:num_requests_total"),
                "timeouts": _s("sglang:num_aborted_requests_total"),
                "ttft": _s("sglang:time_to_first_token_seconds", _MS),
                "tbt": _s("sglang:inter_token_latency_seconds", _MS),
            },
            notes=(
                "SGLang calls preemption *retraction*",
                "`sglang:num_requests_total` counts every finished request, aborted ones included",
            ),
        ),
    ),
    "trtllm": (
        Release(
            "trtllm",
            "trtllm-serve (TensorRT-LLM 1.2)",
            "NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py (GitHub, commit 050f80d; the wheel "
            "is only on NVIDIA's own package index)",
            {
                "running_requests": _s("trtllm_num_requests_running"),
                "queue_depth": _s("trtllm_num_requests_waiting"),
                "kv_cache_used_frac": _s("trtllm_kv_cache_utilization"),
                "prefix_cache_hit_frac": _s("trtllm_kv_cache_hit_rate"),
                "prompt_tokens": _s("trtllm_prompt_tokens_total"),
                "output_tokens": _s("trtllm_generation_tokens_total"),
                "requests_completed": _s("trtllm_request_success_total"),
                "errors": _s("trtllm_request_error_total"),
                "ttft": _s("trtllm_time_to_first_token_seconds", _MS),
                "tbt": (
                    Source("trtllm_time_per_output_token_seconds", (), _MS),
                    Source("trtllm_inter_token_latency_seconds", (), _MS),
                ),
            },
            notes=(
                "Dynamo's trtllm worker re-exports the same names (ai-dynamo 1.6.1 dynamo/trtllm/metrics.py)",
            ),
        ),
        Release(
            "trtllm",
            "Triton tensorrtllm_backend",
            "triton-inference-server/tensorrtllm_backend inflight_batcher_llm custom metrics "
            "(nv_trt_llm_*) and Triton core metrics (nv_inference_*), GitHub",
            {
                "running_requests": _s("nv_trt_llm_request_metrics", request_type=("active",)),
                "queue_depth": _s("nv_trt_llm_request_metrics", request_type=("waiting",)),
                "kv_cache_used_frac": _s(
                    "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type=("fraction",)
                ),
                "prompt_tokens": _s("nv_llm_input_token_len_sum"),
                "output_tokens": _s("nv_llm_output_token_len_sum"),
                "requests_completed": _s("nv_inference_request_success_total"),
                "errors": _s("nv_inference_request_failure_total"),
                "ttft": _s("nv_inference_first_response_histogram_ms", 1.0),
            },
            model_labels=("model",),
            notes=(
                "Triton writes its counters without `_total` (prometheus_client's parser adds it); "
                "TTFT is in ms and only exposed with histogram metrics enabled",
            ),
        ),
    ),
    "dynamo": (
        Release(
            "dynamo",
            "1.6.1",
            "ai-dynamo-runtime 1.6.1 wheel: dynamo/prometheus_names.py (frontend_service, kvstats, "
            "name_prefix); ai-dynamo 1.6.1 wheel: dynamo/common/utils/prometheus.py, "
            "dynamo/trtllm/publisher.py",
            {
                "running_requests": _s("dynamo_frontend_inflight_requests"),
                "queue_depth": _s("dynamo_frontend_queued_requests"),
                "kv_cache_used_frac": _s("dynamo_component_gpu_cache_usage_percent"),
                "prefix_cache_hit_frac": _s("dynamo_component_kv_cache_hit_rate"),
                "prompt_tokens": _s("dynamo_frontend_input_sequence_tokens_sum"),
                "output_tokens": _s("dynamo_frontend_output_tokens_total"),
                "requests_completed": _s("dynamo_frontend_requests_total", status=("success",)),
                "errors": _s("dynamo_frontend_requests_total", status=("error",)),
                "ttft": _s("dynamo_frontend_time_to_first_token_seconds", _MS),
                "tbt": _s("dynamo_frontend_inter_token_latency_seconds", _MS),
            },
            model_labels=("model",),
            notes=(
                "`dynamo_frontend_*` come from the frontend (one per pool), `dynamo_component_*` from "
                "workers; a page without the frontend's request gauges (a worker's own port) is a failed "
                "scrape, since its record would claim an idle node",
                "`gpu_cache_usage_percent` is a 0-1 fraction (active / total blocks, publisher.py)",
            ),
        ),
    ),
}

RUNTIMES: tuple[str, ...] = tuple(RELEASES)

# The serving engine each runtime's records name (``NodeTelemetry.engine``). Dynamo's frontend
# serves a vLLM, SGLang or TensorRT-LLM worker behind it and its metric names do not say which
# (the trtllm worker re-exports the same names as ``trtllm-serve``; the frontend's are its own):
# its records name none unless ``fleetloop scrape --engine`` states it.
ENGINE_OF: dict[str, str | None] = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm", "dynamo": None}


def _carried(names: frozenset[str], present: frozenset[str] | set[str]) -> frozenset[str]:
    """The ``names`` a page carries: a histogram's base name by its ``_bucket`` samples."""
    return frozenset(n for n in names if n in present or f"{n}_bucket" in present)


def unknown_release(candidates: tuple[Release, ...]) -> Release:
    """The label of a page whose names fit each of ``candidates`` (two or more releases of one
    runtime) equally: it says which releases it may be, never picks one."""
    fields: dict[str, tuple[Source, ...]] = {}
    for r in candidates:
        for f, srcs in r.fields.items():
            fields[f] = fields.get(f, ()) + tuple(s for s in srcs if s not in fields.get(f, ()))
    return Release(
        candidates[0].runtime,
        "release unknown: " + " or ".join(r.version for r in candidates),
        "; ".join(r.source for r in candidates),
        fields,
        model_labels=tuple(dict.fromkeys(lb for r in candidates for lb in r.model_labels)),
        candidates=candidates,
    )


def detect(runtime: str, present: frozenset[str] | set[str]) -> Release | None:
    """The release of ``runtime`` whose names ``present`` carries most of; when several carry as
    many (the page lacks the names that tell them apart), an unknown release naming them all; None
    when ``present`` carries none of any release's core names: no evidence it is ``runtime`` at all."""
    releases = RELEASES[runtime]
    if not any(_carried(r.names_of(CORE_FIELDS), present) for r in releases):
        return None
    hits = [len(_carried(r.names(), present)) for r in releases]
    best = tuple(r for r, h in zip(releases, hits, strict=True) if h == max(hits))
    return best[0] if len(best) == 1 else unknown_release(best)


FIELD_LABELS: dict[str, str] = {
    "running_requests": "running_requests",
    "queue_depth": "queue_depth",
    "kv_cache_used_frac": "kv_cache_used_frac",
    "prefix_cache_hit_frac": "prefix_cache_hit_frac (gauge)",
    "prefix_hits": "prefix_cache_hit_frac = Δhits / Δqueries",
    "prefix_queries": "(queries, for the hit rate)",
    "preemptions": "preemptions (Δ)",
    "prompt_tokens": "prompt_tokens (Δ)",
    "output_tokens": "output_tokens (Δ)",
    "requests_completed": "requests_completed (Δ)",
    "errors": "errors (Δ)",
    "timeouts": "timeouts (Δ)",
    "ttft": "ttft_p50_ms, ttft_p99_ms",
    "tbt": "tbt_p50_ms, tbt_p99_ms",
}


def field_table(runtime: str) -> str:
    """The metric -> NodeTelemetry field table (Markdown) of ``runtime``, one column per release.

    docs/integrations/scrape.md carries these tables verbatim; a test fails when they drift."""
    releases = list(RELEASES[runtime])
    head = "| NodeTelemetry field | " + " | ".join(f"{r.runtime} {r.version}" for r in releases) + " |"
    sep = "|---" * (len(releases) + 1) + "|"
    rows = [head, sep]
    for f, label in FIELD_LABELS.items():
        cells = []
        for r in releases:
            srcs = r.fields.get(f, ())
            cells.append(" or ".join(s.describe() for s in srcs) if srcs else "-")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    rows.append("")
    rows.extend(f"- {r.runtime} {r.version}: names read from {r.source}." for r in releases)
    rows.extend(f"- {r.runtime} {r.version}: {note}." for r in releases for note in r.notes)
    return "\n".join(rows)
