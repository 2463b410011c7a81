"""Start a LiteLLM proxy on loopback in front of a set of nodes, with or without fleetloop: what a
bench arm or a test needs, and nothing LiteLLM would fetch from outside the machine.

::

    from fleetloop.edges.litellm import launch
    cfg = launch.write_config(path, nodes, model="llama-8b", pool="chat-l40s",
                              strategy="least-busy", fleetloop=True)
    argv = launch.proxy_argv(cfg, port)                       # the `litellm` command of this venv
    env = launch.proxy_env(bootstrap="127.0.0.1:9092", topic_prefix="", fail_static_s=30)
    # spawn argv with env; ready when GET http://127.0.0.1:PORT/health/liveliness answers 200;
    # clients call http://127.0.0.1:PORT/v1 with the api key MASTER_KEY (any key without one)

``nodes`` is ``{node_id: "http://127.0.0.1:PORT"}`` (the emulated fleet's ``urls()``): one
``model_list`` entry per node, ``openai/<model>`` at the node's ``/v1``, its ``model_info`` naming
the node and pool for fleetloop. ``strategy`` is LiteLLM's own ``routing_strategy`` (its peer arms:
``simple-shuffle``, ``least-busy``, ``latency-based-routing``, ...); with ``fleetloop=True`` the
callback keeps only the node fleetloop picks, so the strategy only breaks ties fleetloop leaves.
``num_retries`` (default 0: the agents retry) and ``timeout_s`` go to LiteLLM's router settings;
its cooldowns stay as it ships them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from fleetloop.edges.litellm.mapping import NODE_KEY, POOL_KEY

CALLBACK = "fleetloop.edges.litellm.proxy.handler"
STRATEGIES = (
    "simple-shuffle",
    "least-busy",
    "latency-based-routing",
    "usage-based-routing-v2",
    "cost-based-routing",
)
LIVENESS = "/health/liveliness"


def proxy_config(
    nodes: Mapping[str, str],
    *,
    model: str,
    pool: str,
    strategy: str = "simple-shuffle",
    fleetloop: bool = False,
    master_key: str | None = None,
    num_retries: int = 0,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """The proxy's ``config.yaml`` as a mapping."""
    if strategy not in STRATEGIES:
        raise ValueError(f"LiteLLM routing strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    model_list = [
        {
            "model_name": model,
            "litellm_params": {
                "model": f"openai/{model}",
                "api_base": f"{url.rstrip('/')}/v1",
                "api_key": "none",
            },
            "model_info": {"id": node_id.replace("/", "-"), NODE_KEY: node_id, POOL_KEY: pool},
        }
        for node_id, url in sorted(nodes.items())
    ]
    router: dict[str, Any] = {"routing_strategy": strategy, "num_retries": num_retries}
    if timeout_s is not None:
        router["timeout"] = timeout_s
    litellm: dict[str, Any] = {"num_retries": num_retries}
    if fleetloop:
        litellm["callbacks"] = [CALLBACK]
    doc: dict[str, Any] = {"model_list": model_list, "router_settings": router, "litellm_settings": litellm}
    if master_key is not None:
        doc["general_settings"] = {"master_key": master_key}
    return doc


def write_config(path: Path, nodes: Mapping[str, str], **kw: Any) -> Path:
    """:func:`proxy_config` written to ``path`` (returned)."""
    path.write_text(yaml.safe_dump(proxy_config(nodes, **kw), sort_keys=False))
    return path


def proxy_argv(config: Path, port: int, host: str = "127.0.0.1") -> list[str]:
    """The LiteLLM proxy of this interpreter's environment on ``host:port``, one worker."""
    litellm = Path(sys.executable).parent / "litellm"
    return [str(litellm), "--config", str(config), "--host", host, "--port", str(port), "--num_workers", "1"]


def proxy_env(
    *,
    bootstrap: str | None = None,
    topic_prefix: str = "",
    fail_static_s: float | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The proxy's environment: ``base`` (default: this process's) with LiteLLM kept on the machine
    (its model price map from the copy in the wheel, not fetched), a proxy without a master key
    allowed (loopback only), and fleetloop's callback settings when ``bootstrap`` is given."""
    env = dict(os.environ if base is None else base)
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env["LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY"] = "true"
    env.setdefault("PYTHONUNBUFFERED", "1")
    if bootstrap is not None:
        env["FLEETLOOP_BOOTSTRAP_SERVERS"] = bootstrap
        env["FLEETLOOP_TOPIC_PREFIX"] = topic_prefix
        if fail_static_s is not None:
            env["FLEETLOOP_FAIL_STATIC_S"] = str(fail_static_s)
    return env
