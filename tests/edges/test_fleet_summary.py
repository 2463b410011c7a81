"""`fleetloop fleet`'s summary accounts for every task it started: one still in flight when the run
ended is ``unfinished`` and counts against the success rate, which is over tasks started (as the
simulator's, fleetloop/sim/accounting.py)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from fleetloop.cli.main import main
from fleetloop.edges.fleet.agents import Agents, AgentStats
from fleetloop.edges.fleet.command import _print


def test_unfinished_tasks_count_against_the_success_rate(capsys: pytest.CaptureFixture[str]) -> None:
    s = AgentStats(tasks_started=8, tasks_succeeded=2, p0_started=3, p0_succeeded=1, p0_failed=1)
    t = s.summary()["tasks"]
    assert (t["started"], t["succeeded"], t["failed"], t["unfinished"]) == (8, 2, 0, 6)
    assert t["success_rate"] == 0.25
    assert (t["p0_started"], t["p0_unfinished"], t["p0_success_rate"]) == (3, 1, 0.3333)
    assert AgentStats().summary()["tasks"]["success_rate"] is None
    run = {
        "scenario": "s",
        "seconds": 3.0,
        "scale": 1,
        "nodes": {"provisioned": 1},
        "realtime_lag": {
            "node_events": {"p50_ms": 0, "p99_ms": 0, "max_ms": 0, "n": 0},
            "event_loop": {"p50_ms": 0, "p99_ms": 0, "max_ms": 0},
        },
        "aborted_by_disconnect": 6,
        "decisions_applied": 0,
        "faults": [],
        **s.summary(),
    }
    _print(run)
    out = " ".join(capsys.readouterr().out.split())
    assert "unfinished" in out
    assert "8 / 2 / 0 / 6" in out
    assert "25.0%" in out


def _short_run(seconds: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """``fleetloop fleet`` on steady-chat for ``seconds``, no drain: its summary's tasks."""
    argv = [
        "fleet",
        "--scenario",
        "scenarios/steady-chat.yaml",
        "--seconds",
        seconds,
        "--drain-s",
        "0",
        "--json",
    ]
    assert main(argv) == 0
    tasks: dict[str, Any] = json.loads(capsys.readouterr().out)["tasks"]
    return tasks


def test_a_short_run_reports_every_started_task(capsys: pytest.CaptureFixture[str]) -> None:
    t = _short_run("1.5", capsys)
    assert t["started"] > 0
    assert t["started"] == t["succeeded"] + t["failed"] + t["unfinished"]
    assert t["success_rate"] == round(t["succeeded"] / t["started"], 4)


def test_the_agents_send_work_for_the_whole_window_however_slow_the_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--seconds`` is how long the agents send work, counted from when they begin. It was counted
    from when the fleet started listening, so what setting up took (the nodes, the HTTP client;
    0.16 s here idle, 0.65-0.86 s at load 8, more at 16) came off the window: a 1.5 s run at load 16
    started no task. Here the set-up is made to take longer than the window."""
    made = Agents.__init__

    def slow(self: Agents, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        time.sleep(0.6)  # a set-up this slow: longer than the run's whole window (0.5 s)

    monkeypatch.setattr(Agents, "__init__", slow)
    assert _short_run("0.5", capsys)["started"] > 0
