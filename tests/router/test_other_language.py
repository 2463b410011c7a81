"""The worked example of docs/integrations/routers.md: a router in JavaScript written from
schemas/json/ picks what the Python library picks, given the same control.state records and the
same random draws."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from fleetloop.router import Endpoint, Router
from fleetloop.schemas.decisions import (
    AutoscaleDecision,
    BreakerDecision,
    Decision,
    PolicyStamp,
    RoutingDecision,
)
from tests.support.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
ENFORCE = PolicyStamp(name="default", version=3, hash="0123456789abcdef", mode="enforce")
SHADOW = ENFORCE.model_copy(update={"mode": "shadow"})


class Draws:
    """Stands in for the generator: hands the library the draw the JS router is given."""

    u = 0.0

    def random(self) -> float:
        return self.u


def _records() -> list[Decision]:
    def routing(tick: int, weights: dict[str, float], policy: PolicyStamp = ENFORCE, **kw: Any) -> Decision:
        body = RoutingDecision(entity="pool/chat", reason="r", pool_id="chat", weights=weights, **kw)
        return Decision(ts_ms=tick, tick_id=tick, policy=policy, body=body)

    def breaker(tick: int, node: str, **kw: Any) -> Decision:
        body = BreakerDecision(entity=node, reason="r", pool_id="chat", node_id=node, **kw)
        return Decision(ts_ms=tick, tick_id=tick, policy=ENFORCE, body=body)

    def autoscale(tick: int, drain: tuple[str, ...]) -> Decision:
        body = AutoscaleDecision(
            entity="pool/chat", reason="r", pool_id="chat", current_nodes=6, desired_nodes=5, drain=drain
        )
        return Decision(ts_ms=tick, tick_id=tick, policy=ENFORCE, body=body)

    w = {"chat/0": 0.2, "chat/1": 0.5, "chat/2": 0.25, "chat/3": 0.05, "chat/10": 0.0, "chat/4": 0.3}
    return [
        routing(
            5,
            w,
            by_priority={"0": {"chat/1": 1.0, "chat/3": 1.0}, "2": {}},
            prefix_affinity={"d1": ("chat/0", "chat/4", "chat/2"), "d2": ("chat/10", "chat/3")},
        ),
        routing(4, {"chat/0": 1.0}),  # older tick: dropped
        routing(9, {"chat/0": 1.0}, SHADOW),  # shadow: never acts
        breaker(5, "chat/0", state="open"),
        breaker(5, "chat/2", state="open", enforced=False),  # detected only: still routable
        breaker(6, "chat/3", state="half_open", probe_frac=0.05),
        autoscale(5, ("chat/1",)),
        autoscale(7, ("chat/4",)),  # the newest list: chat/1 back in rotation, chat/4 out
        autoscale(6, ("chat/2",)),  # older tick: dropped
    ]


def test_javascript_router_picks_what_the_library_picks() -> None:
    node = require_tool("node")
    records = _records()
    rng = np.random.default_rng(11)
    picks = [
        {
            "pool": "chat",
            "priority": int(rng.integers(0, 3)),
            "digest": [None, "d1", "d2", "zz"][int(rng.integers(0, 4))],
            "u": float(rng.random()),
        }
        for _ in range(300)
    ]
    lines = [orjson.dumps({"key": d.key, "value": d.model_dump(mode="json")}) for d in records]
    lines.insert(2, b'{"value": {"ts_ms": 1, "tick_id": 99, "policy": {}, "body": {"kind": "routing"}}}')
    lines += [orjson.dumps({"pick": p}) for p in picks]
    proc = subprocess.run(
        [node, str(ROOT / "examples" / "router-js" / "router.mjs")],
        input=b"\n".join(lines) + b"\n",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert "dropped a record: routing: missing entity" in proc.stderr.decode()
    js = [orjson.loads(line)["node"] for line in proc.stdout.splitlines() if line.strip()]

    eps = {f"chat/{i}": Endpoint(node_id=f"chat/{i}", pool_id="chat") for i in (0, 1, 2, 3, 4, 10)}
    draws = Draws()
    router: Router[Endpoint] = Router(
        {"m": ("chat",)},
        draws,
        members={"chat": list(eps.values())},
        nodes=eps,  # type: ignore[arg-type]
    )
    router.apply(records, 0.0)
    py = []
    for p in picks:
        draws.u = p["u"]
        r = router.pick(("m",), p["priority"], p["digest"], new_task=False, budget_ms=1000, now_s=1.0)
        py.append(r.node.node_id if r.node is not None else None)
    assert js == py
    assert set(py) == {"chat/1", "chat/2", "chat/3"}  # chat/0 ejected, chat/10 weightless, chat/4 drained
    router = ROOT / "examples" / "router-js" / "router.mjs"
    assert len(router.read_text().splitlines()) < 100  # the doc: "under 100 lines"
