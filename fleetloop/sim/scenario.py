"""Scenario files: the simulator's public input format (``scenarios/README.md``).

Every model is strict (``extra="forbid"``) so a typo is an error, not a silently ignored field.
:func:`load_scenario` turns every problem into a :class:`ScenarioError` whose ``str()`` is one line
naming the file and the field, e.g.
``scenarios/x.yaml: pools[0].gpu: unknown GPU 'H900' (known: A100, H100, H200, L40S, MI300X)``.
Fields marked *extension* there are optional with defaults, so a file written without them stays
valid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from fleetloop.perf.catalog import GPUS, MODELS, node_spec
from fleetloop.perf.engines import Engine, RuntimeProfile, check_family, profile
from fleetloop.schemas.errors import one_line
from fleetloop.sim.catalog import sample_cold_start
from fleetloop.user_input import UserInputError, read_yaml

Ident = str
_IDENT = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]*$"  # no '/': node ids are '<pool>/<index>'


def _not_bool(v: Any) -> Any:
    # YAML reads `true` as a boolean, and pydantic would take it for the integer 1 (``nodes: true``).
    if isinstance(v, bool):
        raise ValueError("a whole number, not true/false")
    return v


Int = Annotated[int, BeforeValidator(_not_bool)]


class ScenarioError(ValueError):
    """A scenario that cannot run. ``str()`` is one line naming the file and the field."""


class _Strict(BaseModel):
    # No NaN or infinity anywhere: a NaN fails every bound with a message about the bound.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Slo(_Strict):
    ttft_ms: Int = Field(gt=0)
    tbt_ms: Int = Field(gt=0)


class Pool(_Strict):
    id: str = Field(pattern=_IDENT, max_length=100)
    model: str
    gpu: str
    nodes: Int = Field(ge=0, le=1000)
    min_nodes: Int = Field(default=0, ge=0, le=1000)
    max_nodes: Int | None = Field(default=None, ge=0, le=1000)
    # extension: a fixed cold start in seconds; absent, each boot draws one from the published
    # phase distribution (fleetloop.perf.catalog: init, download, load, compile, capture), per `cache`
    cold_start_s: float | None = Field(default=None, ge=0.0, le=3600.0)
    cache: Literal["cached", "uncached"] = "cached"  # extension: what a booting node finds on disk
    gpus_per_node: Int | None = Field(default=None, ge=1, le=64)  # extension: tensor-parallel degree
    precision: Literal["bf16", "fp8"] = "bf16"  # extension: weights and KV cache in 2 or 1 bytes
    # extension: the serving engine and its release family (fleetloop.perf.engines); None = the
    # engine's default family (vllm v1, sglang 0.3, trtllm 1.0)
    engine: Engine = "vllm"  # runtime.DEFAULT_ENGINE
    engine_version: str | None = Field(default=None, max_length=20)

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
        if v not in GPUS:
            raise ValueError(f"unknown GPU {v!r} (known: {', '.join(sorted(GPUS))})")
        return v

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        if v not in MODELS:
            raise ValueError(f"unknown model {v!r} (known: {', '.join(sorted(MODELS))})")
        return v

    @field_validator("gpus_per_node")
    @classmethod
    def _tensor_parallel(cls, v: int | None) -> int | None:
        # Tensor parallelism splits a model's attention heads evenly across the GPUs (32 or 64 heads
        # in the catalog's models), and GPU servers come in 1, 2, 4 or 8: a power of two.
        if v is not None and v & (v - 1):
            raise ValueError(f"{v} GPUs cannot split a model's attention heads evenly: use 1, 2, 4, 8, ...")
        return v

    @model_validator(mode="after")
    def _engine_family(self) -> Pool:
        check_family(self.engine, self.engine_version)
        return self

    @property
    def runtime(self) -> RuntimeProfile:
        return profile(self.engine, self.engine_version)

    @model_validator(mode="after")
    def _bounds(self) -> Pool:
        hi = self.max_nodes if self.max_nodes is not None else self.nodes
        if not self.min_nodes <= self.nodes <= hi:
            raise ValueError(
                f"needs min_nodes <= nodes <= max_nodes (got {self.min_nodes}, {self.nodes}, {hi})"
            )
        spec = node_spec(self.model, self.gpu, self.gpus_per_node, self.precision)
        if spec.kv_capacity_tokens < 1024:
            raise ValueError(
                f"{self.model} in {self.precision} does not fit {spec.gpus} x {self.gpu} with room for a "
                f"KV cache (weights {spec.weight_bytes / 1e9:.0f} GB of {spec.hbm_bytes / 1e9:.0f} GB); "
                "raise gpus_per_node or use precision: fp8"
            )
        return self

    @property
    def hi_nodes(self) -> int:
        return self.max_nodes if self.max_nodes is not None else self.nodes

    def boot_times(self, rng: np.random.Generator) -> tuple[float, float]:
        """One boot of a node of this pool: (seconds until loading, seconds until warm). A fixed
        ``cold_start_s`` splits in halves; otherwise one draw from the published phases."""
        if self.cold_start_s is not None:
            return self.cold_start_s / 2.0, self.cold_start_s
        spec = node_spec(self.model, self.gpu, self.gpus_per_node, self.precision)
        return sample_cold_start(spec, rng, cached=self.cache == "cached")


class Tenant(_Strict):
    id: str = Field(pattern=_IDENT, max_length=100)
    priority: Int = Field(ge=0, le=9)


class TokenDist(_Strict):
    """Lognormal with this median, sigma such that ``max`` is the 99.9th percentile, clipped at max."""

    median: Int = Field(ge=1, le=1_000_000)
    max: Int = Field(ge=1, le=1_000_000)

    @model_validator(mode="after")
    def _order(self) -> TokenDist:
        if self.max < self.median:
            raise ValueError(f"max ({self.max}) is below median ({self.median})")
        return self


class Client(_Strict):
    timeout_s: float = Field(gt=0.0, le=3600.0)
    max_retries: Int = Field(default=3, ge=0, le=20)
    backoff_s: float = Field(default=0.5, gt=0.0, le=60.0)  # extension: base of exponential backoff
    backoff_max_s: float = Field(default=20.0, gt=0.0, le=600.0)  # extension: backoff cap
    # extension: false = a non-streaming call: the timeout bounds the whole call, and the engine never
    # learns that the client left (the request runs on as an orphan).
    stream: bool = True


Kind = Literal["chatbot", "copilot", "research", "autonomous"]


class Workload(_Strict):
    kind: Kind
    tenant: str
    rate_per_s: float = Field(gt=0.0, le=10_000.0)
    calls: tuple[Int, Int]
    prompt_tokens: TokenDist
    output_tokens: TokenDist
    shared_prefix_tokens: Int = Field(default=0, ge=0, le=1_000_000)
    models: tuple[str, ...] = Field(min_length=1)
    deadline_s: float = Field(gt=0.0, le=86_400.0)
    client: Client

    @field_validator("calls")
    @classmethod
    def _calls(cls, v: tuple[int, int]) -> tuple[int, int]:
        lo, hi = v
        if not 1 <= lo <= hi <= 100_000:
            raise ValueError(f"needs 1 <= min <= max <= 100000 (got [{lo}, {hi}])")
        return v

    @field_validator("models")
    @classmethod
    def _known_models(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for m in v:
            if m not in MODELS:
                raise ValueError(f"unknown model {m!r} (known: {', '.join(sorted(MODELS))})")
        return v


FaultKind = Literal["degrade", "crash", "preempt", "load_spike"]


class Fault(_Strict):
    """A fault at ``at_s``. degrade: ``node`` (or ``pool`` + ``count``), ``factor`` >= 1,
    ``duration_s``; crash / preempt: ``pool`` + ``count`` (or ``node``); load_spike: ``factor``,
    ``duration_s``, optional ``tenant``."""

    at_s: float = Field(ge=0.0)
    kind: FaultKind
    node: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:@-]*/[0-9]+$")
    pool: str | None = None
    count: Int | None = Field(default=None, ge=1, le=1000)
    factor: float | None = Field(default=None, gt=0.0, le=1000.0)
    duration_s: float | None = Field(default=None, gt=0.0)
    tenant: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> Fault:
        if self.kind in ("degrade", "crash", "preempt") and self.node is None and self.pool is None:
            raise ValueError(f"a {self.kind} fault needs `node` or `pool`")
        if self.kind in ("degrade", "load_spike"):
            if self.factor is None:
                raise ValueError(f"a {self.kind} fault needs `factor`")
            if self.kind == "degrade" and self.factor < 1.0:
                raise ValueError("a degrade factor is a slow-down, >= 1")
        return self

    @property
    def target_pool(self) -> str | None:
        if self.node is not None:
            return self.node.rsplit("/", 1)[0]
        return self.pool


class Scenario(_Strict):
    name: str = Field(min_length=1, max_length=200)
    description: str = ""  # extension
    seed: Int = Field(default=0, ge=0, le=2**63 - 1)
    duration_s: float = Field(gt=0.0, le=86_400.0)
    slo: Slo
    pools: tuple[Pool, ...] = Field(min_length=1)
    tenants: tuple[Tenant, ...] = Field(min_length=1)
    workload: tuple[Workload, ...] = Field(min_length=1)
    faults: tuple[Fault, ...] = ()

    @model_validator(mode="after")
    def _references(self) -> Scenario:
        pool_ids = [p.id for p in self.pools]
        if len(set(pool_ids)) != len(pool_ids):
            raise ValueError("pools: duplicate pool id")
        tenant_ids = {t.id for t in self.tenants}
        if len(tenant_ids) != len(self.tenants):
            raise ValueError("tenants: duplicate tenant id")
        served = {p.model for p in self.pools}
        for i, w in enumerate(self.workload):
            if w.tenant not in tenant_ids:
                known = ", ".join(sorted(tenant_ids))
                raise ValueError(f"workload[{i}].tenant: unknown tenant {w.tenant!r} (known: {known})")
            if not served.intersection(w.models):
                raise ValueError(f"workload[{i}].models: no pool serves any of {list(w.models)}")
        pools = {p.id: p for p in self.pools}
        last_s = self.duration_s + max(w.deadline_s for w in self.workload)  # arrivals stop, tasks end
        for i, f in enumerate(self.faults):
            target = f.target_pool
            if target is not None and target not in pools:
                raise ValueError(f"faults[{i}]: unknown pool {target!r} (known: {', '.join(sorted(pools))})")
            if f.node is not None and target is not None:
                index = int(f.node.rsplit("/", 1)[1])
                if index >= pools[target].nodes:
                    raise ValueError(
                        f"faults[{i}].node: {f.node!r} does not exist at start ({pools[target].nodes} nodes)"
                    )
            if f.at_s > last_s:
                raise ValueError(
                    f"faults[{i}].at_s: {f.at_s:g} s is after the last task's deadline "
                    f"({last_s:g} s: duration_s plus the longest deadline_s), so it would never happen"
                )
            if f.tenant is not None and f.tenant not in tenant_ids:
                raise ValueError(f"faults[{i}].tenant: unknown tenant {f.tenant!r}")
        return self

    def tenant_priority(self, tenant_id: str) -> int:
        return next(t.priority for t in self.tenants if t.id == tenant_id)


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario is a mapping, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(f"{source}: {one_line(exc)}") from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file. Raises :class:`ScenarioError` (one line) on any problem."""
    p = Path(path)
    try:
        data = read_yaml(p)  # bounded, UTF-8, not empty: one line naming the file
    except UserInputError as exc:
        raise ScenarioError(str(exc)) from None
    return parse_scenario(data, str(p))
