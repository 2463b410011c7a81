"""Bad input to the edge commands: one line on stderr, exit code 2, never a traceback."""

from __future__ import annotations

import pytest
from fleetloop.cli.main import main


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["fleet", "--scenario", "/nonexistent.yaml"], "cannot read"),
        (["fleet", "--scenario", "scenarios/steady-chat.yaml", "--scale", "0"], "--scale"),
        (["fleet", "--scenario", "scenarios/steady-chat.yaml", "--base-port", "70000"],
         "--base-port"),
        (["scrape", "--runtime", "vllm", "--target", "ftp://x", "--pool", "p", "--bootstrap-servers", "b"],
         "http"),
        (["scrape", "--runtime", "vllm", "--target", "a=h:1,a=h:2", "--pool", "p", "--bootstrap-servers",
          "b"],
         "same node"),
        (["scrape", "--runtime", "vllm", "--target", "h:1", "--pool", "bad pool", "--bootstrap-servers", "b"],
         "--pool"),
        (["scrape", "--runtime", "vllm", "--target", "h:1", "--pool", "p", "--bootstrap-servers", "b",
          "--interval-s", "0"], "--interval-s"),
        (["scrape", "--runtime", "vllm", "--target", "h:1", "--pool", "p", "--bootstrap-servers",
          "127.0.0.1:1", "--duration-s", "1"], "cannot use Kafka"),
        (["scrape", "--runtime", "nope", "--target", "h:1", "--pool", "p", "--bootstrap-servers", "b"],
         "invalid choice"),
        (["scrape", "--runtime", "dynamo", "--target", "h:1", "--pool", "p", "--bootstrap-servers", "b",
          "--engine", "vLLM"],
         "argument --engine: invalid choice: 'vLLM'"),
        (["scrape", "--runtime", "vllm", "--target", "bad node/\u00fc=127.0.0.1:18600", "--pool", "p",
          "--bootstrap-servers", "b"],
         "--target 'bad node/\u00fc=127.0.0.1:18600': node id 'bad node/\u00fc' is not a valid identifier"),
        (["scrape", "--runtime", "vllm", "--target", "http://\u00fc.example:80", "--pool", "p",
          "--bootstrap-servers", "b"],
         "node id 'p/\u00fc.example:80' is not a valid identifier"),
        (["scrape", "--runtime", "vllm", "--target", "127.0.0.1:70000", "--pool", "p", "--bootstrap-servers",
          "b"],
         "--target '127.0.0.1:70000': the port must be in 1-65535"),
        (["scrape", "--runtime", "vllm", "--target", "n=http://h:0/metrics", "--pool", "p",
          "--bootstrap-servers", "b"],
         "the port must be in 1-65535"),
        (["scrape", "--runtime", "vllm", "--target", "h:http", "--pool", "p", "--bootstrap-servers", "b"],
         "the port must be in 1-65535"),
    ],
)  # fmt: skip
def test_one_line_errors(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_scrape_targets_parse() -> None:
    from fleetloop.edges.scrape.command import parse_targets

    got = parse_targets("10.0.0.5:8000, n1=https://h/prom/metrics,http://h2:9/", "pool")
    assert [(t.node_id, t.url) for t in got] == [
        ("pool/10.0.0.5:8000", "http://10.0.0.5:8000/metrics"),
        ("n1", "https://h/prom/metrics"),
        ("pool/h2:9", "http://h2:9/metrics"),
    ]
