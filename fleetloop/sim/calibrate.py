"""Calibration: the serving-node model against published measurements it was not fitted to.

``python -m fleetloop.sim.calibrate [--out FILE] [--json] [--subset]`` runs the simulator's own
:class:`fleetloop.sim.node.Node` (not the formulas) on each measurement's workload, with the
catalog's GPU and model numbers and the engine settings the source used, and writes
``bench/results/calibration.md``: published, simulated and signed error per row, the median
absolute error, and the sign balance of the latency rows (a model that is always fast flatters any
control plane that runs nodes hot).

Load shapes, as the sources ran them:

- ``offline N``: N identical requests queued at t=0 (``trtllm-bench throughput``: "requests at an
  infinite rate"); the metric is total output tokens / makespan;
- ``batch N``: N identical requests at t=0, metric over those N (vLLM's latency benchmark);
- ``concurrency C``: C closed-loop clients, each sending its next request when the previous one
  ends (genai-perf / AIPerf, InferenceBench sweeps); statistics over requests after the first C
  (the synchronized start), TTFT and ITL as means over requests, ITL = (end - first token) /
  (output - 1).

Sources (every row names its own; engine settings follow the source's documented defaults):

- **TRT-LLM**: NVIDIA TensorRT-LLM "Performance Overview", Llama 3.1 8B / 3.3 70B / 3.1 405B FP8
  tables (nvidia/*-FP8 ModelOpt checkpoints, FP8 KV cache), ``trtllm-bench throughput``, PyTorch
  backend, TensorRT-LLM 1.0 docs (github.com/NVIDIA/TensorRT-LLM,
  docs/source/performance/perf-overview.md); H100 SXM 80GB (DGX H100) and H200 SXM 141GB (DGX
  H200). Engine: ``max_batch_size`` 2048 and ``max_num_tokens`` 8192 (the LLM API defaults),
  ``kv_cache_free_gpu_mem_fraction`` 0.95 (the page says most runs used it).
- **NIM**: NVIDIA NIM LLM benchmarking guide, "Performance" (docs.nvidia.com/nim/benchmarking/llm/
  1.0.0/performance), Llama-3.3-70B-Instruct NIM 1.8.0, 2 x H100 80GB, FP8, TP2, 5000 input / 500
  output tokens, concurrency sweep with AIPerf.
- **vLLM CI**: vLLM performance benchmark (nightly CI), "Latency tests" on H200, batch 8, 32 in / 128
  out, BF16 (buildkite.com/vllm/performance-benchmark/builds/9515).
- **InferenceBench**: "Recipe: concurrency sweep", vLLM 0.21.0, Llama-3.1-8B, H100 80GB, fp16,
  concurrency 1 (yobitelcomm.github.io/bench/recipes/concurrency-sweep/).
- **Musgrave**: J. Musgrave, "vLLM throughput-latency sweep on NVIDIA A100", vLLM 0.23.0, BF16,
  A100 40GB, concurrency 1, 1024 in / 128 out (johnmusgrave.com/p/vllm-throughput-latency-sweep-on).
  The A100 40GB swaps in its datasheet memory (40 GB HBM2, 1,555 GB/s) for the catalog's 80GB SXM.

Not fitted: the catalog's constants come from datasheets, matmul benchmarks and engine
defaults (see :mod:`fleetloop.sim.catalog`); this suite only reports how far they land.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from fleetloop.sim.catalog import GPUS, MODELS, NodeSpec, node_spec
from fleetloop.sim.node import Node, Req

TRTLLM = "TensorRT-LLM perf overview (1.0 docs, trtllm-bench, PyTorch backend)"
NIM = "NVIDIA NIM benchmarking guide, Llama-3.3-70B NIM 1.8.0 (AIPerf)"
VLLM_CI = "vLLM nightly CI latency tests (buildkite build 9515)"
INFBENCH = "InferenceBench concurrency sweep, vLLM 0.21.0"
MUSGRAVE = "J. Musgrave, vLLM 0.23.0 sweep on A100"

LATENCY = ("e2e_ms", "ttft_ms", "itl_ms")
TRTLLM_SEQ_OVERHEAD_S = 0.0
A100_40GB = dataclasses.replace(GPUS["A100"], name="A100-40GB", hbm_gib=40.0, hbm_bytes_per_s=1.555e12)


@dataclass(frozen=True, slots=True)
class Row:
    source: str
    model: str
    gpu: str
    gpus: int
    precision: str
    isl: int
    osl: int
    load: str  # "offline" | "batch" | "concurrency"
    n: int  # requests (offline, batch) or clients (concurrency)
    metric: str  # "out_tok_s" | "e2e_ms" | "ttft_ms" | "itl_ms"
    published: float
    engine: str = "vllm"  # "vllm" (max_num_seqs 256, 0.9 memory) | "trtllm" (2048, 0.95 of free)
    ci: bool = False  # part of the CI subset (fast)

    @property
    def hardware(self) -> str:
        return f"{self.gpus}x {self.gpu}"

    @property
    def label(self) -> str:
        return (
            f"{self.model} {self.hardware} {self.precision} {self.isl}/{self.osl} "
            f"{self.load} {self.n} {self.metric}"
        )


def _trt(model: str, hw: str, shape: str, tok_s: float, n: int, *, ci: bool = False) -> Row:
    """A TensorRT-LLM table cell: ``hw`` "H100x2", ``shape`` "ISL/OSL", total output tokens/s."""
    gpu, gpus = hw.split("x")
    isl, osl = shape.split("/")
    return Row(
        TRTLLM,
        model,
        gpu,
        int(gpus),
        "fp8",
        int(isl),
        int(osl),
        "offline",
        n,
        "out_tok_s",
        tok_s,
        "trtllm",
        ci,
    )


def _nim(c: int, metric: str, value: float, *, ci: bool = False) -> Row:
    return Row(NIM, "llama-70b", "H100", 2, "fp8", 5000, 500, "concurrency", c, metric, value, "vllm", ci)


# The published rows. Offline request counts are the source's (capped at 3000: steady state is
# reached long before, and the cap keeps the suite to seconds).
ROWS: tuple[Row, ...] = (
    _trt("llama-8b", "H100x1", "128/2048", 22_714, 3000),
    _trt("llama-8b", "H100x1", "500/2000", 17_660, 3000),
    _trt("llama-8b", "H100x1", "1000/1000", 15_220, 3000, ci=True),
    _trt("llama-8b", "H100x1", "2048/128", 3_450, 3000, ci=True),
    _trt("llama-8b", "H100x1", "2048/2048", 9_305, 1500),
    _trt("llama-8b", "H100x1", "5000/500", 3_459, 1500, ci=True),
    _trt("llama-8b", "H100x1", "20000/2000", 1_351, 1000),
    _trt("llama-8b", "H200x1", "128/2048", 26_221, 3000),
    _trt("llama-8b", "H200x1", "1000/1000", 17_744, 3000),
    _trt("llama-8b", "H200x1", "2048/128", 3_538, 3000),
    _trt("llama-8b", "H200x1", "5000/500", 3_902, 1500),
    _trt("llama-70b", "H100x2", "128/2048", 6_651, 3000),
    _trt("llama-70b", "H100x2", "1000/1000", 4_205, 3000, ci=True),
    _trt("llama-70b", "H100x2", "2048/128", 762, 3000),
    _trt("llama-70b", "H100x2", "5000/500", 898, 1500),
    _trt("llama-70b", "H200x1", "1000/1000", 2_909, 3000),
    _trt("llama-70b", "H200x1", "2048/128", 442, 3000),
    _trt("llama-405b", "H100x8", "128/2048", 4_340, 3000),
    _trt("llama-405b", "H100x8", "1000/1000", 2_919, 3000),
    _trt("llama-405b", "H100x8", "2048/128", 453, 3000),
    _trt("llama-405b", "H200x8", "1000/1000", 3_330, 3000),
    _nim(1, "ttft_ms", 406.77, ci=True),
    _nim(1, "itl_ms", 18.58, ci=True),
    _nim(5, "ttft_ms", 546.7),
    _nim(5, "itl_ms", 21.83),
    _nim(25, "ttft_ms", 688.69),
    _nim(25, "itl_ms", 38.75),
    _nim(50, "ttft_ms", 834.51),
    _nim(50, "itl_ms", 59.73),
    Row(VLLM_CI, "llama-8b", "H200", 1, "bf16", 32, 128, "batch", 8, "e2e_ms", 833.4, ci=True),
    Row(VLLM_CI, "llama-70b", "H200", 4, "bf16", 32, 128, "batch", 8, "e2e_ms", 2077.5, ci=True),
    Row(INFBENCH, "llama-8b", "H100", 1, "bf16", 200, 128, "concurrency", 1, "itl_ms", 6.48, ci=True),
    Row(
        MUSGRAVE,
        "llama-8b",
        "A100-40GB",
        1,
        "bf16",
        1024,
        128,
        "concurrency",
        1,
        "itl_ms",
        1000 / 75,
        ci=True,
    ),
)


class _Sink:
    """Listener and event loop for one node (no fleet, no router)."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int]] = []
        self.seq = 0
        self.first: dict[int, float] = {}
        self.finish: dict[int, float] = {}
        self.on_done: Any = None

    def schedule(self, t: float, node: Node, version: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, version))

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


def _node(row: Row, sink: _Sink) -> Node:
    spec = row_spec(row)
    node = Node("cal/0", "cal", spec, sink, sink.schedule, now=0.0, warm=True)
    if row.engine == "trtllm":
        node.max_num_seqs = 2048
        node.no_evict = True
        node.seq_overhead_s = TRTLLM_SEQ_OVERHEAD_S
        free = spec.hbm_bytes - spec.weight_bytes
        # kv_cache_free_gpu_mem_fraction 0.95 of the memory left after weights (less ~3% for
        # activations and the runtime's workspace).
        node.capacity = max(0, int(0.95 * 0.97 * free // spec.kv_bytes_per_token))
    return node


def _drain(node: Node, sink: _Sink) -> float:
    now = 0.0
    while sink.heap:
        now, _, version = heapq.heappop(sink.heap)
        node.on_event(now, version)
    return now


def simulate(row: Row) -> float:
    """The simulated value of ``row.metric`` on ``row``'s workload."""
    sink = _Sink()
    node = _node(row, sink)
    if row.load in ("offline", "batch"):
        for i in range(row.n):
            node.submit(Req(i + 1, row.isl, row.osl, None, 0), 0.0)
        end = _drain(node, sink)
        rids = range(1, row.n + 1)
        if row.metric == "out_tok_s":
            return row.n * row.osl / end
        if row.metric == "e2e_ms":
            return max(sink.finish[r] for r in rids) * 1000.0
        if row.metric == "ttft_ms":
            return statistics.fmean(sink.first[r] for r in rids) * 1000.0
        return statistics.fmean((sink.finish[r] - sink.first[r]) / (row.osl - 1) for r in rids) * 1000.0
    # closed loop: C clients
    total = max(6 * row.n, 24)
    start: dict[int, float] = {}
    state = {"next": 0}

    def send(t: float) -> None:
        if state["next"] >= total:
            return
        state["next"] += 1
        rid = state["next"]
        start[rid] = t
        node.submit(Req(rid, row.isl, row.osl, None, 0), t)

    sink.on_done = lambda _req, t: send(t)
    for _ in range(row.n):
        send(0.0)
    _drain(node, sink)
    measured = list(range(row.n + 1, total + 1))
    if row.metric == "ttft_ms":
        return statistics.fmean(sink.first[r] - start[r] for r in measured) * 1000.0
    if row.metric == "itl_ms":
        return statistics.fmean((sink.finish[r] - sink.first[r]) / (row.osl - 1) for r in measured) * 1000.0
    if row.metric == "e2e_ms":
        return statistics.fmean(sink.finish[r] - start[r] for r in measured) * 1000.0
    span = max(sink.finish[r] for r in measured) - min(start[r] for r in measured)
    return len(measured) * row.osl / span


@dataclass(frozen=True, slots=True)
class Result:
    row: Row
    simulated: float

    @property
    def error(self) -> float:
        return (self.simulated - self.row.published) / self.row.published


def run_rows(rows: Sequence[Row]) -> list[Result]:
    return [Result(r, simulate(r)) for r in rows]


def summary(results: Sequence[Result]) -> dict[str, Any]:
    errs = [r.error for r in results]
    lat = [r.error for r in results if r.row.metric in LATENCY]
    return {
        "rows": len(results),
        "median_abs_error": statistics.median(abs(e) for e in errs) if errs else 0.0,
        "mean_signed_error": statistics.fmean(errs) if errs else 0.0,
        "latency_rows": len(lat),
        "latency_over": sum(1 for e in lat if e > 0),
        "latency_under": sum(1 for e in lat if e < 0),
        "latency_median_signed_error": statistics.median(lat) if lat else 0.0,
    }


def render(results: Sequence[Result]) -> str:
    s = summary(results)
    lines = [
        "# Calibration: the node model against published measurements",
        "",
        "Written by `python -m fleetloop.sim.calibrate`. Each row runs `fleetloop.sim.node.Node` on the",
        "measured workload (sources and load shapes: the module docstring of `fleetloop/sim/calibrate.py`).",
        "Error = (simulated - published) / published. Throughput is output tokens/s; latencies are ms.",
        "",
        "| # | source | model | hardware | precision | ISL/OSL | load | metric "
        "| published | simulated | error |",
        "|--:|---|---|---|---|---|---|---|--:|--:|--:|",
    ]
    for i, r in enumerate(results, 1):
        row = r.row
        lines.append(
            f"| {i} | {row.source} | {row.model} | {row.hardware} | {row.precision} | {row.isl}/{row.osl} "
            f"| {row.load} {row.n} | {row.metric} | {row.published:,.2f} | {r.simulated:,.2f} "
            f"| {r.error:+.1%} |"
        )
    lines += [
        "",
        f"**{s['rows']} rows; median absolute error {s['median_abs_error']:.1%}** "
        f"(mean signed error {s['mean_signed_error']:+.1%}).",
        "",
        f"Latency rows: {s['latency_rows']}, {s['latency_over']} above published and {s['latency_under']} "
        f"below; median signed error {s['latency_median_signed_error']:+.1%}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleetloop.sim.calibrate", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--out", default="bench/results/calibration.md", help="markdown output (default: %(default)s)"
    )
    ap.add_argument("--json", action="store_true", help="print the rows and summary as JSON")
    ap.add_argument("--subset", action="store_true", help="only the fast CI subset")
    args = ap.parse_args(argv)
    rows = [r for r in ROWS if r.ci] if args.subset else list(ROWS)
    results: list[Result] = []
    for i, row in enumerate(rows, 1):
        results.append(Result(row, simulate(row)))
        if not args.json:
            print(f"[{i}/{len(rows)}] {row.label}: {results[-1].error:+.1%}", file=sys.stderr)
    if args.json:
        data = {
            "rows": [
                {**dataclasses.asdict(r.row), "simulated": r.simulated, "error": r.error} for r in results
            ],
            "summary": summary(results),
        }
        sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        text = render(results)
        print(text)
    if not args.subset:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
