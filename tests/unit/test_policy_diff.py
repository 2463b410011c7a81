"""``fleetloop policy diff`` compares what takes effect: each algorithm's params with its defaults
filled in, so writing a default out or leaving it out is no change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fleetloop.cli.main import main
from tests.support.policies import FOUNDATION_YAML

RETRY = "retry_budget: {type: ratio, params: {retry_ratio: 0.2, min_retries_per_s: 10}}"


def edited(tmp_path: Path, name: str, old: str, new: str) -> str:
    text = FOUNDATION_YAML.read_text()
    assert old in text
    p = tmp_path / name
    p.write_text(text.replace(old, new, 1))
    return str(p)


def test_dropping_params_equal_to_the_defaults_is_no_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = edited(tmp_path, "bare.yaml", RETRY, "retry_budget: {type: ratio}")
    window = edited(tmp_path, "window.yaml", "window_ms: 10000, ", "")  # the envelope's default too
    assert main(["policy", "diff", str(FOUNDATION_YAML), bare]) == 0
    assert capsys.readouterr().out == "no changes\n"
    assert main(["policy", "diff", window, str(FOUNDATION_YAML), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["changes"] == []


def test_a_change_from_a_default_names_the_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = edited(tmp_path, "bare.yaml", RETRY, "retry_budget: {type: ratio}")
    five = edited(tmp_path, "five.yaml", RETRY, "retry_budget: {type: ratio, params: {min_retries_per_s: 5}}")
    assert main(["policy", "diff", bare, five]) == 1
    out = capsys.readouterr().out
    assert out.split() == [
        "spec.retry_budget.params.min_retries_per_s",
        "10.0",
        "->",
        "5.0",
        "(default",
        "10.0)",
    ]
    assert main(["policy", "diff", five, bare, "--json"]) == 1
    (change,) = json.loads(capsys.readouterr().out)["changes"]
    assert change == {
        "path": "spec.retry_budget.params.min_retries_per_s",
        "old": 5.0,
        "new": 10.0,
        "default": 10.0,
    }


def test_a_change_between_non_defaults_names_no_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = edited(tmp_path, "old.yaml", "alpha: 2.0", "alpha: 2.5")  # least-queue's default is 2.0
    new = edited(tmp_path, "new.yaml", "alpha: 2.0", "alpha: 3.0")
    assert main(["policy", "diff", old, new, "--json"]) == 1
    (change,) = json.loads(capsys.readouterr().out)["changes"]
    assert change == {"path": "spec.routing.params.alpha", "old": 2.5, "new": 3.0}
    assert main(["policy", "diff", old, new]) == 1
    assert capsys.readouterr().out.split() == ["spec.routing.params.alpha", "2.5", "->", "3.0"]


def test_another_algorithm_lists_its_type_not_every_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = edited(tmp_path, "other.yaml", RETRY, "retry_budget: {type: unlimited}")
    assert main(["policy", "diff", str(FOUNDATION_YAML), other]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == ["spec.retry_budget.type"]


@pytest.mark.parametrize(
    ("command", "says"),
    [("diff", ["exit status", "1 the documents differ", "set -e", "OLD", "NEW", "--json"]),
     ("validate", ["exit status", "FILE", "--json print one JSON object"])],
)  # fmt: skip
def test_help_says_what_the_exit_status_means(
    command: str, says: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["policy", command, "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for s in says:
        assert s in out, s
