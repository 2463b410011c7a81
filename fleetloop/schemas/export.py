"""Export the JSON Schema of every wire model to ``schemas/json/`` (for routers and workers in other
languages). ``python -m fleetloop.schemas.export`` rewrites the files; a test fails on drift."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from fleetloop.schemas.control import ActivePolicy, Tick
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.policy import PolicyDocument
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.summary import ShardSummary
from fleetloop.schemas.telemetry import NodeTelemetry

EXPORTED: tuple[type[BaseModel], ...] = (
    NodeTelemetry,
    RequestOutcome,
    Tick,
    PolicyDocument,
    Decision,
    ActivePolicy,
    ShardSummary,
)
JSON_DIR = Path(__file__).parent / "json"


def rendered() -> dict[str, str]:
    """File name -> canonical JSON text for every exported model."""
    return {
        f"{model.__name__}.json": json.dumps(model.model_json_schema(), indent=2, sort_keys=True) + "\n"
        for model in EXPORTED
    }


def main() -> int:
    JSON_DIR.mkdir(exist_ok=True)
    for name, text in rendered().items():
        (JSON_DIR / name).write_text(text)
        sys.stdout.write(f"wrote {JSON_DIR / name}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
