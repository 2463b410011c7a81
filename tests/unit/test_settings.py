"""FLEETLOOP_* environment settings: every flag has one, they work, and docs/configuration.md's
table is the parser's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fleetloop.cli.main import build_parser, main
from fleetloop.daemon.service.settings import EnvError, env_name, env_table, walk

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_readme_table_is_generated_from_the_parser() -> None:
    text = DOC.read_text(encoding="utf-8")
    m = re.search(r"<!-- settings-table:start -->\n(.*?)<!-- settings-table:end -->", text, re.S)
    assert m, "docs/configuration.md lost its settings table markers"
    assert m.group(1) == env_table(build_parser(environ={})), (
        "docs/configuration.md's settings table is stale: paste `python -m fleetloop.cli.settings_table`"
    )


def test_every_flag_of_run_is_in_the_table() -> None:
    table = env_table(build_parser(environ={}))
    flags = [a for path, a in walk(build_parser(environ={})) if path == ("run",)]
    assert len(flags) >= 15
    for action in flags:
        opt = next(o for o in action.option_strings if o.startswith("--"))
        assert f"`{env_name(opt)}` | `{opt}`" in table


def test_environment_supplies_flags_and_the_command_line_wins() -> None:
    env = {
        "FLEETLOOP_BOOTSTRAP_SERVERS": "kafka-1:9093",
        "FLEETLOOP_HTTP_PORT": "9464",
        "FLEETLOOP_NO_TICKER": "yes",
        "FLEETLOOP_LOG_FORMAT": "json",
        "FLEETLOOP_SECURITY_PROTOCOL": "sasl_ssl",
        "FLEETLOOP_WAIT_FOR_TOPICS": "30",
    }
    args = build_parser(environ=env).parse_args(["run"])  # --bootstrap-servers is required, and given
    assert args.bootstrap_servers == "kafka-1:9093"
    assert args.http_port == 9464
    assert args.no_ticker is True
    assert args.log_format == "json"
    assert args.security_protocol == "SASL_SSL"
    assert args.wait_for_topics == 30.0
    args = build_parser(environ=env).parse_args(["run", "--http-port", "8080", "--log-format", "console"])
    assert args.http_port == 8080
    assert args.log_format == "console"
    assert (
        build_parser(environ={"FLEETLOOP_NO_TICKER": "0"})
        .parse_args(["run", "--bootstrap-servers", "b:1"])
        .no_ticker
        is False
    )


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("FLEETLOOP_HTTP_PORT", "eighty", "FLEETLOOP_HTTP_PORT='eighty'"),
        ("FLEETLOOP_LOG_FORMAT", "xml", "choose from console, json"),
        ("FLEETLOOP_NO_TICKER", "maybe", "expected 1/true/yes/on"),
    ],
)
def test_a_bad_variable_is_refused_naming_it(var: str, value: str, message: str) -> None:
    with pytest.raises(EnvError, match=re.escape(message)):
        build_parser(environ={var: value})


def test_a_bad_variable_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLEETLOOP_HTTP_PORT", "eighty")
    assert main(["policy", "validate", "x.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "FLEETLOOP_HTTP_PORT" in err
