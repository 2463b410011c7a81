"""docs/operations.md's account of ``/api/state`` (the live page's data, and a script's) is what the endpoint
serves: every key the doc names is one the endpoint has, every key the endpoint has is named,
and the doc's bounds and order are the live view's."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from fleetloop.daemon.service.live import HISTORY, RECENT, LiveView, add_routes, ledger_of
from fleetloop.schemas.decisions import BreakerDecision, Decision, PolicyStamp, RoutingDecision

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
STAMP = PolicyStamp(name="p", version=2, hash="0123456789abcdef", mode="enforce")


def api_state_doc() -> str:
    """The doc's sentences about ``/api/state``: from its first mention to the end of the item."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("`/api/state`")
    return " ".join(text[start : text.index("\n- **", start)].split())


def decisions(tick: int) -> list[Decision]:
    inputs = {f"in{i}": float(i) for i in range(8)}
    bodies: list[Any] = [
        RoutingDecision(entity=f"pool/{p}", reason="r", pool_id=p, weights={f"{p}/0": 1.0}, inputs=inputs)
        for p in ("b", "a")
    ]
    bodies.append(BreakerDecision(entity="a/0", reason="r", pool_id="a", node_id="a/0", state="open"))
    return [Decision(ts_ms=1_000 * tick, tick_id=tick, policy=STAMP, body=b) for b in bodies]


async def served() -> dict[str, Any]:
    ledger = SimpleNamespace(tasks_started=4, tasks_succeeded=3, tasks_failed=1, fleet_cost_nusd=9e9)
    daemon = SimpleNamespace(shards={0: SimpleNamespace(model=SimpleNamespace(ledger=ledger))})
    view = LiveView(ledger_of(daemon))
    for tick in (1, 2):
        view.record(decisions(tick))
    app = web.Application()
    add_routes(view)(app)
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/api/state")
        assert response.status == 200
        assert response.content_type == "application/json"
        state: dict[str, Any] = await response.json()
        return state


async def test_the_readme_names_what_api_state_serves_and_nothing_else() -> None:
    state = await served()
    doc = api_state_doc()
    named = set(re.findall(r"`([a-z_]+)`", doc))
    policy, recent, kpi = set(state["policy"]), set(state["recent"][0]), set(state["kpi"][0])
    per_entity = {"tick_id", "ts_ms"}
    assert per_entity <= set(state["routing"][0])
    for keys in (set(state), policy, recent, kpi, per_entity):
        assert keys <= named, f"served but not in docs/operations.md: {sorted(keys - named)}"
    served_keys = set(state) | policy | recent | kpi | per_entity
    assert named <= served_keys, f"in docs/operations.md but not served: {sorted(named - served_keys)}"


async def test_the_readme_s_bounds_and_order_are_the_live_view_s() -> None:
    state = await served()
    doc = api_state_doc()
    assert f"the last {RECENT} decisions, newest first" in doc
    assert f"the last {HISTORY}:" in doc
    assert "up to six `inputs`" in doc
    assert max(len(r["inputs"]) for r in state["recent"]) == 6
    assert [r["tick_id"] for r in state["recent"]] == sorted(
        (r["tick_id"] for r in state["recent"]), reverse=True
    )
    assert "sorted by entity" in doc
    assert [r["entity"] for r in state["routing"]] == ["pool/a", "pool/b"]
    assert "one sample per decided tick" in doc
    assert len(state["kpi"]) == 2
