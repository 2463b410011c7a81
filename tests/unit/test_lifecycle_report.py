"""``policy apply`` / ``rollback`` outcomes: a timeout or a refusal is never worded as a success."""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.daemon.lifecycle import _report

OUT: dict[str, Any] = {"name": "default", "version": 4, "hash": "5cf259e8c4e24a86", "group": "fleetloop"}


def test_a_timeout_names_the_command_not_the_past_tense(capsys: pytest.CaptureFixture[str]) -> None:
    out = {**OUT, "offset": 7, "error": "not activated within 10 s (is a daemon of group fleetloop running?)"}
    assert _report(1, out, False, "applied", "apply") == 1
    got = capsys.readouterr()
    assert got.out == ""
    assert got.err.startswith("fleetloop policy apply: published default v4")
    assert "applied" not in got.err
    assert got.err.count("\n") == 1


def test_a_refusal_names_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert _report(1, {**OUT, "refused": "params: bad"}, False, "rolled back", "rollback") == 1
    assert capsys.readouterr().err.startswith("fleetloop policy rollback: the daemon refused default v4")


def test_an_activation_is_reported_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert _report(0, {**OUT, "activated": True, "from_tick_id": 12}, False, "applied", "apply") == 0
    assert capsys.readouterr().out.startswith("applied  default v4")
