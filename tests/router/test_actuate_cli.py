"""``fleetloop actuate ...`` refuses bad input with one line and exit code 2, before touching anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleetloop.cli.main import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["haproxy", "--runtime-api", "10.1.2.3:9999", "--backend-map", "MAP"], "loopback"),
        (["haproxy", "--runtime-api", "nonsense", "--backend-map", "MAP"], "unix:/path or HOST:PORT"),
        (
            ["haproxy", "--runtime-api", "/tmp/x.sock", "--backend-map", "MAP", "--period-s", "0"],
            "--period-s",
        ),
        (["haproxy", "--runtime-api", "/tmp/x.sock", "--backend-map", "/nope.yaml"], "--backend-map"),
        (
            ["haproxy", "--runtime-api", "/tmp/x.sock", "--backend-map", "MAP", "--log-listen", "0.0.0.0:1"],
            "loopback",
        ),
        (["haproxy", "--runtime-api", "/tmp/fleetloop-no-such.sock", "--backend-map", "MAP"], "runtime API"),
        (["vllm-router", "--url", "http://10.0.0.1:1", "--worker-map", "MAP"], "loopback"),
        (["vllm-router", "--url", "http://127.0.0.1:1", "--worker-map", "/nope.yaml"], "--worker-map"),
        (["vllm-router", "--url", "http://127.0.0.1:1", "--worker-map", "WMAP"], "vllm-router at"),
        (["sglang-router", "--url", "http://10.0.0.1:1", "--worker-map", "MAP"], "loopback"),
        (["sglang-router", "--url", "http://127.0.0.1:99999", "--worker-map", "WMAP"], "1..65535"),
        (["sglang-router", "--url", "http://127.0.0.1:1", "--worker-map", "/nope.yaml"], "--worker-map"),
        (
            ["sglang-router", "--url", "http://127.0.0.1:1", "--worker-map", "WMAP", "--period-s", "0"],
            "--period-s",
        ),
        (["sglang-router", "--url", "http://127.0.0.1:1", "--worker-map", "WMAP"], "sglang-router at"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bmap = tmp_path / "b.yaml"
    bmap.write_text("pools: {p: {backend: be, model: m, servers: {p/0: s0}}}")
    wmap = tmp_path / "w.yaml"
    wmap.write_text("pools: {p: {p/0: 'http://127.0.0.1:1'}}")
    argv = [str(bmap) if a == "MAP" else str(wmap) if a == "WMAP" else a for a in argv]
    code = main(["actuate", *argv, "--bootstrap-servers", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_the_readme_s_command_table_lists_every_actuator() -> None:
    import re

    from fleetloop.cli.main import build_parser

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index("## Commands") : readme.index("## How it works")]
    listed = set(re.findall(r"^\| `fleetloop actuate ([a-z-]+) ", table, re.M))
    parser = build_parser(environ={})
    sub = next(a for a in parser._actions if a.dest == "command")
    act = sub.choices["actuate"]  # type: ignore[attr-defined]
    actuators = next(a for a in act._actions if a.dest == "actuate_command")
    assert listed == set(actuators.choices), listed
