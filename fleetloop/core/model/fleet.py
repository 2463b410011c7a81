"""The fleet model: a pure reducer over telemetry and request outcomes, keyed by event time.

``apply(model, events) -> model`` folds a batch; ``snapshot(model, now_ms, ...)`` freezes what the
policies see at a tick. No I/O, no clock: ``now_ms`` is the tick's event time. One room each:

- :mod:`~fleetloop.core.model.state`: what the model keeps, its clocks, caps and evictions;
- :mod:`~fleetloop.core.model.fold`: folding telemetry and outcomes into it, a batch at a time;
- :mod:`~fleetloop.core.model.ledger`: the workflow ledger between calls (its clock, handoffs);
- :mod:`~fleetloop.core.model.snapshot`: the snapshot, built as columns;
- :mod:`~fleetloop.core.model.windows`: event-time windows.

``apply`` takes ownership of the model it is given and returns it (updating in place keeps the hot
path free of copies); callers never keep a reference to the old one.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import groupby

from fleetloop.core.model.fold import Folds
from fleetloop.core.model.ledger import GAP_MIN_SAMPLES, GAP_QUANTILE, handoff_horizon_ms
from fleetloop.core.model.snapshot import ledger_view, snapshot
from fleetloop.core.model.state import (
    CAPPED,
    FAILED_OUTCOMES,
    GAP_EDGES_MS,
    N_PRIORITIES,
    NANO,
    OUTCOME_TYPES,
    PARTIAL_TENANTS,
    PARTIAL_UNPLACED,
    TELEMETRY_TYPES,
    ModelConfig,
    _Ledger,
    _Node,
    _Pool,
    _Tenant,
    _Workflow,
    nano_usd,
)
from fleetloop.schemas.fast import Outcome, Telemetry

__all__ = [
    "CAPPED",
    "FAILED_OUTCOMES",
    "GAP_EDGES_MS",
    "GAP_MIN_SAMPLES",
    "GAP_QUANTILE",
    "NANO",
    "N_PRIORITIES",
    "OUTCOME_TYPES",
    "PARTIAL_TENANTS",
    "PARTIAL_UNPLACED",
    "TELEMETRY_TYPES",
    "FleetModel",
    "ModelConfig",
    "_Ledger",
    "_Node",
    "_Pool",
    "_Tenant",
    "_Workflow",
    "apply",
    "handoff_horizon_ms",
    "ledger_view",
    "nano_usd",
    "snapshot",
]


class FleetModel(Folds):
    """Mutable state behind :func:`apply`; read it only through :func:`snapshot`. Its state, clocks
    and caps: :class:`~fleetloop.core.model.state.ModelState`; its folds:
    :class:`~fleetloop.core.model.fold.Folds`; its ledger:
    :class:`~fleetloop.core.model.ledger.LedgerBook`."""

    __slots__ = ()


def _is_telemetry(e: Telemetry | Outcome) -> bool:
    return isinstance(e, TELEMETRY_TYPES)


def apply(model: FleetModel, events: Iterable[Telemetry | Outcome]) -> FleetModel:
    """Fold events into the model in order and return it: each run of records of one kind in one
    batch fold (records refused by a cap are counted in ``model.refused``; a record the fold cannot
    take raises, what came before it folded). Events are pydantic wire models or their msgspec
    twins, alike."""
    for is_telemetry, run in groupby(events, key=_is_telemetry):
        if is_telemetry:
            model.fold_telemetries(list(run), catch=False)  # type: ignore[arg-type]
        else:
            model.fold_outcomes(list(run), catch=False)  # type: ignore[arg-type]
    return model
