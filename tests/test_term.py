"""Output into a pipe or a file keeps whole node ids and whole lines (``fleetloop.term``)."""

from __future__ import annotations

import io
import sys

import pytest
from fleetloop import term
from rich.table import Table


def _render(monkeypatch: pytest.MonkeyPatch, *, columns: str | None = None) -> str:
    buf = io.StringIO()  # not a terminal, as a pipe or a log file
    monkeypatch.setattr(sys, "stdout", buf)
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    out = term.console()
    status = "fleetloop scrape: 3 targets (pool chat-l40s) every 1 s, publishing to fleet.telemetry"
    out.print(f"{status} on 127.0.0.1:9092")
    t = Table()
    t.add_column("node")
    t.add_column("last error")
    for i in range(3):
        t.add_row(f"chat-l40s/127.0.0.1:1860{i}", "connection refused by 127.0.0.1 while reading /metrics")
    out.print(t)
    return buf.getvalue()


def test_a_pipe_gets_whole_node_ids_and_unbroken_status_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _render(monkeypatch)
    for i in range(3):
        assert f"chat-l40s/127.0.0.1:1860{i}" in text  # at 80 columns rich cut them to "chat-l…"
    assert "connection refused by 127.0.0.1 while reading /metrics" in text
    first = text.splitlines()[0]
    assert first.endswith("on 127.0.0.1:9092")  # one line, not broken at column 80


def test_columns_set_by_the_user_is_the_width(monkeypatch: pytest.MonkeyPatch) -> None:
    assert term.pipe_width({"COLUMNS": "120"}) == 120
    assert term.pipe_width({"COLUMNS": "0"}) == term.PIPE_WIDTH
    assert term.pipe_width({"COLUMNS": "wide"}) == term.PIPE_WIDTH
    assert term.pipe_width({}) == term.PIPE_WIDTH
    narrow = _render(monkeypatch, columns="60")
    assert max(len(line) for line in narrow.splitlines() if line.startswith(("┏", "│", "└"))) <= 60
