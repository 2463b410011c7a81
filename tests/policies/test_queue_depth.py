"""queue-depth: static per-class shed thresholds, lower for the first call of a task."""

from __future__ import annotations

import pytest
from fleetloop.policies.admission.queue_depth import QueueDepth, QueueDepthParams, thresholds
from fleetloop.schemas.decisions import AdmissionDecision
from pydantic import ValidationError
from tests.policies.snapshots import ctx, node, snapshot


@pytest.mark.parametrize(
    ("params", "running", "new_task"),
    [
        ({}, {"0": 64, "1": 32, "2": 16}, {"0": 48, "1": 24, "2": 12}),
        (
            {"depth_p0": 10, "priority_factor": 0.5, "classes": 4},
            {"0": 10, "1": 5, "2": 2, "3": 2},
            {"0": 7, "1": 3, "2": 2, "3": 2},
        ),
        (
            {"depth_p0": 4, "priority_factor": 0.05, "min_depth": 3},
            {"0": 4, "1": 3, "2": 3},
            {"0": 3, "1": 3, "2": 3},
        ),
        ({"new_task_factor": 1.0, "classes": 1}, {"0": 64}, {"0": 64}),
    ],
)
def test_thresholds_formula(
    params: dict[str, float], running: dict[str, int], new_task: dict[str, int]
) -> None:
    assert thresholds(QueueDepthParams(**params)) == (running, new_task)


def test_decision_carries_thresholds_and_deepest_queue() -> None:
    snap = snapshot(
        [node("a", queue_depth=7), node("b", queue_depth=21), node("x", pool_id="q", queue_depth=99)]
    )
    (d,) = QueueDepth().decide(snap, QueueDepthParams(), None, ctx(snap)).decisions
    assert isinstance(d, AdmissionDecision)
    assert (d.pool_id, d.reason) == ("p", "static-thresholds")
    assert d.max_queue_depth == {"0": 64, "1": 32, "2": 16}
    assert d.new_task_max_queue_depth == {"0": 48, "1": 24, "2": 12}
    assert d.inputs == {"max_queue_depth_seen": 21.0}


def test_param_bounds() -> None:
    with pytest.raises(ValidationError):
        QueueDepthParams(depth_p0=0)
    with pytest.raises(ValidationError):
        QueueDepthParams(priority_factor=0.01)
