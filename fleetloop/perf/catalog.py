"""The GPU and model catalog: data, with a source for every number.

GPUs (peak dense tensor FLOP/s in BF16 and FP8, HBM capacity and bandwidth, the GPU-to-GPU link,
on-demand price per GPU-hour):

- H100 SXM5 80GB: 989 TFLOP/s BF16 dense (the datasheet's 1,979 is with 2:4 sparsity), 1,979 FP8
  dense, 80 GB HBM3, 3.35 TB/s, NVLink 4 at 450 GB/s per direction. Source: NVIDIA H100 Tensor
  Core GPU datasheet (nvidia.com/en-us/data-center/h100). Price $2.99/GPU-h: Lambda on-demand H100
  SXM, as cited in "AMD inference economics" (cliffcenter.com/research/amd-inference-economics,
  2026-05-18).
- H200 SXM 141GB: 989 TFLOP/s BF16 dense, 1,979 FP8, 141 GB HBM3e, 4.8 TB/s, NVLink 4. Source:
  NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200). Price $3.59/GPU-h: RunPod H200,
  "RunPod GPU Pricing: 2026 Comprehensive Pricing Guide" (deploybase.ai/articles/runpod-gpu-pricing).
- A100 SXM4 80GB: 312 TFLOP/s BF16 dense, no FP8 tensor cores (FP8 checkpoints run weight-only,
  W8A16, at BF16 speed), 80 GB HBM2e, 2.039 TB/s, NVLink 3 at 300 GB/s per direction. Source:
  NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100). Price $1.39/GPU-h: RunPod A100 SXM.
- L40S 48GB: 362 TFLOP/s BF16 dense, 733 FP8 dense, 48 GB GDDR6, 864 GB/s, PCIe Gen4 x16 only
  (32 GB/s per direction, no NVLink). Source: NVIDIA L40S datasheet
  (nvidia.com/en-us/data-center/l40s). Price $0.79/GPU-h: RunPod L40S.
- MI300X 192GB: 1,307.4 TFLOP/s BF16 dense, 2,614.9 FP8 dense, 192 GB HBM3, 5.3 TB/s, Infinity
  Fabric 7 x 64 GB/s per direction. Source: AMD Instinct MI300X datasheet
  (amd.com/en/products/accelerators/instinct/mi300/mi300x.html). Price $1.99/GPU-h: median MI300X
  on-demand in the cliffcenter.com note above.

Models (parameters, layers, hidden = query heads x head dim, KV heads x head dim; KV bytes per
token = 2 (K and V) x layers x KV heads x head dim x bytes per element):

- qwen-7b = Qwen2.5-7B: 7.62e9 parameters, 28 layers, hidden 3584, 4 KV heads of dim 128: 57,344
  KV bytes per token in BF16. Source: Qwen/Qwen2.5-7B-Instruct config.json (Hugging Face).
- llama-8b = Llama 3.1 8B: 8.03e9 parameters, 32 layers, hidden 4096, 8 KV heads of dim 128:
  131,072. Source: meta-llama/Llama-3.1-8B config.json and the model card.
- llama-70b = Llama 3.1 70B: 70.6e9 parameters, 80 layers, hidden 8192, 8 KV heads of dim 128:
  327,680. Source: meta-llama/Llama-3.1-70B config.json.
- llama-405b = Llama 3.1 405B: 405.9e9 parameters, 126 layers, hidden 16384, 8 KV heads of dim
  128: 516,096. Source: meta-llama/Llama-3.1-405B config.json. At BF16 its 812 GB of weights fit
  only on 8 x H200 or 8 x MI300X; FP8 fits 8 x H100 (Meta ships an FP8 checkpoint for that).

Precision (a pool's ``precision``): ``bf16`` stores weights and KV in 2 bytes; ``fp8`` in 1 byte
(FP8 weights plus FP8 KV cache, as the nvidia/*-FP8 ModelOpt checkpoints and vLLM's
``--kv-cache-dtype fp8`` do), and its GEMMs run at the FP8 peak on GPUs that have FP8 tensor cores
(all but the A100, whose FP8 checkpoints run weight-only at BF16 speed).

Achieved efficiency (what a serving engine gets out of the peak numbers):

- GEMM efficiency per GPU (``mamf_bf16``, ``mamf_fp8``): the "Maximum Achievable Matmul FLOPS"
  measured by S. Bekman's mamf-finder, ml-engineering, compute/accelerator/README.md: A100 SXM
  86.9% BF16; H100 SXM 80.3% BF16 and 70.9% FP8; H200 ("same as H100") 80.3% BF16, 73.4% FP8;
  MI300X 60.1% BF16 (ROCm 6.2 row; FP8 not measured there, taken as the BF16 share). The L40S is
  not in the table: 70%, between the H100 and MI300X, since a 350 W Ada board throttles under
  sustained GEMM (an assumption, flagged as such).
- ``ENGINE_EFF``: the share of prefill time spent in those GEMMs at MAMF speed (norms, rotary,
  sampling, activation quantization and kernel gaps are not). Fitted on the calibration's fitting
  half (``python -m fleetloop.sim.calibrate --fit``; the value and the rows are in
  ``fleetloop/sim/data/calibration.csv`` and :data:`fleetloop.perf.engines.FIT`).
- GEMM efficiency falls with the number of tokens in the batch (``GEMM_HALF_TOKENS`` 64: a GEMM
  with M tokens runs at M / (M + 64) of its large-M speed): small-M GEMMs cannot fill the SMs, which
  is why decode at batch 32-256 sits near the ridge point rather than on it.
- ``DECODE_BW_UTIL``: the share of HBM bandwidth that streaming the weights reaches (80-90% with
  tuned GEMV kernels); fitted like ``ENGINE_EFF``. ``KV_BW_UTIL``, fitted likewise: paged
  attention reads KV through a block table in 16-token pages, which runs below a dense stream
  (FlashInfer / vLLM paged-attention decode kernels report 60-80%).
- ``ROOF_P``: a step takes the smooth maximum ``(mem^p + compute^p)^(1/p)`` of its memory and
  compute times rather than the larger of the two: near the ridge point (a decode batch of tens to
  hundreds) the kernels reach neither their bandwidth nor their FLOP peak, so a step costs more
  than either bound alone; far from it the larger one rules. Fitted like ``ENGINE_EFF``.
- ``LAYER_S``: what every step pays per layer whatever its batch: the floor of a layer's small
  kernels (norms, rotary, the attention and activation kernels, the quantization of activations),
  which do not shrink with fewer tokens and which CUDA graphs do not remove (they remove the
  launches, not the kernels). It is the decode step's fixed cost that grows with the model's depth
  (32 layers for 8B, 80 for 70B, 126 for 405B), on every GPU of a tensor-parallel group alike.
  Fitted like ``ENGINE_EFF``.
- ``EAGER_LAYER_S``: an iteration that does not run as a captured CUDA graph (a prefill or mixed
  step on the engines that capture decode batches only, a decode batch past the largest graph)
  launches every layer's kernels from Python one by one, so it lasts at least ``layers x
  EAGER_LAYER_S`` whatever its GPU time: the GPU waits for the launches when it runs ahead of them
  (a short prefill of a deep model on several GPUs), and the launches hide behind it otherwise
  (every long prefill). Which iterations run eagerly is the engine's
  (:meth:`fleetloop.perf.engines.RuntimeProfile.runs_eager`, with sources). Fitted like
  ``ENGINE_EFF``: only a short prefill of a deep model reaches the floor, so the fitting rows that
  move it are the 70B ones on four H100s (``sgl060-*-70b-h100x4-*`` in the calibration data: their
  first tokens and, through the prefill steps decoders wait out, their TPOT); an 8B prefill of 224
  tokens runs longer on its GPU than the floor. Its start, 0.4 ms, was the best of a scan of the
  fitting half's objective from 0 to 0.6 ms; the fit kept it.
- Fixed costs of a step (scheduler, input preparation, launch, sampling) and of a request depend
  on the serving engine: :mod:`fleetloop.perf.engines` holds them per engine and release, with the
  step's token budget, the running-sequence cap, CUDA-graph batch sizes and KV memory share.
- Tensor parallelism: two all-reduces per layer (Megatron-style) of ``tokens x hidden x 2`` bytes
  each; a ring all-reduce over ``n`` GPUs costs ``alpha(n) + 2 (n - 1) / n x bytes / busbw``, with
  ``alpha(n) = link latency base + 2 (n - 1) x per-hop latency`` (NCCL's ring has 2 (n - 1) steps).
  Achieved bus bandwidth is 80% of the link's per-direction rate (nccl-tests all_reduce_perf on
  DGX H100 / A100 report ~360 / ~230 GB/s busbw); PCIe L40S reaches ~20 GB/s. Latency: 12 us + 1 us
  per hop over NVLink / Infinity Fabric (14 us on 2 GPUs, 18 on 4, 26 on 8: small-message
  all-reduce latency in nccl-tests and vLLM's custom all-reduce is 10-30 us once the launch and
  the barrier are counted), 25 us + 5 us per hop over PCIe.
  ``TP_COMPUTE_EFF`` 0.9 for TP > 1: GEMMs split N ways are narrower and run below single-GPU
  efficiency.
- ``GPU_MEMORY_UTIL`` 0.9: vLLM's default ``gpu_memory_utilization``; weights take their share, the
  KV cache gets the rest.

Cold start (a node provisioned cold: image, weights, engine warm-up), from published measurements
of vLLM serving Llama-3.1-8B on an L40S (Tensorfuse, "Reducing GPU Cold Start Time when using
vLLM", tensorfuse.io/docs/blogs/reducing_gpu_cold_start, 2025-09-01), every cache cold vs every
cache warm (model on a volume, torch.compile and CUDA-graph caches persisted):

==============================  ===========  ==========
phase                           uncached (s)  cached (s)
==============================  ===========  ==========
model download                  61           0
weight loading                  33           18
dynamo bytecode transformation  10           10
graph compilation               42           13
graph capture                   54           7
init engine and imports         94           34
total                           294          82
==============================  ===========  ==========

Scaled to other models and GPUs: download and load scale with the weight bytes (16.1 GB there:
0.26 GB/s download, 0.49 GB/s uncached load, 0.89 GB/s cached load); compilation and capture with
the number of layers (32 there); engine init is constant. The container image pull comes on top
when the image is not on the host: BentoML measured 5-6 min pull plus 3-4 min extraction for a
20 GB vLLM image ("Cold-Starting LLMs on Kubernetes in Under 30 Seconds", bentoml.com/blog,
2025-04-11); the uncached profile takes the image as present (a node pool with pre-pulled images),
since the Tensorfuse figures already give the ~300 s the issue's sources quote. Each phase is
drawn from a lognormal with that median and ``COLD_START_SIGMA`` 0.2 (so ~95% of starts fall within
x/1.5 of the median: the run-to-run spread of pulls and compiles), with the scenario's seeded
generator (:func:`fleetloop.sim.catalog.sample_cold_start`), so a run is deterministic per seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Precision = Literal["bf16", "fp8"]
PRECISIONS: tuple[str, ...] = ("bf16", "fp8")

ENGINE_EFF = 0.8142  # fitted (see the module docstring)
GEMM_HALF_TOKENS = 64.0
DECODE_BW_UTIL = 0.7225  # fitted (see the module docstring)
KV_BW_UTIL = 0.7061  # fitted (see the module docstring)
ROOF_P = 4.0  # fitted (see the module docstring): the roofline's smoothness near the ridge
LAYER_S = 2.461e-05  # fitted (see the module docstring): a step's per-layer kernel floor
EAGER_LAYER_S = 0.0004  # fitted (see the module docstring): an eager iteration's per-layer CPU floor
TP_COMPUTE_EFF = 0.9
GPU_MEMORY_UTIL = 0.9
BUSBW_SHARE = 0.8  # achieved all-reduce bus bandwidth / link rate per direction
ACT_BYTES = 2  # activations all-reduced in BF16 (FP8 checkpoints too)
MAX_WEIGHT_SHARE = 0.75  # the smallest power-of-two GPU count whose HBM holds the weights at <= 75%
DEFAULT_MAX_BATCH_TOKENS = 8192  # vLLM V1's max_num_batched_tokens for `vllm serve` on an H100-class GPU

# Cold start (see the module docstring): the Tensorfuse reference run.
_REF_WEIGHT_GB = 16.06
_REF_LAYERS = 32
COLD_START_SIGMA = 0.2
COLD_START_PHASES: dict[str, dict[str, float]] = {
    # phase: (uncached s, cached s) at the reference; "scale" says what it scales with
    "download": {"uncached": 61.0, "cached": 0.0},
    "load": {"uncached": 33.0, "cached": 18.0},
    "compile": {"uncached": 52.0, "cached": 23.0},  # dynamo + graph compilation
    "capture": {"uncached": 54.0, "cached": 7.0},
    "init": {"uncached": 94.0, "cached": 34.0},
}
_SCALES_WITH = {
    "download": "weights",
    "load": "weights",
    "compile": "layers",
    "capture": "layers",
    "init": "none",
}


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    bf16_flops: float  # peak dense BF16 FLOP/s per GPU
    hbm_gib: float  # memory per GPU, GB (decimal, as datasheets state it)
    hbm_bytes_per_s: float  # memory bandwidth per GPU
    usd_per_gpu_h: float  # on-demand price
    allreduce_s: float  # link latency base of an all-reduce between the GPUs of one node
    fp8_flops: float = 0.0  # peak dense FP8 FLOP/s per GPU; 0 = no FP8 tensor cores
    link_bytes_per_s: float = 450e9  # GPU-to-GPU link, per direction
    hop_s: float = 1e-6  # per-step latency of a ring all-reduce
    mamf_bf16: float = 0.8  # achieved share of the BF16 peak on large GEMMs
    mamf_fp8: float = 0.7


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    params: float
    layers: int
    hidden: int
    kv_bytes_per_token: int  # in BF16

    @property
    def weight_bytes(self) -> float:
        """BF16 weight bytes (see :attr:`NodeSpec.weight_bytes` for the pool's precision)."""
        return self.params * 2


GPUS: dict[str, GpuSpec] = {
    "A100": GpuSpec(
        "A100", 312e12, 80.0, 2.039e12, 1.39, 12e-6, fp8_flops=0.0, link_bytes_per_s=300e9, mamf_bf16=0.869
    ),
    "H100": GpuSpec(
        "H100", 989e12, 80.0, 3.35e12, 2.99, 12e-6, fp8_flops=1979e12, mamf_bf16=0.803, mamf_fp8=0.709
    ),
    "H200": GpuSpec(
        "H200", 989e12, 141.0, 4.8e12, 3.59, 12e-6, fp8_flops=1979e12, mamf_bf16=0.803, mamf_fp8=0.734
    ),
    "L40S": GpuSpec(
        "L40S",
        362e12,
        48.0,
        0.864e12,
        0.79,
        25e-6,
        fp8_flops=733e12,
        link_bytes_per_s=25e9,
        hop_s=5e-6,
        mamf_bf16=0.7,
        mamf_fp8=0.7,
    ),
    "MI300X": GpuSpec(
        "MI300X",
        1307.4e12,
        192.0,
        5.3e12,
        1.99,
        12e-6,
        fp8_flops=2614.9e12,
        link_bytes_per_s=448e9,
        mamf_bf16=0.601,
        mamf_fp8=0.601,
    ),
}

MODELS: dict[str, ModelSpec] = {
    "qwen-7b": ModelSpec("qwen-7b", 7.62e9, 28, 3584, 57_344),
    "llama-8b": ModelSpec("llama-8b", 8.03e9, 32, 4096, 131_072),
    "llama-70b": ModelSpec("llama-70b", 70.6e9, 80, 8192, 327_680),
    "llama-405b": ModelSpec("llama-405b", 405.9e9, 126, 16384, 516_096),
}


def bytes_per_element(precision: str) -> int:
    return 1 if precision == "fp8" else 2


def default_gpus_per_node(model: ModelSpec, gpu: GpuSpec, precision: str = "bf16") -> int:
    """Tensor-parallel degree: the smallest power of two (1..8) whose HBM holds the weights at
    <= ``MAX_WEIGHT_SHARE`` (the rest is KV cache). BF16 llama-70b: H100/A100 4, H200 2, L40S 4,
    MI300X 1; llama-405b 8 everywhere (at BF16 it fits only the H200 and MI300X)."""
    weights = model.params * bytes_per_element(precision)
    n = 1
    while n < 8 and weights > MAX_WEIGHT_SHARE * n * gpu.hbm_gib * 1e9:
        n *= 2
    return n


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One serving replica: a model on ``gpus`` GPUs of one type at a precision, with its speeds.

    - achieved FLOP/s (large GEMMs) = gpus x peak(precision) x MAMF share x ENGINE_EFF
      (x TP_COMPUTE_EFF if gpus > 1); a batch of M tokens gets M / (M + GEMM_HALF_TOKENS) of it
    - weight bytes/s = gpus x bandwidth x DECODE_BW_UTIL; KV bytes/s = gpus x bandwidth x KV_BW_UTIL
    - KV capacity (tokens) = (gpus x HBM x GPU_MEMORY_UTIL - weight bytes) / KV bytes per token
    - iteration fixed cost = the engine's step, per-sequence and per-admitted-request costs
      (:mod:`fleetloop.perf.engines`) + (if gpus > 1) 2 x layers x ring all-reduce(tokens x hidden
      x 2 bytes)
    """

    model: ModelSpec
    gpu: GpuSpec
    gpus: int
    precision: str = "bf16"

    @property
    def flops(self) -> float:
        g = self.gpu
        fp8 = self.precision == "fp8" and g.fp8_flops > 0
        peak = g.fp8_flops * g.mamf_fp8 if fp8 else g.bf16_flops * g.mamf_bf16
        return self.gpus * peak * ENGINE_EFF * (TP_COMPUTE_EFF if self.gpus > 1 else 1.0)

    @property
    def bytes_per_s(self) -> float:
        return self.gpus * self.gpu.hbm_bytes_per_s * DECODE_BW_UTIL

    @property
    def kv_bytes_per_s(self) -> float:
        return self.gpus * self.gpu.hbm_bytes_per_s * KV_BW_UTIL

    @property
    def weight_bytes(self) -> float:
        return self.model.params * bytes_per_element(self.precision)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token * bytes_per_element(self.precision) // 2

    @property
    def hbm_bytes(self) -> float:
        return self.gpus * self.gpu.hbm_gib * 1e9

    @property
    def kv_capacity_tokens(self) -> int:
        free = self.hbm_bytes * GPU_MEMORY_UTIL - self.weight_bytes
        return max(0, int(free // self.kv_bytes_per_token))

    def allreduce_s(self, tokens: float) -> float:
        """Tensor-parallel communication of one iteration over ``tokens`` tokens (0 on one GPU)."""
        n = self.gpus
        if n <= 1:
            return 0.0
        g = self.gpu
        alpha = g.allreduce_s + 2 * (n - 1) * g.hop_s
        msg = tokens * self.model.hidden * ACT_BYTES
        per = alpha + 2.0 * (n - 1) / n * msg / (g.link_bytes_per_s * BUSBW_SHARE)
        return 2 * self.model.layers * per

    def overhead_s(
        self, batch: float, tokens: float, admitted: float, *, step_s: float, seq_s: float, admit_s: float
    ) -> float:
        """An iteration's fixed costs: ``batch`` sequences, ``tokens`` tokens, ``admitted`` new, with
        the engine's per-step, per-sequence and per-request CPU costs."""
        return (
            step_s
            + seq_s * batch
            + admit_s * admitted
            + LAYER_S * self.model.layers
            + self.allreduce_s(max(1, tokens))
        )

    @staticmethod
    def gemm_share(tokens: float) -> float:
        """The share of large-GEMM speed a batch of ``tokens`` tokens gets."""
        return tokens / (tokens + GEMM_HALF_TOKENS) if tokens > 0 else 1.0

    @property
    def attn_flops_per_ctx(self) -> float:
        """Attention FLOPs per (query token x context position): QK^T plus AV, 2 x 2 x layers x d."""
        return 4.0 * self.model.layers * self.model.hidden

    @property
    def usd_per_s(self) -> float:
        return self.gpus * self.gpu.usd_per_gpu_h / 3600.0

    @property
    def usd_per_h(self) -> float:
        return self.gpus * self.gpu.usd_per_gpu_h

    def cold_start_medians(self, *, cached: bool) -> dict[str, float]:
        """Median seconds of each cold-start phase on this node (see the module docstring)."""
        mode = "cached" if cached else "uncached"
        weight_gb = self.weight_bytes / 1e9
        out: dict[str, float] = {}
        for phase, ref in COLD_START_PHASES.items():
            scale = _SCALES_WITH[phase]
            if scale == "weights":
                f = weight_gb / _REF_WEIGHT_GB
            elif scale == "layers":
                f = self.model.layers / _REF_LAYERS
            else:
                f = 1.0
            out[phase] = ref[mode] * f
        return out


def node_spec(model: str, gpu: str, gpus: int | None = None, precision: str = "bf16") -> NodeSpec:
    m = MODELS[model]
    g = GPUS[gpu]
    return NodeSpec(m, g, gpus if gpus is not None else default_gpus_per_node(m, g, precision), precision)
