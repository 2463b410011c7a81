"""The ledger's let-go rule as its statement: entry by entry from the front of each dict, what
``LedgerBook._let_go_workflows`` (one pass over each dict) is held to (``tests/unit/test_let_go.py``)."""

from __future__ import annotations

from fleetloop.core.model.fleet import FleetModel
from fleetloop.core.model.ledger import handoff_horizon_ms


def let_go_workflows_plain(model: FleetModel, now: int) -> None:
    """Forget finished tasks past their ttl and let go of open ones quiet past the handoff horizon
    (handed off), both from the front of their insertion-ordered dicts."""
    cfg = model.config
    ledger = model.ledger
    finished = ledger.finished
    ttl = cfg.finished_workflow_ttl_ms
    while finished:
        wf_id = next(iter(finished))
        if now - finished[wf_id] <= ttl:
            break
        del finished[wf_id]
        model.evicted["finished_workflows"] += 1
    quiet = handoff_horizon_ms(ledger.gaps, cfg)
    model._let_go_active(now, quiet, len(ledger.active))
