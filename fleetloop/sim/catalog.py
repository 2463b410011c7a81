"""The GPU and model catalog: data, with a source for every number.

GPUs (peak dense BF16 tensor FLOP/s, HBM capacity and bandwidth, on-demand price per GPU-hour):

- H100 SXM5 80GB: 989 TFLOP/s BF16 dense (the datasheet's 1,979 is with 2:4 sparsity), 80 GB HBM3,
  3.35 TB/s. Source: NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100).
  Price $2.99/GPU-h: Lambda on-demand H100 SXM, as cited in "AMD inference economics"
  (cliffcenter.com/research/amd-inference-economics, 2026-05-18).
- H200 SXM 141GB: 989 TFLOP/s BF16 dense, 141 GB HBM3e, 4.8 TB/s. Source: NVIDIA H200 datasheet
  (nvidia.com/en-us/data-center/h200). Price $3.59/GPU-h: RunPod H200, "RunPod GPU Pricing: 2026
  Comprehensive Pricing Guide" (deploybase.ai/articles/runpod-gpu-pricing, March 2026).
- A100 SXM4 80GB: 312 TFLOP/s BF16 dense, 80 GB HBM2e, 2.039 TB/s. Source: NVIDIA A100 datasheet
  (nvidia.com/en-us/data-center/a100). Price $1.39/GPU-h: RunPod A100 SXM, same deploybase.ai guide.
- L40S 48GB: 362 TFLOP/s BF16 dense (733 with sparsity), 48 GB GDDR6, 864 GB/s, PCIe only (no
  NVLink). Source: NVIDIA L40S datasheet (nvidia.com/en-us/data-center/l40s). Price $0.79/GPU-h:
  RunPod L40S, same deploybase.ai guide.
- MI300X 192GB: 1,307.4 TFLOP/s BF16 dense, 192 GB HBM3, 5.3 TB/s. Source: AMD Instinct MI300X
  datasheet (amd.com/en/products/accelerators/instinct/mi300/mi300x.html). Price $1.99/GPU-h:
  median MI300X on-demand in the cliffcenter.com note above.

Models (BF16 weights, 2 bytes per parameter; KV cache BF16):

- llama-8b = Llama 3.1 8B: 8.03e9 parameters, 32 layers, hidden 4096, 8 KV heads of dim 128, so
  KV bytes per token = 2 (K and V) x 32 layers x 8 heads x 128 x 2 bytes = 131,072.
  Source: meta-llama/Llama-3.1-8B config.json (Hugging Face) and the model card.
- llama-70b = Llama 3.1 70B: 70.6e9 parameters, 80 layers, hidden 8192, 8 KV heads of dim 128, so
  KV bytes per token = 2 x 80 x 8 x 128 x 2 = 327,680. Source: meta-llama/Llama-3.1-70B config.json.

Achieved efficiency (what a serving engine gets out of the peak numbers), calibrated against the
published measurements in ``tests/sim/test_calibration.py``:

- ``PREFILL_MFU`` 0.55: prefill is a large GEMM, compute bound; vLLM / TensorRT-LLM prefill reaches
  roughly half of dense peak (kernel efficiency, attention, layer norms and sampling are not GEMMs).
- ``DECODE_BW_UTIL`` 0.85: a decode step streams every weight and the batch's KV once; well-tuned
  kernels reach 80-90% of HBM bandwidth (a single-stream measurement on A100 reads 77% *including*
  per-step overheads, which we model separately).
- ``STEP_OVERHEAD_S`` 1.5 ms: per-iteration fixed cost (scheduler, sampling, kernel launches under
  CUDA graphs): the gap between the bandwidth-bound step and the observed TPOT at small batch in
  the calibration measurements (newer vLLM releases sit near 1 ms, older ones near 2 ms).
- ``allreduce_s`` per GPU: two all-reduces per layer under tensor parallelism (Megatron-style); a
  small-message NCCL/RCCL all-reduce costs ~20 us over NVLink / Infinity Fabric and ~50 us over
  PCIe (L40S has no NVLink).
- ``TP_EFFICIENCY`` 0.9 for TP > 1: GEMMs split N ways run below single-GPU efficiency.
- ``GPU_MEMORY_UTIL`` 0.9: vLLM's default ``gpu_memory_utilization``; weights take their share, the
  KV cache gets the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFILL_MFU = 0.55
DECODE_BW_UTIL = 0.85
STEP_OVERHEAD_S = 0.0015
TP_EFFICIENCY = 0.9
GPU_MEMORY_UTIL = 0.9
BYTES_PER_PARAM = 2  # BF16
MAX_WEIGHT_SHARE = 0.75  # the smallest power-of-two GPU count whose HBM holds the weights at <= 75%
MAX_NUM_SEQS = 256  # vLLM's default max_num_seqs
DEFAULT_MAX_BATCH_TOKENS = 8192  # vLLM's default max_num_batched_tokens with chunked prefill (V1)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    bf16_flops: float  # peak dense BF16 FLOP/s per GPU
    hbm_gib: float  # memory per GPU, GB (decimal, as datasheets state it)
    hbm_bytes_per_s: float  # memory bandwidth per GPU
    usd_per_gpu_h: float  # on-demand price
    allreduce_s: float  # small-message all-reduce latency between the GPUs of one node


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    params: float
    layers: int
    hidden: int
    kv_bytes_per_token: int

    @property
    def weight_bytes(self) -> float:
        return self.params * BYTES_PER_PARAM


GPUS: dict[str, GpuSpec] = {
    "A100": GpuSpec("A100", 312e12, 80.0, 2.039e12, 1.39, 20e-6),
    "H100": GpuSpec("H100", 989e12, 80.0, 3.35e12, 2.99, 20e-6),
    "H200": GpuSpec("H200", 989e12, 141.0, 4.8e12, 3.59, 20e-6),
    "L40S": GpuSpec("L40S", 362e12, 48.0, 0.864e12, 0.79, 50e-6),
    "MI300X": GpuSpec("MI300X", 1307.4e12, 192.0, 5.3e12, 1.99, 20e-6),
}

MODELS: dict[str, ModelSpec] = {
    "llama-8b": ModelSpec("llama-8b", 8.03e9, 32, 4096, 131_072),
    "llama-70b": ModelSpec("llama-70b", 70.6e9, 80, 8192, 327_680),
}


def default_gpus_per_node(model: ModelSpec, gpu: GpuSpec) -> int:
    """Tensor-parallel degree: the smallest power of two (1..8) whose HBM holds the weights at
    <= ``MAX_WEIGHT_SHARE`` (the rest is KV cache). llama-70b: H100/A100 4, H200 2, L40S 4, MI300X 1."""
    n = 1
    while n < 8 and model.weight_bytes > MAX_WEIGHT_SHARE * n * gpu.hbm_gib * 1e9:
        n *= 2
    return n


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One serving replica: a model on ``gpus`` GPUs of one type, with its achieved speeds.

    - achieved FLOP/s = gpus x peak x PREFILL_MFU x (TP_EFFICIENCY if gpus > 1)
    - achieved bytes/s = gpus x bandwidth x DECODE_BW_UTIL x (TP_EFFICIENCY if gpus > 1)
    - KV capacity (tokens) = (gpus x HBM x GPU_MEMORY_UTIL - weight bytes) / KV bytes per token
    - per-step fixed cost = STEP_OVERHEAD_S + (2 x layers x all-reduce latency if gpus > 1)
    """

    model: ModelSpec
    gpu: GpuSpec
    gpus: int

    @property
    def flops(self) -> float:
        return self.gpus * self.gpu.bf16_flops * PREFILL_MFU * (TP_EFFICIENCY if self.gpus > 1 else 1.0)

    @property
    def bytes_per_s(self) -> float:
        return (
            self.gpus * self.gpu.hbm_bytes_per_s * DECODE_BW_UTIL * (TP_EFFICIENCY if self.gpus > 1 else 1.0)
        )

    @property
    def hbm_bytes(self) -> float:
        return self.gpus * self.gpu.hbm_gib * 1e9

    @property
    def kv_capacity_tokens(self) -> int:
        free = self.hbm_bytes * GPU_MEMORY_UTIL - self.model.weight_bytes
        return max(0, int(free // self.model.kv_bytes_per_token))

    @property
    def step_overhead_s(self) -> float:
        comm = 2 * self.model.layers * self.gpu.allreduce_s if self.gpus > 1 else 0.0
        return STEP_OVERHEAD_S + comm

    @property
    def usd_per_s(self) -> float:
        return self.gpus * self.gpu.usd_per_gpu_h / 3600.0

    @property
    def usd_per_h(self) -> float:
        return self.gpus * self.gpu.usd_per_gpu_h


def node_spec(model: str, gpu: str, gpus: int | None = None) -> NodeSpec:
    m = MODELS[model]
    g = GPUS[gpu]
    return NodeSpec(m, g, gpus if gpus is not None else default_gpus_per_node(m, g))
