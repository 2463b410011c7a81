"""The arms of ``fleetloop bench stack``: one line each in :data:`ARMS`.

An arm is a router and who runs it:

- a **peer** arm is the router as people deploy it, alone: its own policy, health checks, retries
  and breaker, the nodes it is told about by the bench's endpoint list (what Kubernetes service
  discovery gives it: the ready nodes) or found by its own health checks, and the autoscaling
  people deploy beside it: KEDA on the engine's queue and KV cache (``policies/baselines/
  modern.yaml``, ``keda-engine``), run by a fleetloop daemon whose routing and breaker decisions
  nothing follows; only its autoscale targets reach the fleet's worker manager;
- a **fleetloop** arm is the same router driven by fleetloop: the shipped default policy
  (``policies/default.yaml``) decides routing, breakers and capacity, its actuator for that router
  applies them, and the fleet's worker manager obeys its autoscale and batching decisions.

A router is a small class: the binaries it needs, its command line over the initial nodes, the
path that says it is up, the API an endpoint list drives (peers), and the ``fleetloop actuate``
command line that drives it (fleetloop arms). An arm whose router or actuator is not built yet is
not listed.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from fleetloop.edges.actuate.haproxy.logs import HAPROXY_FRONTEND_SNIPPET, HAPROXY_STREAMING_DEFAULTS
from fleetloop.edges.actuate.sglang_router.command import SglangRouterApi
from fleetloop.edges.actuate.sglang_router.launch import router_argv as sglang_argv
from fleetloop.edges.actuate.vllm_router.command import VllmRouterApi
from fleetloop.edges.litellm.launch import LIVENESS, proxy_argv, proxy_config, proxy_env


@dataclass(frozen=True, slots=True)
class Slots:
    """The node slots of an arm's pool: node id -> base URL of every node the fleet may provision
    in the run (``LiveFleet(base_port=...)`` gives node ``i`` port ``base + i``), so a scraper, a
    HAProxy backend and fleetloop's maps can name nodes that do not exist yet."""

    pool_id: str
    model: str
    urls: dict[str, str]  # node id -> http://127.0.0.1:PORT

    def servers(self) -> dict[str, str]:
        """node id -> HAProxy server name."""
        return {nid: f"s{i}" for i, nid in enumerate(self.urls)}


@dataclass(frozen=True, slots=True)
class Launch:
    """What a router's start gets: its port, the nodes serving now, every slot, where files go,
    (fleetloop's HAProxy) the port its log goes to, and (a fleetloop arm) the broker and topics."""

    port: int
    initial: dict[str, str]  # node id -> URL, serving now
    slots: Slots
    logdir: Path
    log_port: int | None
    fleetloop: bool = False
    bootstrap: str | None = None
    topic_prefix: str = ""


class WorkerApi(Protocol):
    """A router's worker list over its HTTP API (what an endpoint list or fleetloop's actuator edits)."""

    async def list_workers(self) -> set[str]: ...
    async def add_worker(self, url: str) -> None: ...
    async def remove_worker(self, url: str) -> None: ...
    async def close(self) -> None: ...


class Router(Protocol):
    kind: ClassVar[str]
    probe: ClassVar[str]  # GET path that answers < 500 once the router serves

    def binaries(self) -> list[str]: ...
    def argv(self, launch: Launch) -> list[str]: ...
    def env(self, launch: Launch) -> dict[str, str] | None: ...  # None: the bench's own
    def worker_api(self, url: str) -> WorkerApi | None: ...
    def actuator(self, launch: Launch, url: str) -> list[str] | None: ...  # None: fleetloop is inside
    def wants_log_port(self, fleetloop: bool) -> bool: ...


def vllm_router_bin() -> str:
    here = Path(sys.executable).parent / "vllm-router"
    return str(here) if here.exists() else "vllm-router"


METRICS_PORT_FILE = "router-metrics.port"


def _prom_port(launch: Launch) -> int:
    """A free port for the router's Prometheus page, kept in the arm's log directory
    (:data:`METRICS_PORT_FILE`): a start retried on fresh ports picks again, and the actuator,
    started once the router answers, reads the port the running router has."""
    from fleetloop.bench.stack.procs import free_port  # noqa: PLC0415 - procs imports nothing of arms

    port = free_port()
    (launch.logdir / METRICS_PORT_FILE).write_text(f"{port}\n")
    return port


def _outcome_flags(launch: Launch) -> list[str]:
    """The actuator's flags that publish the router's per-worker outcome counts: neither router
    reports a call to fleetloop otherwise (docs/integrations/routers.md)."""
    port = int((launch.logdir / METRICS_PORT_FILE).read_text())
    return ["--metrics-url", f"http://127.0.0.1:{port}/metrics", "--model", launch.slots.model]


@dataclass(frozen=True, slots=True)
class VllmRouter:
    """``vllm-router --policy POLICY`` over the serving nodes, as it ships (its health checks,
    retries and circuit breaker). Peers: the endpoint list adds and removes workers through
    ``/add_worker`` and ``/remove_worker``; fleetloop: ``fleetloop actuate vllm-router``, which also
    publishes the router's per-worker outcome counts (its Prometheus page)."""

    policy: str
    kind: ClassVar[str] = "vllm-router"
    probe: ClassVar[str] = "/health"

    def binaries(self) -> list[str]:
        return [vllm_router_bin()]

    def argv(self, launch: Launch) -> list[str]:
        return [
            vllm_router_bin(), "--host", "127.0.0.1", "--port", str(launch.port),
            "--worker-urls", *launch.initial.values(), "--policy", self.policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_prom_port(launch)),
        ]  # fmt: skip

    def env(self, launch: Launch) -> dict[str, str] | None:
        return None

    def worker_api(self, url: str) -> WorkerApi | None:
        return VllmRouterApi(url)

    def actuator(self, launch: Launch, url: str) -> list[str]:
        wmap = launch.logdir / "workers.yaml"
        _write_yaml(wmap, {"pools": {launch.slots.pool_id: dict(launch.slots.urls)}})
        return ["actuate", "vllm-router", "--url", url, "--worker-map", str(wmap), *_outcome_flags(launch)]

    def wants_log_port(self, fleetloop: bool) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class Haproxy:
    """HAProxy ``balance BALANCE`` over every slot with HTTP health checks (a slot with no node
    fails its checks and takes no call: what DNS service discovery with health checks gives a
    HAProxy in front of an autoscaled pool). fleetloop: the runtime API and the request log for
    ``fleetloop actuate haproxy``, which keeps slots without a node in maintenance."""

    balance: str = "leastconn"
    no_delay: bool = True  # False only to measure what HAPROXY_STREAMING_DEFAULTS saves (--overhead)
    kind: ClassVar[str] = "haproxy"
    probe: ClassVar[str] = "/v1/models"

    def binaries(self) -> list[str]:
        return ["haproxy"]

    def argv(self, launch: Launch) -> list[str]:
        servers = launch.slots.servers()
        addr = [(servers[n], u.removeprefix("http://")) for n, u in launch.slots.urls.items()]
        cfg = launch.logdir / "haproxy.cfg"
        text = haproxy_config(launch.logdir, launch.port, launch.log_port, addr, self.balance)
        if not self.no_delay:
            text = text.replace(HAPROXY_STREAMING_DEFAULTS + "\n", "")
        cfg.write_text(text)
        return ["haproxy", "-db", "-f", str(cfg)]

    def env(self, launch: Launch) -> dict[str, str] | None:
        return None

    def worker_api(self, url: str) -> WorkerApi | None:
        return None  # its health checks over the slots find the nodes

    def actuator(self, launch: Launch, url: str) -> list[str]:
        bmap = launch.logdir / "backends.yaml"
        pool = {"backend": "nodes", "model": launch.slots.model, "servers": launch.slots.servers()}
        _write_yaml(bmap, {"pools": {launch.slots.pool_id: pool}})
        assert launch.log_port is not None
        return [
            "actuate", "haproxy", "--runtime-api", f"unix:{launch.logdir}/admin.sock",
            "--backend-map", str(bmap), "--log-listen", f"127.0.0.1:{launch.log_port}",
        ]  # fmt: skip

    def wants_log_port(self, fleetloop: bool) -> bool:
        return fleetloop


@dataclass(frozen=True, slots=True)
class SglangRouter:
    """SGLang's router (``sglang-router``) with ``--policy POLICY`` over the serving nodes, as it
    ships. Peers: the endpoint list edits its worker registry (``/workers``); fleetloop:
    ``fleetloop actuate sglang-router``, which also publishes its per-worker outcome counts."""

    policy: str
    kind: ClassVar[str] = "sglang-router"
    probe: ClassVar[str] = "/health"

    def binaries(self) -> list[str]:
        return [sys.executable]

    def argv(self, launch: Launch) -> list[str]:
        prom, serving = _prom_port(launch), list(launch.initial.values())
        return sglang_argv(serving, port=launch.port, prometheus_port=prom, policy=self.policy)

    def env(self, launch: Launch) -> dict[str, str] | None:
        return None

    def worker_api(self, url: str) -> WorkerApi | None:
        return SglangRouterApi(url)

    def actuator(self, launch: Launch, url: str) -> list[str]:
        wmap = launch.logdir / "workers.yaml"
        _write_yaml(wmap, {"pools": {launch.slots.pool_id: dict(launch.slots.urls)}})
        return ["actuate", "sglang-router", "--url", url, "--worker-map", str(wmap), *_outcome_flags(launch)]

    def wants_log_port(self, fleetloop: bool) -> bool:
        return False


# LiteLLM's proxy learns which deployments answer from its own background health checks (the
# documented way to keep unhealthy deployments out of routing without a database): every slot is a
# deployment, probed every 15 s (KEDA's polling period in the peers' autoscaler).
LITELLM_HEALTH_CHECK_S = 15


@dataclass(frozen=True, slots=True)
class Litellm:
    """LiteLLM's proxy with ``routing_strategy: STRATEGY``: one deployment per node slot, health-
    check routing on (a slot with no node fails its probe and is skipped), the client's ``x-``
    headers forwarded to the nodes (the emulated nodes read a prompt's size from them). fleetloop:
    the same proxy with fleetloop's callback in it (``fleetloop.edges.litellm``): it keeps the node
    fleetloop picks among LiteLLM's candidates and publishes every call's outcome; no actuator."""

    strategy: str
    kind: ClassVar[str] = "litellm"
    probe: ClassVar[str] = LIVENESS

    def binaries(self) -> list[str]:
        return [str(Path(sys.executable).parent / "litellm")]

    def argv(self, launch: Launch) -> list[str]:
        doc = proxy_config(
            launch.slots.urls, model=launch.slots.model, pool=launch.slots.pool_id, strategy=self.strategy,
            fleetloop=launch.fleetloop,
        )  # fmt: skip
        doc.setdefault("general_settings", {}).update(
            background_health_checks=True,
            health_check_interval=LITELLM_HEALTH_CHECK_S,
            enable_health_check_routing=True,
            forward_client_headers_to_llm_api=True,
        )
        cfg = launch.logdir / "litellm.yaml"
        _write_yaml(cfg, doc)
        return proxy_argv(cfg, launch.port)

    def env(self, launch: Launch) -> dict[str, str] | None:
        if launch.fleetloop:
            return proxy_env(bootstrap=launch.bootstrap, topic_prefix=launch.topic_prefix)
        return proxy_env()

    def worker_api(self, url: str) -> WorkerApi | None:
        return None  # its health checks over the slots find the nodes

    def actuator(self, launch: Launch, url: str) -> list[str] | None:
        return None  # fleetloop runs inside the proxy

    def wants_log_port(self, fleetloop: bool) -> bool:
        return False


def haproxy_config(
    tmp: Path, fe_port: int, log_port: int | None, servers: list[tuple[str, str]], balance: str = "leastconn"
) -> str:
    """``balance`` over the servers with HTTP health checks, streamed tokens forwarded at once
    (``HAPROXY_STREAMING_DEFAULTS``); with ``log_port``, the log line fleetloop's actuator reads."""
    timeout = "120s"
    glob = f"    stats socket {tmp}/admin.sock mode 600 level admin\n"
    if log_port is not None:
        glob += f"    log 127.0.0.1:{log_port} len 4096 local0\n"
    lines = [
        f"global\n{glob}    maxconn 4096",
        f"defaults\n    mode http\n{HAPROXY_STREAMING_DEFAULTS}\n"
        + ("    log global\n" if log_port is not None else "")
        + f"    timeout connect 1s\n    timeout client {timeout}\n    timeout server {timeout}\n"
        + "    timeout queue 5s",
        f"frontend fe\n    bind 127.0.0.1:{fe_port}\n"
        + (HAPROXY_FRONTEND_SNIPPET + "\n" if log_port is not None else "")
        + "    default_backend nodes",
        f"backend nodes\n    balance {balance}\n    option httpchk GET /health\n"
        + "".join(
            f"    server {name} {addr} weight 100 check inter 1s fall 2 rise 2\n" for name, addr in servers
        ),
    ]
    return "\n".join(lines) + "\n"


def _write_yaml(path: Path, doc: object) -> None:
    import yaml  # noqa: PLC0415 - only when an arm writes a map

    path.write_text(yaml.safe_dump(doc, sort_keys=True))


@dataclass(frozen=True, slots=True)
class Arm:
    name: str
    router: Router
    fleetloop: bool = False

    @property
    def policy(self) -> str:
        """The daemon's built-in policy: fleetloop's shipped default, or the autoscaling peers
        deploy (``modern``: KEDA on queue and KV; its routing and breaker reach nothing)."""
        return "default" if self.fleetloop else "modern"


# One line an arm. The same router spec in a peer and a fleetloop arm is "that router alone".
ARMS: tuple[Arm, ...] = (
    Arm("vllm-cache-aware", VllmRouter("cache_aware")),
    Arm("vllm-p2c", VllmRouter("power_of_two")),
    Arm("sglang-cache-aware", SglangRouter("cache_aware")),
    Arm("litellm-simple-shuffle", Litellm("simple-shuffle")),
    Arm("litellm-least-busy", Litellm("least-busy")),
    Arm("litellm-latency", Litellm("latency-based-routing")),
    Arm("haproxy-leastconn", Haproxy("leastconn")),
    Arm("fleetloop-vllm", VllmRouter("cache_aware"), fleetloop=True),
    Arm("fleetloop-sglang", SglangRouter("cache_aware"), fleetloop=True),
    Arm("fleetloop-litellm", Litellm("simple-shuffle"), fleetloop=True),
    Arm("fleetloop-haproxy", Haproxy("leastconn"), fleetloop=True),
)
BY_NAME = {a.name: a for a in ARMS}


def alone_all(arm: Arm) -> list[Arm]:
    """Every peer arm running the router a fleetloop arm drives, alone, whatever its strategy
    (vllm-router's cache_aware and power_of_two, LiteLLM's three)."""
    return [a for a in ARMS if not a.fleetloop and a.router.kind == arm.router.kind]


def peer_scale_in_hold_s(arms: list[Arm]) -> float | None:
    """How long after its first sync the peers' autoscaler keeps at least the nodes it started with:
    the scale-down stabilization window of their policy's HPA (``modern``: Kubernetes' default,
    300 s), unshortened, as a real KEDA deployment runs it (KEDA's ``cooldownPeriod``, also 300 s,
    only governs scaling to zero, which a pool's minimum rules out). None without a peer arm, or
    when the peers' autoscaler is no HPA."""
    from fleetloop.policies.autoscale.hpa import SyncParams  # noqa: PLC0415 - only for a run's note
    from fleetloop.policies.registry import builtin_policy  # noqa: PLC0415 - see above

    policies = sorted({a.policy for a in arms if not a.fleetloop})
    params = [builtin_policy(name).sections["autoscale"].params for name in policies]
    windows = [p.scale_down.stabilization_window_s for p in params if isinstance(p, SyncParams)]
    return float(max(windows)) if windows else None


def missing_binaries(arms: list[Arm]) -> list[str]:
    need = sorted({b for a in arms for b in a.router.binaries()})
    return [b for b in need if shutil.which(b) is None and not Path(b).exists()]
