"""``fleetloop bench checkpoint`` prints its figures at a small size, and fails when a decoded
checkpoint does not encode back to the same bytes (a restore that is not exact)."""

from __future__ import annotations

import json

import pytest
from fleetloop.bench import checkpoint as bench
from fleetloop.cli.main import main
from fleetloop.core import checkpoint

FIGURES = (
    "bytes",
    "json_bytes",
    "json_documents",
    "largest_json_bytes",
    "chunks",
    "encode_ms",
    "decode_ms",
    "loop_stall_inline_ms",
    "loop_stall_forked_ms",
    "restore_stall_inline_ms",
    "restore_stall_thread_ms",
    "restore_stall_thread_gc_held_ms",
)


def test_bench_checkpoint_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "checkpoint", "--nodes", "64", "--seconds", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (row,) = out["sizes"]
    assert row["nodes"] == 64
    assert row["pools"] >= 1
    assert all(row[k] >= 0 for k in FIGURES), row
    assert row["bytes"] > 0
    assert row["chunks"] >= 1
    assert row["json_bytes"] > row["bytes"]  # compressed
    assert 0 < row["largest_json_bytes"] <= row["json_bytes"]
    assert row["restore_exact"] is True


def test_bench_checkpoint_fails_when_a_restore_is_not_exact(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = checkpoint.decode

    def lossy(blob: bytes) -> object:
        value = real(blob)
        value["ticks_at"] += 1  # one field off after the round trip
        return value

    monkeypatch.setattr(bench.checkpoint, "decode", lossy)
    assert main(["bench", "checkpoint", "--nodes", "64", "--seconds", "2", "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["sizes"][0]["restore_exact"] is False
    assert "a restore would not be exact" in captured.err


def test_bench_checkpoint_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "checkpoint", "--nodes", "abc"]) == 2
    assert "--nodes" in capsys.readouterr().err
