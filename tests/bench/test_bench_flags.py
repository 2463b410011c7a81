"""Every bench refuses a flag out of its range in one line naming the bench and the flag, before it
starts a broker or builds a fleet (the checks in ``fleetloop.bench.common``)."""

from __future__ import annotations

import pytest
from fleetloop.cli.main import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["rollup", "--shards", "0"], "fleetloop bench rollup: --shards must be within 1..1000"),
        (
            ["rollup", "--boundaries", "100001"],
            "fleetloop bench rollup: --boundaries must be within 1..100000",
        ),
        (["rollup", "--interval-ms", "-1"], "fleetloop bench rollup: --interval-ms must be within 0..60000"),
        (["sizing", "--nodes", "15"], "fleetloop bench sizing: --nodes must be within 16..100000"),
        (["sizing", "--seconds", "4.5"], "fleetloop bench sizing: --seconds must be within 5..3600"),
        (
            ["sizing", "--outcomes-per-node", "100.5"],
            "fleetloop bench sizing: --outcomes-per-node must be within 0..100",
        ),
        (
            ["checkpoint", "--nodes", "10"],
            "fleetloop bench checkpoint: --nodes: each size must be within 16..100000",
        ),
        (
            ["checkpoint", "--nodes", "1k"],
            "fleetloop bench checkpoint: --nodes: not a list of integers: '1k'",
        ),
        (
            ["checkpoint", "--nodes", "100", "--seconds", "0"],
            "fleetloop bench checkpoint: --seconds must be within 1..600",
        ),
    ],
)
def test_a_bench_flag_out_of_range_is_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(message)
    assert "\n" not in err
    assert "starting" not in err  # refused before any broker started
