"""``make kafka-up`` / ``make kafka-down`` without starting a broker: the Makefile runs the module on
the tests' config, and what a user can get wrong is one line and exit 2 (the start itself is in
``tests/integration/test_operator_journey.py``)."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from fleetloop.daemon.brokers import local
from fleetloop.daemon.brokers.apache import REPO_ROOT

MAKEFILE = REPO_ROOT / "Makefile"


def _recipe(target: str) -> str:
    text = MAKEFILE.read_text()
    m = re.search(rf"^{re.escape(target)}:[^\n]*\n\t([^\n]+)", text, re.M)
    assert m, f"no {target} target in the Makefile"
    return m.group(1)


def test_the_make_targets_run_the_module_with_its_port_and_directory() -> None:
    up = _recipe("kafka-up")
    assert up == "$(BIN)/python -m fleetloop.daemon.brokers.local up --port $(KAFKA_PORT) --dir $(KAFKA_DIR)"
    assert _recipe("kafka-down") == "$(BIN)/python -m fleetloop.daemon.brokers.local down --dir $(KAFKA_DIR)"
    assert re.search(r"^kafka-up: \$\(STAMP\) kafka$", MAKEFILE.read_text(), re.M), "kafka-up fetches first"
    assert "KAFKA_PORT ?= 9092" in MAKEFILE.read_text()


def _one_line(capsys: pytest.CaptureFixture[str], code: int, want: int = 2) -> str:
    out, err = capsys.readouterr()
    assert code == want, (out, err)
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_what_a_user_can_get_wrong_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    err = _one_line(capsys, local.main(["up", "--port", "0", "--dir", str(tmp_path)]))
    assert err.startswith("kafka-up: --port 0: not a port"), err
    monkeypatch.setenv("FLEETLOOP_KAFKA_HOME", str(tmp_path / "nowhere"))
    err = _one_line(capsys, local.main(["up", "--dir", str(tmp_path)]))
    assert "Apache Kafka jars not found" in err, err
    assert "make kafka" in err, err
    with pytest.raises(SystemExit) as raised:
        local.main(["up", "--por", "9092"])  # no abbreviations
    assert raised.value.code == 2
    err = _one_line(capsys, 2)
    assert "unrecognized arguments: --por" in err, err


def test_a_taken_port_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        err = _one_line(capsys, local.main(["up", "--port", str(port), "--dir", str(tmp_path)]))
    assert f"127.0.0.1:{port} is taken by another process" in err, err
    assert not (tmp_path / "kafka.json").exists()


def test_down_and_status_when_nothing_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert local.main(["status", "--dir", str(tmp_path)]) == 1
    assert local.main(["down", "--dir", str(tmp_path)]) == 0
    assert "not running" in capsys.readouterr().out
    # A state file whose pid is not a broker (gone, or recycled by another program) is not one.
    (tmp_path / "kafka.json").write_text('{"pid": 1, "bootstrap": "127.0.0.1:9092", "version": "4.1.1"}')
    assert local.running(tmp_path) is None
    assert local.main(["down", "--dir", str(tmp_path)]) == 0
    assert not (tmp_path / "kafka.json").exists()
