"""LiteLLM's deployments and requests in fleetloop's terms. Pure: no LiteLLM, no Kafka, no clock.

**Deployment -> node and pool.** A ``model_list`` entry is one fleetloop node when its
``model_info`` names it, or when the deployment map names its ``api_base``:

```yaml
model_list:
  - model_name: llama-8b                     # the model group: the calls' model
    litellm_params: {model: openai/llama-8b, api_base: http://10.0.0.7:8000/v1}
    model_info: {fleetloop_node: chat-l40s/0, fleetloop_pool: chat-l40s}
```

``fleetloop_pool`` defaults to the deployment map's pool for the model group, then to the model
group's name. The deployment map (``FLEETLOOP_LITELLM_MAP``, for a ``model_list`` one would rather
not edit) is ``{deployments: {API_BASE: NODE_ID, ...}, pools: {MODEL_GROUP: POOL_ID, ...}}``; an
``api_base`` matches with or without its trailing ``/``. A deployment neither names is not
fleetloop's: a model group with one is left to LiteLLM's own strategy, and its calls' outcomes are
not published (they could not be attributed to a node).

**Request -> call.** A call's task, step, tenant and priority come from the ``x-fleetloop-*``
request headers (:mod:`fleetloop.edges.headers`; LiteLLM's proxy keeps a request's headers in its
metadata) or, for the SDK, from ``metadata={"fleetloop": {"task": ..., "priority": ...}}`` with the
same names (``budget-ms`` or ``budget_ms``); metadata wins over a header.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetloop.edges.headers import HEADERS, PREFIX, CallHeaders, call_headers
from fleetloop.user_input import UserInputError, read_yaml

NODE_KEY = "fleetloop_node"
POOL_KEY = "fleetloop_pool"
METADATA_KEY = "fleetloop"


class DeploymentMapError(ValueError):
    """A deployment map fleetloop cannot use (one line)."""


@dataclass(frozen=True, slots=True)
class DeploymentMap:
    deployments: Mapping[str, str] = field(default_factory=dict)  # api_base (no trailing /) -> node id
    pools: Mapping[str, str] = field(default_factory=dict)  # model group -> pool id


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one deployment sends its calls in fleetloop's terms."""

    node_id: str
    pool_id: str
    model: str  # the model group


def _base(url: object) -> str:
    return str(url).rstrip("/") if url else ""


def load_deployment_map(path: str | Path) -> DeploymentMap:
    """``{deployments: {api_base: node id}, pools: {model group: pool id}}`` (either may be left out)."""
    try:
        doc = read_yaml(path)
    except UserInputError as exc:
        raise DeploymentMapError(f"FLEETLOOP_LITELLM_MAP {exc}") from None
    if not isinstance(doc, dict) or not set(doc) <= {"deployments", "pools"}:
        raise DeploymentMapError(f"FLEETLOOP_LITELLM_MAP {path}: want a mapping of 'deployments' and 'pools'")
    out: dict[str, dict[str, str]] = {}
    for key in ("deployments", "pools"):
        table = doc.get(key) or {}
        if not isinstance(table, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in table.items()
        ):
            raise DeploymentMapError(f"FLEETLOOP_LITELLM_MAP {path}: {key}: want name -> name")
        out[key] = {(_base(k) if key == "deployments" else k): v for k, v in table.items()}
    return DeploymentMap(out["deployments"], out["pools"])


def placement_of(deployment: Mapping[str, Any], dmap: DeploymentMap) -> Placement | None:
    """The node and pool of a ``model_list`` entry (``model_name``, ``litellm_params``,
    ``model_info``), or None when it is not fleetloop's."""
    info = deployment.get("model_info") or {}
    params = deployment.get("litellm_params") or {}
    group = str(deployment.get("model_name") or "")
    node = info.get(NODE_KEY) if isinstance(info, Mapping) else None
    if not node and isinstance(params, Mapping):
        node = dmap.deployments.get(_base(params.get("api_base")))
    if not node or not group:
        return None
    pool = (info.get(POOL_KEY) if isinstance(info, Mapping) else None) or dmap.pools.get(group) or group
    return Placement(str(node), str(pool), group)


def request_metadata(request: Mapping[str, Any]) -> Mapping[str, Any]:
    """The request's metadata (LiteLLM keeps it under ``metadata`` or, on some endpoints,
    ``litellm_metadata``)."""
    for key in ("metadata", "litellm_metadata"):
        md = request.get(key)
        if isinstance(md, Mapping) and md:
            return md
    return {}


def call_of(request: Mapping[str, Any], *, call_id: str, default_priority: int) -> CallHeaders:
    """What the request says of its call: ``x-fleetloop-*`` headers under the metadata's ``headers``,
    overridden by its ``fleetloop`` mapping; ``call_id`` (LiteLLM's) is the request id by default."""
    md = request_metadata(request)
    values: dict[str, str] = {}
    headers = md.get("headers")
    if isinstance(headers, Mapping):
        for k, v in headers.items():
            name = str(k).lower()
            if name.startswith(PREFIX) and name[len(PREFIX) :] in HEADERS:
                values[name[len(PREFIX) :]] = str(v)
    ours = md.get(METADATA_KEY)
    if isinstance(ours, Mapping):
        for k, v in ours.items():
            name = str(k).replace("_", "-")
            if name in HEADERS and v is not None:
                values[name] = str(v)
    return call_headers(values, request_id=call_id, default_priority=default_priority)
