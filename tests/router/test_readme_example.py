"""The router-library example of docs/integrations/routers.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
from fleetloop.schemas.decisions import BreakerDecision, Decision, PolicyStamp, RoutingDecision

ROOT = Path(__file__).resolve().parents[2]
STAMP = PolicyStamp(name="default", version=1, hash="0" * 16, mode="enforce")


def test_readme_router_example_runs() -> None:
    doc = (ROOT / "docs" / "integrations" / "routers.md").read_text()
    section = doc[doc.index("## `fleetloop.router`") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    records = [
        Decision(
            ts_ms=1,
            tick_id=4,
            policy=STAMP,
            body=RoutingDecision(
                entity="pool/chat",
                reason="r",
                pool_id="chat",
                weights={"chat/0": 0.5, "chat/1": 0.5, "chat/2": 0.0},
            ),
        ),
        Decision(
            ts_ms=1,
            tick_id=4,
            policy=STAMP,
            body=BreakerDecision(entity="chat/0", reason="r", pool_id="chat", node_id="chat/0", state="open"),
        ),
    ]
    state = [orjson.dumps(d.model_dump(mode="json")) for d in records]
    exec(compile(code.group(1), "routers.md", "exec"), {"STATE_RECORDS": state})
