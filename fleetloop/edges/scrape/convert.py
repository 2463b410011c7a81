"""Two scrapes of one target -> one ``NodeTelemetry`` (pure: no I/O, no clock; times come in).

- **Parsing** (:func:`parse_exposition`) reads what prometheus_client's text parser reads, to the
  same samples: the pages runtimes write through
  :func:`~fleetloop.edges.scrape.textformat.fast_samples` (a vLLM page in about a twelfth of the
  time), anything it is not sure of through prometheus_client's parser itself. A page
  prometheus_client refuses is an :class:`ExpositionError` (the caller counts and logs it; nothing
  else happens).
- **Gauges** are taken as they are (NaN ignored, fractions clamped to [0, 1]).
- **Counters**: the increase since the previous scrape, per series, summed. A series whose value
  went down was reset (the engine restarted): its increase is its current value, as Prometheus'
  ``increase()`` assumes, never a negative rate. A changed ``process_start_time_seconds`` marks
  every series reset. A series that appears after the first scrape starts from zero (runtimes
  create labelled series lazily, on their first event).
- **Histograms** (TTFT, TBT): bucket increases since the previous scrape, summed over series, give
  the interval's distribution; p50 and p99 are read from it as Prometheus' ``histogram_quantile``
  does: find the first bucket whose cumulative count reaches ``q x total`` and interpolate linearly
  between its lower and upper bound (the lower bound of the first bucket is 0). **Error bound**:
  the true quantile lies in that bucket, so the error is at most the bucket's width (for vLLM's
  TTFT buckets, 0.25 s between 0.25 s and 0.5 s, 1.5 s between 1 s and 2.5 s); linear interpolation
  assumes requests spread evenly inside the bucket. A quantile in the ``+Inf`` bucket is reported
  as the highest finite bound (a lower bound of the truth). No request in the interval: ``None``.
- **Another server's page** (none of the runtime's core names: node_exporter, another runtime), a
  page without both request gauges (the record would claim an idle node) and one without the KV-cache
  gauge (it would claim an empty cache, which routing and autoscaling read as room) are a
  :class:`MissingMetrics`: no record, and the baseline stays the last page that was read.
- **An unknown release** (the page's names fit several releases equally, see
  :func:`~fleetloop.edges.scrape.runtimes.detect`): a field is read only when every candidate
  release reads it from the same series of the page at the same scale (or none reads it). When they
  would read a field the page carries differently (V1 counts ``finished_reason=abort`` as a
  timeout, the V0 mapping as completed), picking one would invent the value: a
  :class:`MissingMetrics` too.
- **The first scrape** of a target publishes nothing: it is the baseline every increase needs, and a
  record with zero counters would claim a rate nobody measured. So does the first scrape after a
  gap longer than ``MAX_INTERVAL_MS``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from fleetloop.edges.scrape.runtimes import (
    ENGINE_OF,
    FIELD_KINDS,
    LOAD_FIELDS,
    RELEASES,
    Release,
    Source,
    detect,
)
from fleetloop.edges.scrape.textformat import fast_samples
from fleetloop.schemas.telemetry import NodeTelemetry

MAX_INTERVAL_MS = 600_000  # NodeTelemetry.interval_ms's bound
PROCESS_START = "process_start_time_seconds"
_BAD_IDENT = re.compile(r"[^A-Za-z0-9_.:/@-]")

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


class ExpositionError(ValueError):
    """The text is not Prometheus exposition format (what the parser said, in one line)."""


class ConversionError(ValueError):
    """The exposition parsed but its values cannot make a valid NodeTelemetry."""


class MissingMetrics(ConversionError):
    """The exposition parsed but lacks the names a record needs: ``no vllm metrics`` (another server's
    page), ``no vllm request gauges (...)`` (the runtime's, but a record would claim an idle node) or
    ``vllm release unknown: ...: they read ... differently`` (any reading would be a guess).
    ``hint`` says what the user may have got wrong."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True, slots=True)
class Exposition:
    """One parsed scrape: sample name -> [(labels, value)]."""

    samples: dict[str, list[tuple[dict[str, str], float]]]

    def names(self) -> frozenset[str]:
        return frozenset(self.samples)


def parse_exposition(text: str) -> Exposition:
    fast = fast_samples(text)
    if fast is not None:
        return Exposition(fast)
    return slow_exposition(text)


def slow_exposition(text: str) -> Exposition:
    """:func:`parse_exposition` by prometheus_client's parser alone (what the fast reader must match)."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except Exception as exc:  # the parser raises ValueError, IndexError, ... on bad text
        msg = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ExpositionError(f"not Prometheus exposition text: {msg}") from None
    return Exposition(samples)


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """What the metrics do not say about a node: who it is, what it runs on, what it costs."""

    node_id: str
    pool_id: str
    model: str | None = None  # None: the runtime's model label
    gpu_type: str = "unknown"
    gpu_count: int = 1
    usd_per_h: float = 0.0
    kv_gib: float = 0.0  # KV-cache memory: hbm_free_gib = kv_gib x (1 - kv_cache_used_frac)
    engine: str | None = None  # None: the runtime's own engine (runtimes.ENGINE_OF)


def bucket_quantile(q: float, cumulative: list[tuple[float, float]]) -> float | None:
    """``histogram_quantile(q)`` over ``(upper bound, cumulative count)`` sorted by bound (last: +Inf)."""
    if not cumulative:
        return None
    total = cumulative[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lo_b, lo_c = 0.0, 0.0
    for ub, c in cumulative:
        if c >= rank:
            if math.isinf(ub):
                return lo_b
            if c <= lo_c:
                return ub
            return lo_b + (ub - lo_b) * (rank - lo_c) / (c - lo_c)
        lo_b, lo_c = ub, c
    return lo_b


def _key(name: str, labels: dict[str, str]) -> SeriesKey:
    return name, tuple(sorted(labels.items()))


def _present(expo: Exposition, src: Source) -> bool:
    return src.name in expo.samples or f"{src.name}_bucket" in expo.samples


def _first_present(expo: Exposition, sources: tuple[Source, ...]) -> Source | None:
    return next((s for s in sources if _present(expo, s)), None)


def _series(expo: Exposition, src: Source) -> frozenset[SeriesKey]:
    """The series of the page ``src`` reads (a histogram's by its ``_bucket`` samples)."""
    name = src.name if src.name in expo.samples else f"{src.name}_bucket"
    return frozenset(_key(name, labels) for labels, _ in expo.samples.get(name, ()) if src.matches(labels))


def read_plan(expo: Exposition, release: Release) -> tuple[dict[str, Source], tuple[str, ...]]:
    """Which source each field is read from on this page, and the fields an unknown release's
    candidates would read differently from it (those are read from nothing)."""
    if not release.candidates:
        plan = {f: s for f, srcs in release.fields.items() if (s := _first_present(expo, srcs)) is not None}
        return plan, ()
    plan = {}
    disputed: list[str] = []
    for f in FIELD_KINDS:
        readings: set[tuple[frozenset[SeriesKey], float] | None] = set()
        chosen: Source | None = None
        for r in release.candidates:
            src = _first_present(expo, r.fields.get(f, ()))
            series = _series(expo, src) if src is not None else frozenset()
            readings.add((series, src.scale) if src is not None and series else None)
            if src is not None and series and chosen is None:
                chosen = src
        if len(readings) > 1:
            disputed.append(f)
        elif chosen is not None:
            plan[f] = chosen
    return plan, tuple(disputed)


def _finite(v: float) -> bool:
    return not (math.isnan(v) or math.isinf(v))


@dataclass(slots=True)
class _State:
    counters: dict[SeriesKey, float] = field(default_factory=dict)
    buckets: dict[SeriesKey, dict[float, float]] = field(default_factory=dict)
    mono_ms: int | None = None
    process_start: float | None = None


class Converter:
    """Scrapes of one target in, NodeTelemetry out. ``release`` is what the last scrape looked like."""

    def __init__(self, runtime: str, identity: NodeIdentity) -> None:
        if runtime not in RELEASES:
            raise ValueError(f"unknown runtime {runtime!r}; known: {', '.join(RELEASES)}")
        self.runtime = runtime
        self.identity = identity
        self.release: Release | None = None
        self.resets = 0  # counter resets seen (engine restarts)
        self._st = _State()

    def update(self, expo: Exposition, *, ts_ms: int, mono_ms: int) -> NodeTelemetry | None:
        """Fold one scrape taken at ``ts_ms`` (wall, event time) / ``mono_ms`` (monotonic)."""
        release = detect(self.runtime, expo.names())
        self.release = release
        if release is None:
            raise MissingMetrics(f"no {self.runtime} metrics", f"is this a {self.runtime} server?")
        load = release.names_of(LOAD_FIELDS)
        if not load & expo.names():
            raise MissingMetrics(
                f"no {self.runtime} request gauges ({', '.join(sorted(load))})",
                "a record would claim an idle node",
            )
        kv = release.names_of(("kv_cache_used_frac",))
        if kv and not kv & expo.names():
            raise MissingMetrics(
                f"no {self.runtime} KV-cache gauge ({', '.join(sorted(kv))})",
                "a record would claim an empty KV cache",
            )
        plan, disputed = read_plan(expo, release)
        if disputed:
            raise MissingMetrics(
                f"{self.runtime} {release.version}: they read {', '.join(disputed)} differently",
                "the page lacks the names that tell those releases apart",
            )
        st = self._st
        start = self._process_start(expo)
        restarted = st.process_start is not None and start is not None and start != st.process_start
        if restarted:
            self.resets += 1
        baseline = st.mono_ms is None or mono_ms - st.mono_ms > MAX_INTERVAL_MS or mono_ms <= st.mono_ms
        interval_ms = 0 if st.mono_ms is None else mono_ms - st.mono_ms
        values: dict[str, float] = {}
        hists: dict[str, list[tuple[float, float]]] = {}
        new_counters: dict[SeriesKey, float] = {}
        new_buckets: dict[SeriesKey, dict[float, float]] = {}
        for fname, src in plan.items():
            kind = FIELD_KINDS[fname]
            if kind in {"gauge_sum", "gauge_max"}:
                g = self._gauge(expo, src, kind)
                if g is not None:
                    values[fname] = g
            elif kind == "counter":
                values[fname] = self._counter(expo, src, new_counters, reset_all=restarted)
            else:
                hists[fname] = self._histogram(expo, src, new_buckets, reset_all=restarted)
        st.counters.update(new_counters)
        st.buckets.update(new_buckets)
        st.mono_ms = mono_ms
        st.process_start = start if start is not None else st.process_start
        if baseline:
            return None
        return self._record(expo, release, values, hists, ts_ms=ts_ms, interval_ms=interval_ms)

    # -- folding ----------------------------------------------------------------------------------

    @staticmethod
    def _process_start(expo: Exposition) -> float | None:
        rows = expo.samples.get(PROCESS_START)
        return rows[0][1] if rows else None

    @staticmethod
    def _gauge(expo: Exposition, src: Source, kind: str) -> float | None:
        vals = [v * src.scale for labels, v in expo.samples[src.name] if src.matches(labels) and _finite(v)]
        if not vals:
            return None
        return max(vals) if kind == "gauge_max" else sum(vals)

    def _counter(
        self, expo: Exposition, src: Source, out: dict[SeriesKey, float], *, reset_all: bool
    ) -> float:
        total = 0.0
        for labels, v in expo.samples.get(src.name, ()):
            if not src.matches(labels) or not _finite(v) or v < 0:
                continue
            key = _key(src.name, labels)
            prev = self._st.counters.get(key)
            if prev is None or reset_all:
                inc = v if self._st.mono_ms is not None else 0.0
            elif v < prev:
                self.resets += 1
                inc = v
            else:
                inc = v - prev
            out[key] = v
            total += inc
        return total * src.scale

    def _histogram(
        self, expo: Exposition, src: Source, out: dict[SeriesKey, dict[float, float]], *, reset_all: bool
    ) -> list[tuple[float, float]]:
        series: dict[SeriesKey, dict[float, float]] = {}
        for labels, v in expo.samples.get(f"{src.name}_bucket", ()):
            le_text = labels.get("le")
            if le_text is None or not src.matches(labels) or math.isnan(v) or v < 0:
                continue
            try:
                le = float(le_text)
            except ValueError:
                continue
            rest = {k: val for k, val in labels.items() if k != "le"}
            series.setdefault(_key(src.name, rest), {})[le] = v
        summed: dict[float, float] = {}
        for key, cur in series.items():
            prev = self._st.buckets.get(key)
            inf_now = cur.get(math.inf, max(cur.values(), default=0.0))
            if prev is None or reset_all:
                delta = dict(cur) if self._st.mono_ms is not None else {}
            elif inf_now < prev.get(math.inf, 0.0):
                self.resets += 1
                delta = dict(cur)
            else:
                delta = {le: max(0.0, c - prev.get(le, 0.0)) for le, c in cur.items()}
            out[key] = cur
            for le, c in delta.items():
                summed[le] = summed.get(le, 0.0) + c
        cumulative: list[tuple[float, float]] = []
        running = 0.0
        for le in sorted(summed):
            running = max(running, summed[le])  # cumulative counts never go down
            cumulative.append((le * src.scale if not math.isinf(le) else le, running))
        return cumulative

    # -- the record -------------------------------------------------------------------------------

    def _model(self, expo: Exposition, release: Release) -> str:
        if self.identity.model:
            return self.identity.model
        for name in sorted(release.names()):
            for labels, _ in expo.samples.get(name, ()) or expo.samples.get(f"{name}_bucket", ()):
                for label in release.model_labels:
                    val = labels.get(label)
                    if val:
                        return _BAD_IDENT.sub("-", val)[:200].lstrip("-_.:/@") or "unknown"
        return "unknown"

    def _record(
        self,
        expo: Exposition,
        release: Release,
        values: dict[str, float],
        hists: dict[str, list[tuple[float, float]]],
        *,
        ts_ms: int,
        interval_ms: int,
    ) -> NodeTelemetry:
        ident = self.identity
        kv = min(1.0, max(0.0, values.get("kv_cache_used_frac", 0.0)))
        if "prefix_queries" in values:
            q = values["prefix_queries"]
            hit = min(1.0, max(0.0, values.get("prefix_hits", 0.0) / q)) if q > 0 else 0.0
        else:
            hit = min(1.0, max(0.0, values.get("prefix_cache_hit_frac", 0.0)))
        running = max(0, round(values.get("running_requests", 0.0)))

        def count(f: str) -> int:
            return max(0, round(values.get(f, 0.0)))

        def pct(f: str, q: float) -> float | None:
            v = bucket_quantile(q, hists.get(f, []))
            return None if v is None else round(v, 3)

        try:
            return NodeTelemetry(
                ts_ms=ts_ms,
                node_id=ident.node_id,
                pool_id=ident.pool_id,
                model=self._model(expo, release),
                gpu_type=ident.gpu_type,
                gpu_count=ident.gpu_count,
                weights_state="warm",
                interval_ms=max(1, min(MAX_INTERVAL_MS, interval_ms)),
                ttft_p50_ms=pct("ttft", 0.5),
                ttft_p99_ms=pct("ttft", 0.99),
                tbt_p50_ms=pct("tbt", 0.5),
                tbt_p99_ms=pct("tbt", 0.99),
                queue_depth=max(0, round(values.get("queue_depth", 0.0))),
                running_requests=running,
                kv_cache_used_frac=round(kv, 6),
                hbm_free_gib=round(ident.kv_gib * (1.0 - kv), 3),
                gpu_util_frac=1.0 if running > 0 else 0.0,
                prefix_cache_hit_frac=round(hit, 6),
                errors=count("errors"),
                timeouts=count("timeouts"),
                preemptions=count("preemptions"),
                requests_completed=count("requests_completed"),
                prompt_tokens=count("prompt_tokens"),
                output_tokens=count("output_tokens"),
                cost_rate_usd_per_h=ident.usd_per_h,
                engine=ident.engine if ident.engine is not None else ENGINE_OF[self.runtime],
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ConversionError(f"{where}: {first['msg']}") from None
