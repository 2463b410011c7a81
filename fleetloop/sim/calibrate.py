"""Calibration: the serving-node model against published measurements, with a held-out half.

``python -m fleetloop.sim.calibrate [--held-out] [--json] [--subset] [--out FILE] [--fit]`` runs
the simulator's own :class:`fleetloop.sim.node.Node` (not the formulas) on each measurement's
workload, with the catalog's GPU and model numbers and the runtime profile
(:mod:`fleetloop.perf.engines`) of the engine the source ran, and compares.

The rows, their citations and their split live in ``fleetloop/sim/data/calibration.csv`` (its
header says how each column reads). The split was declared once, before any constant was fitted:
a ``fit`` half and a ``held`` half, alternating within each source. The constants no source states
as a number (the engines' per-request and per-step CPU costs, the GEMM and weight-streaming
efficiencies, the per-layer floors of a step and of an eager one) are fitted by ``--fit`` on the
``fit`` rows only (:func:`fitting_rows` is the one place the fitter takes rows from); the ``held``
rows never enter the fit, and their error is the headline figure.

Output: the default writes ``bench/results/calibration.md`` (every row with its split, and the
figures of each half) and prints it; ``--held-out`` prints the held-out median |error| and the
signed mean of its latency rows, with the fitting half's figures beside them; ``--json`` prints
rows and summaries as JSON; ``--subset`` runs a fast CI subset and writes nothing.

Load shapes, as the sources ran them:

- ``offline N``: N identical requests queued at t=0 (``trtllm-bench throughput``, vLLM's
  throughput benchmark); the metric is output tokens (or requests) / makespan;
- ``batch N``: N identical requests at t=0, mean end-to-end latency (vLLM's latency benchmark);
- ``concurrency C``: C closed-loop clients, each sending its next request when the previous one
  ends (AIPerf, ``vllm bench serve --max-concurrency``); statistics over requests after the first C.
  The clients start spread evenly over one request's lone latency: identical requests sent at once
  stay in lockstep for ever in a deterministic model (every wave's prompts prefill together), while
  a real run's jitter spreads them; the published figures are those spread steady states;
- ``poisson N at R``: N requests at Poisson arrivals of R per second (``bench_serving
  --request-rate``), seeded, statistics over all.

Served rows pay the engine's per-request cost outside the GPU loop (the request reaches the engine
``api_s`` after it was sent); offline rows feed the engine directly and do not.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import heapq
import math
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from fleetloop.perf import catalog
from fleetloop.perf import engines as runtime
from fleetloop.perf.catalog import GPUS, MODELS, NodeSpec, node_spec
from fleetloop.perf.engines import RuntimeProfile
from fleetloop.sim.node import Node, Req

DATA = Path(__file__).resolve().parent / "data" / "calibration.csv"
LATENCY = ("e2e_ms", "ttft_ms", "ttft_p50_ms", "itl_ms", "tpot_p50_ms")
A100_40GB = dataclasses.replace(GPUS["A100"], name="A100-40GB", hbm_gib=40.0, hbm_bytes_per_s=1.555e12)
SPLITS = ("fit", "held", "excluded")
MAX_SOURCE_SHARE = 0.30


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    split: str  # "fit" | "held"
    source: str
    citation: str
    engine: str
    family: str
    served: bool
    model: str
    gpu: str
    gpus: int
    precision: str
    isl: int
    osl: int
    load: str  # offline | batch | concurrency | poisson
    n: int
    rate: float  # poisson arrivals per second (0 otherwise)
    metric: str
    published: float
    kv_share: float | None = None  # the source's KV memory share when it set one
    note: str = ""
    ci: bool = False

    @property
    def hardware(self) -> str:
        return f"{self.gpus}x {self.gpu}"

    @property
    def label(self) -> str:
        return f"{self.id} ({self.engine} {self.family}, {self.metric})"

    @property
    def latency(self) -> bool:
        return self.metric in LATENCY


# The fast CI subset: one or two rows per source and regime.
CI_ROWS = frozenset(
    {
        "trt-8b-h100-128-128",
        "trt-8b-h100-2048-128",
        "trt-70b-h100x2-1000-1000",
        "nim-70b-5000-500-c1-ttft",
        "nim-70b-5000-500-c1-itl",
        "sgl060-sglang-8b-a100-r4-ttft",
        "sgl060-vllm-8b-a100-r4-ttft",
        "vllmci-8b-h200-latency",
        "ibench-8b-h100-c1-tpot",
        "ibench-8b-h100-c1-ttft",
        "musgrave-8b-a100-c1-itl",
    }
)


class CalibrationDataError(ValueError):
    """The data file breaks its own rules (one line naming the row)."""


def load_rows(path: Path = DATA, *, excluded: bool = False) -> list[Row]:
    """The rows of the data file, checked (a known model, GPU, engine profile, split and metric);
    ``excluded`` rows (kept in the file with their reason) only when asked for."""
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln and not ln.startswith("#")]
    rows: list[Row] = []
    for rec in csv.DictReader(lines):
        rid = rec["id"]
        try:
            row = Row(
                id=rid,
                split=rec["split"],
                source=rec["source"],
                citation=rec["citation"],
                engine=rec["engine"],
                family=rec["family"],
                served=rec["served"] == "1",
                model=rec["model"],
                gpu=rec["gpu"],
                gpus=int(rec["gpus"]),
                precision=rec["precision"],
                isl=int(rec["isl"]),
                osl=int(rec["osl"]),
                load=rec["load"],
                n=int(rec["n"]),
                rate=float(rec["rate"] or 0.0),
                metric=rec["metric"],
                published=float(rec["published"]),
                kv_share=float(rec["kv_share"]) if rec["kv_share"] else None,
                note=rec["note"] or "",
                ci=rid in CI_ROWS,
            )
        except (KeyError, ValueError) as exc:
            raise CalibrationDataError(f"{path}: row {rid}: {exc}") from None
        problems = [
            row.split not in SPLITS and f"split {row.split!r}",
            row.model not in MODELS and f"model {row.model!r}",
            row.gpu not in (*GPUS, "A100-40GB") and f"gpu {row.gpu!r}",
            (row.engine, row.family) not in runtime.PROFILES and f"engine {row.engine} {row.family}",
            row.metric not in (*LATENCY, "out_tok_s", "req_s") and f"metric {row.metric!r}",
            row.load not in ("offline", "batch", "concurrency", "poisson") and f"load {row.load!r}",
            row.load == "poisson" and row.rate <= 0 and "poisson without a rate",
            row.published <= 0 and "published <= 0",
        ]
        bad = [p for p in problems if p]
        if bad:
            raise CalibrationDataError(f"{path}: row {rid}: {', '.join(bad)}")
        if row.split != "excluded" or excluded:
            rows.append(row)
    return rows


ROWS: tuple[Row, ...] = tuple(load_rows())
EXCLUDED: tuple[Row, ...] = tuple(r for r in load_rows(excluded=True) if r.split == "excluded")


def fitting_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows constants may be fitted on: the declared ``fit`` half, nothing else."""
    return [r for r in rows if r.split == "fit"]


def held_out_rows(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r.split == "held"]


# -- the constants ---------------------------------------------------------------------------------


_PHYSICS = ("engine_eff", "decode_bw_util", "kv_bw_util", "layer_s", "roof_p", "eager_layer_s")


@dataclass(frozen=True, slots=True)
class Constants:
    """What the fit moves: the catalog's two efficiencies and the runtime profiles' fitted costs."""

    engine_eff: float
    decode_bw_util: float
    kv_bw_util: float
    layer_s: float
    roof_p: float
    eager_layer_s: float
    fit: tuple[tuple[str, float], ...]  # runtime.FIT's keys and values

    @staticmethod
    def committed() -> Constants:
        return Constants(
            catalog.ENGINE_EFF,
            catalog.DECODE_BW_UTIL,
            catalog.KV_BW_UTIL,
            catalog.LAYER_S,
            catalog.ROOF_P,
            catalog.EAGER_LAYER_S,
            tuple(sorted(runtime.FIT.items())),
        )

    def get(self, key: str) -> float:
        if key in _PHYSICS:
            return float(getattr(self, key))
        return dict(self.fit)[key]

    def with_value(self, key: str, value: float) -> Constants:
        if key == "engine_eff":
            return dataclasses.replace(self, engine_eff=value)
        if key == "decode_bw_util":
            return dataclasses.replace(self, decode_bw_util=value)
        if key == "kv_bw_util":
            return dataclasses.replace(self, kv_bw_util=value)
        if key == "layer_s":
            return dataclasses.replace(self, layer_s=value)
        if key == "roof_p":
            return dataclasses.replace(self, roof_p=value)
        if key == "eager_layer_s":
            return dataclasses.replace(self, eager_layer_s=value)
        fit = dict(self.fit)
        fit[key] = value
        return dataclasses.replace(self, fit=tuple(sorted(fit.items())))

    def names(self) -> list[str]:
        return [*_PHYSICS, *(k for k, _ in self.fit)]

    def profile(self, engine: str, family: str) -> RuntimeProfile:
        base = runtime.profile(engine, family)
        fit = dict(self.fit)
        return dataclasses.replace(
            base,
            api_s=fit[f"{engine} {family} api_s"],
            step_s=fit[f"{engine} {family} step_s"],
            admit_s=fit["admit_s"],
        )


@contextlib.contextmanager
def _physics(c: Constants) -> Iterator[None]:
    """Run with the catalog's efficiencies set to ``c``'s (the fit's candidates), then restore."""
    names = ("ENGINE_EFF", "DECODE_BW_UTIL", "KV_BW_UTIL", "LAYER_S", "ROOF_P", "EAGER_LAYER_S")
    saved = [getattr(catalog, n) for n in names]
    values = (c.engine_eff, c.decode_bw_util, c.kv_bw_util, c.layer_s, c.roof_p, c.eager_layer_s)
    for n, v in zip(names, values, strict=True):
        setattr(catalog, n, v)
    try:
        yield
    finally:
        for n, v in zip(names, saved, strict=True):
            setattr(catalog, n, v)


# -- simulating one row ----------------------------------------------------------------------------


class _Sink:
    """Listener and event loop for one node (no fleet, no router): node events and arrivals."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, Req | None]] = []
        self.seq = 0
        self.first: dict[int, float] = {}
        self.finish: dict[int, float] = {}
        self.on_done: Callable[[Req, float], None] | None = None

    def schedule(self, t: float, node: Node, version: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, version, None))

    def arrive(self, t: float, req: Req) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, -1, req))

    def on_first_token(self, req: Req, t: float) -> None:
        self.first[req.rid] = t

    def on_finish(self, req: Req, t: float) -> None:
        self.finish[req.rid] = t
        if self.on_done is not None:
            self.on_done(req, t)

    def on_lost(self, req: Req, t: float) -> None:
        raise RuntimeError(f"calibration request {req.rid} lost (prompt {req.prompt} exceeds the KV cache?)")

    def on_waste(self, req: Req, usd: float) -> None:
        pass


def row_spec(row: Row) -> NodeSpec:
    if row.gpu == "A100-40GB":
        return NodeSpec(MODELS[row.model], A100_40GB, row.gpus, row.precision)
    return node_spec(row.model, row.gpu, row.gpus, row.precision)


def _node(row: Row, sink: _Sink, prof: RuntimeProfile) -> Node:
    spec = row_spec(row)
    if row.kv_share is not None:  # the source set its own KV share
        prof = dataclasses.replace(prof, kv_share=(row.kv_share, row.kv_share))
    offline = not row.served
    return Node("cal/0", "cal", spec, sink, sink.schedule, now=0.0, warm=True, runtime=prof, offline=offline)


class _Start(Req):
    """A closed-loop client's first send (an event, not a request)."""

    def __init__(self) -> None:
        super().__init__(0, 0, 0, None, 0)


def _drain(node: Node, sink: _Sink, on_start: Callable[[float], None] | None = None) -> float:
    now = 0.0
    while sink.heap:
        now, _, version, req = heapq.heappop(sink.heap)
        if isinstance(req, _Start):
            assert on_start is not None
            on_start(now)
        elif req is not None:
            node.submit(req, now)
        else:
            node.on_event(now, version)
    return now


def _lone_latency(row: Row, prof: RuntimeProfile) -> float:
    """One request's end-to-end time on an idle node (served: with the engine's per-request cost)."""
    sink = _Sink()
    node = _node(row, sink, prof)
    node.submit(Req(1, row.isl, row.osl, None, 0), 0.0)
    end = _drain(node, sink)
    return end + (prof.api_s if row.served else 0.0)


def _metric(row: Row, rids: Sequence[int], start: dict[int, float], sink: _Sink) -> float:
    m = row.metric
    if m in ("ttft_ms", "ttft_p50_ms"):
        vals = [sink.first[r] - start[r] for r in rids]
        return (statistics.median(vals) if m == "ttft_p50_ms" else statistics.fmean(vals)) * 1000.0
    if m in ("itl_ms", "tpot_p50_ms"):
        vals = [(sink.finish[r] - sink.first[r]) / (row.osl - 1) for r in rids]
        return (statistics.median(vals) if m == "tpot_p50_ms" else statistics.fmean(vals)) * 1000.0
    if m == "e2e_ms":
        return statistics.fmean(sink.finish[r] - start[r] for r in rids) * 1000.0
    span = max(sink.finish[r] for r in rids) - min(start[r] for r in rids)
    return len(rids) * (row.osl if m == "out_tok_s" else 1) / span


def simulate(row: Row, constants: Constants | None = None) -> float:
    """The simulated value of ``row.metric`` on ``row``'s workload (with ``constants``, else the
    committed ones)."""
    c = constants if constants is not None else Constants.committed()
    with _physics(c):
        return _simulate(row, c.profile(row.engine, row.family))


def _simulate(row: Row, prof: RuntimeProfile) -> float:
    sink = _Sink()
    node = _node(row, sink, prof)
    delay = prof.api_s if row.served else 0.0
    start: dict[int, float] = {}

    def send(rid: int, t: float) -> None:
        start[rid] = t
        req = Req(rid, row.isl, row.osl, None, 0)
        if delay > 0:
            sink.arrive(t + delay, req)
        else:
            node.submit(req, t)

    if row.load in ("offline", "batch"):
        for i in range(row.n):
            send(i + 1, 0.0)
        end = _drain(node, sink)
        rids = list(range(1, row.n + 1))
        if row.load == "batch" and row.metric == "e2e_ms":
            return max(sink.finish[r] for r in rids) * 1000.0
        if row.metric in ("out_tok_s", "req_s"):
            return row.n * (row.osl if row.metric == "out_tok_s" else 1) / end
        return _metric(row, rids, start, sink)
    if row.load == "poisson":
        rng = np.random.default_rng(0)
        gaps = rng.exponential(1.0 / row.rate, row.n)
        t = 0.0
        for i, g in enumerate(gaps):
            t += float(g)
            sink.arrive(t + delay, Req(i + 1, row.isl, row.osl, None, 0))
            start[i + 1] = t
        _drain(node, sink)
        return _metric(row, list(range(1, row.n + 1)), start, sink)
    # closed loop: C clients
    total = max(6 * row.n, 24)
    state = {"next": 0}

    def next_call(t: float) -> None:
        if state["next"] >= total:
            return
        state["next"] += 1
        send(state["next"], t)

    sink.on_done = lambda _req, t: next_call(t)
    # Clients start spread over one request's lone latency: a real run's jitter (network, step
    # times) breaks the lockstep that C identical requests sent at once would keep for ever in a
    # deterministic model, and the published figures are those steady states.
    lone = _lone_latency(row, prof) if row.n > 1 else 0.0
    for i in range(row.n):
        sink.arrive(i * lone / row.n, _Start())
    _drain(node, sink, on_start=next_call)
    return _metric(row, list(range(row.n + 1, total + 1)), start, sink)


@dataclass(frozen=True, slots=True)
class Result:
    row: Row
    simulated: float

    @property
    def error(self) -> float:
        return (self.simulated - self.row.published) / self.row.published


def run_rows(rows: Sequence[Row], constants: Constants | None = None) -> list[Result]:
    return [Result(r, simulate(r, constants)) for r in rows]


def summary(results: Sequence[Result]) -> dict[str, Any]:
    errs = [r.error for r in results]
    lat = [r.error for r in results if r.row.latency]
    return {
        "rows": len(results),
        "sources": len({r.row.source for r in results}),
        "median_abs_error": statistics.median(abs(e) for e in errs) if errs else 0.0,
        "mean_signed_error": statistics.fmean(errs) if errs else 0.0,
        "latency_rows": len(lat),
        "latency_over": sum(1 for e in lat if e > 0),
        "latency_under": sum(1 for e in lat if e < 0),
        "latency_mean_signed_error": statistics.fmean(lat) if lat else 0.0,
        "latency_median_signed_error": statistics.median(lat) if lat else 0.0,
    }


def halves(results: Sequence[Result]) -> dict[str, dict[str, Any]]:
    return {
        "held_out": summary([r for r in results if r.row.split == "held"]),
        "fitting": summary([r for r in results if r.row.split == "fit"]),
        "all": summary(results),
    }


# -- the fit ---------------------------------------------------------------------------------------

# The coordinate search's multiplicative steps: each constant moves up (or, if up does not help,
# down) by growing factors while the objective improves.
_STEPS = (1.03, 1.1, 1.25, 1.6, 2.5)
_CAPPED = {"engine_eff": 1.0, "decode_bw_util": 0.95, "kv_bw_util": 0.95}
_FLOOR = 1e-5  # a time constant moves multiplicatively; below this it could never come back
_FLOORS = {"roof_p": 1.5}


def objective(results: Sequence[Result]) -> float:
    """Mean |log(simulated / published)|: symmetric in over and under, no row dominates."""
    return statistics.fmean(abs(math.log(r.simulated / r.row.published)) for r in results)


def fit(
    rows: Sequence[Row],
    start: Constants | None = None,
    *,
    passes: int = 8,
    simulate_fn: Callable[[Row, Constants], float] | None = None,
) -> tuple[Constants, float]:
    """Coordinate search over every fitted constant, on :func:`fitting_rows` of ``rows`` only."""
    sim = simulate_fn if simulate_fn is not None else simulate
    train = fitting_rows(rows)
    best = start if start is not None else Constants.committed()
    memo: dict[tuple[str, tuple[float, ...]], float] = {}

    def row_value(r: Row, c: Constants) -> float:
        # A row depends on the physics, admit_s and its own profile's costs (api_s if served):
        # a candidate that moves none of those reuses the row's last value.
        keys = [*_PHYSICS, "admit_s", f"{r.engine} {r.family} step_s"]
        if r.served:
            keys.append(f"{r.engine} {r.family} api_s")
        k = (r.id, tuple(c.get(x) for x in keys))
        if k not in memo:
            memo[k] = sim(r, c)
        return memo[k]

    def score(c: Constants) -> float:
        return objective([Result(r, row_value(r, c)) for r in train])

    best_score = score(best)
    for _ in range(passes):  # until a pass moves nothing
        before = best
        for key in best.names():
            for direction in (1.0, -1.0):
                moved = False
                for step in _STEPS:
                    cur = best.get(key)
                    factor = step if direction > 0 else 1.0 / step
                    floor = _FLOORS.get(key, _FLOOR if key.endswith("_s") else 0.0)
                    value = max(floor, min(cur * factor, _CAPPED.get(key, math.inf)))
                    if value == cur:
                        break
                    cand = best.with_value(key, value)
                    s = score(cand)
                    if s >= best_score - 1e-12:
                        break
                    best, best_score, moved = cand, s, True
                if moved:
                    break
        if best == before:
            break
    return best, best_score


# -- output ----------------------------------------------------------------------------------------


def _fmt(s: dict[str, Any]) -> str:
    return (
        f"{s['rows']} rows from {s['sources']} sources: median |error| {s['median_abs_error']:.1%}, "
        f"latency rows ({s['latency_rows']}) signed mean {s['latency_mean_signed_error']:+.1%}"
    )


def render(results: Sequence[Result]) -> str:
    h = halves(results)
    lines = [
        "# Calibration: the node model against published measurements",
        "",
        "Written by `python -m fleetloop.sim.calibrate`. Each row runs `fleetloop.sim.node.Node` with the",
        "runtime profile of the engine the source ran (rows, citations and the split:",
        "`fleetloop/sim/data/calibration.csv`; load shapes: `fleetloop/sim/calibrate.py`).",
        "Error = (simulated - published) / published. Throughput is output tokens/s (req/s where",
        "noted); latencies are ms. Constants were fitted on the `fit` rows only; `held` rows never",
        "entered the fit.",
        "",
        f"**Held-out half: {_fmt(h['held_out'])}.**",
        "",
        f"Fitting half: {_fmt(h['fitting'])}.",
        "",
        f"All rows: {_fmt(h['all'])}.",
        "",
        "Excluded (kept in the data file with the reason, in neither half): "
        + (", ".join(f"`{r.id}`" for r in EXCLUDED) or "none")
        + ".",
        "",
        "| id | split | source | engine | model | hardware | prec | ISL/OSL | load | metric "
        "| published | simulated | error |",
        "|---|---|---|---|---|---|---|---|---|---|--:|--:|--:|",
    ]
    for r in results:
        row = r.row
        load = f"{row.load} {row.n}" + (f" @ {row.rate:g}/s" if row.load == "poisson" else "")
        lines.append(
            f"| {row.id} | {row.split} | {row.source} | {row.engine} {row.family} | {row.model} "
            f"| {row.hardware} | {row.precision} | {row.isl}/{row.osl} | {load} | {row.metric} "
            f"| {row.published:,.2f} | {r.simulated:,.2f} | {r.error:+.1%} |"
        )
    lines.append("")
    return "\n".join(lines)


def render_held_out(results: Sequence[Result]) -> str:
    h = halves(results)
    ho, fi = h["held_out"], h["fitting"]
    return "\n".join(
        [
            f"held-out median |error|: {ho['median_abs_error']:.1%} over {ho['rows']} rows "
            f"from {ho['sources']} sources",
            f"held-out latency rows: signed mean {ho['latency_mean_signed_error']:+.1%} over "
            f"{ho['latency_rows']} rows ({ho['latency_over']} above published, {ho['latency_under']} below)",
            f"fitting half: median |error| {fi['median_abs_error']:.1%} over {fi['rows']} rows; latency "
            f"signed mean {fi['latency_mean_signed_error']:+.1%} over {fi['latency_rows']} rows",
            "",
        ]
    )


def _fit_lines(c: Constants, score: float) -> str:
    out = [f"# fitted on {len(fitting_rows(ROWS))} fitting rows, objective {score:.4f}"]
    out.append(f"ENGINE_EFF = {c.engine_eff:.4g}")
    out.append(f"DECODE_BW_UTIL = {c.decode_bw_util:.4g}")
    out.append(f"KV_BW_UTIL = {c.kv_bw_util:.4g}")
    out.append(f"LAYER_S = {c.layer_s:.4g}")
    out.append(f"ROOF_P = {c.roof_p:.4g}")
    out.append(f"EAGER_LAYER_S = {c.eager_layer_s:.4g}")
    out.extend(f'    "{k}": {v:.4g},' for k, v in c.fit)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleetloop.sim.calibrate", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--out", default="bench/results/calibration.md", help="markdown output (default: %(default)s)"
    )
    ap.add_argument("--json", action="store_true", help="print the rows and summaries as JSON")
    ap.add_argument(
        "--held-out", action="store_true", help="print the held-out half's figures (and the fitting half's)"
    )
    ap.add_argument("--subset", action="store_true", help="only the fast CI subset (writes nothing)")
    ap.add_argument(
        "--fit", action="store_true", help="fit the constants on the fitting half and print them (slow)"
    )
    args = ap.parse_args(argv)
    if args.fit:
        c, score = fit(ROWS)
        sys.stdout.write(_fit_lines(c, score))
        return 0
    rows = [r for r in ROWS if r.ci] if args.subset else list(ROWS)
    results = run_rows(rows)
    if args.json:
        data = {
            "rows": [
                {**dataclasses.asdict(r.row), "simulated": r.simulated, "error": r.error} for r in results
            ],
            "summary": halves(results),
        }
        sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif args.held_out:
        sys.stdout.write(render_held_out(results))
    else:
        sys.stdout.write(render(results))
    if not args.subset and not args.held_out and not args.json:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
