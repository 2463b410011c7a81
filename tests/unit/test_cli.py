"""The ``fleetloop`` command in process: exit codes, and one line on stderr for anything a user can fix."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from fleetloop.cli.main import build_parser, main
from fleetloop.policies.registry import builtin_policy
from tests.support.policies import FOUNDATION_YAML

DEFAULT_YAML = FOUNDATION_YAML  # pinned: tests do not move when the shipped default is retuned
REPO_ROOT = Path(__file__).resolve().parents[2]


def one_line(text: str) -> str:
    """The text, which must be exactly one non-empty line without a traceback."""
    assert text.endswith("\n")
    lines = text.splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    assert lines[0].strip()
    return lines[0]


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def edited(tmp_path: Path, name: str, old: str, new: str) -> str:
    text = DEFAULT_YAML.read_text()
    assert old in text
    return write(tmp_path, name, text.replace(old, new, 1))


# -- policy validate --------------------------------------------------------------------------------


def test_validate_the_shipped_default_policy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO_ROOT)
    assert main(["policy", "validate", "policies/default.yaml"]) == 0
    out, err = capsys.readouterr()
    shipped = builtin_policy("default").stamp
    assert one_line(out) == f"valid    policies/default.yaml  default v{shipped.version}  hash {shipped.hash}"
    assert err == ""


@pytest.mark.parametrize(
    ("name", "old", "new", "problem"),
    [
        (
            "unknown-algorithm.yaml",
            "type: least-queue",
            "type: least-nope",
            "spec.routing.type: unknown algorithm 'least-nope'",
        ),
        (
            "bad-param.yaml",
            "threshold: 5",
            "threshold: -3",
            "spec.breaker.params.threshold: Input should be greater than or equal to 1",
        ),
        (
            "unknown-param.yaml",
            "alpha: 2.0",
            "alhpa: 2.0",
            "spec.routing.params.alhpa: unknown field",
        ),
        (
            "bad-envelope.yaml",
            "max_ejected_frac: 0.5",
            "max_ejected_frac: 1.5",
            "spec.envelope.max_ejected_frac: Input should be less than or equal to 1",
        ),
    ],
)
def test_validate_a_bad_policy_names_the_problem_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, old: str, new: str, problem: str
) -> None:
    path = edited(tmp_path, name, old, new)
    assert main(["policy", "validate", path]) == 2
    out, err = capsys.readouterr()
    line = one_line(err)
    assert path in line
    assert problem in line
    assert out == ""


def test_validate_a_file_that_is_not_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "broken.yaml", "spec:\n  routing: [1, 2\n  breaker: {\n")
    assert main(["policy", "validate", path]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{path}: not valid YAML at line" in line


def test_validate_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "nowhere.yaml")
    assert main(["policy", "validate", path]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{path}: cannot read (No such file or directory)" in line


def test_validate_reports_each_bad_file_and_passes_the_good_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = edited(tmp_path, "bad.yaml", "threshold: 5", "threshold: 0")
    assert main(["policy", "validate", str(DEFAULT_YAML), bad]) == 2
    out, err = capsys.readouterr()
    assert one_line(out).startswith(f"valid    {DEFAULT_YAML}")
    assert "spec.breaker.params.threshold" in one_line(err)


# -- policy diff ------------------------------------------------------------------------------------


def test_diff_lists_the_changed_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new = edited(tmp_path, "new.yaml", "alpha: 2.0", "alpha: 3.0")
    assert main(["policy", "diff", str(DEFAULT_YAML), new]) == 1  # like diff(1): 1 when they differ
    out, err = capsys.readouterr()
    assert one_line(out).split() == ["spec.routing.params.alpha", "2.0", "->", "3.0", "(default", "2.0)"]
    assert err == ""


def test_diff_of_identical_documents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = write(tmp_path, "copy.yaml", DEFAULT_YAML.read_text())
    assert main(["policy", "diff", str(DEFAULT_YAML), copy]) == 0
    assert capsys.readouterr().out == "no changes\n"


# -- argument errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["policy", "validate", "--frobnicate", str(DEFAULT_YAML)],
            "fleetloop policy validate: unrecognized arguments: --frobnicate",
        ),
        (["bench", "soak", "--seconds", "1"], "fleetloop bench soak: unrecognized arguments: --seconds 1"),
        (["run", "--bootstrap-servers", "x", "--bogus"], "fleetloop run: unrecognized arguments: --bogus"),
    ],
)
def test_an_unknown_flag_is_one_line_naming_the_subcommand(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert one_line(err) == message
    assert out == ""


def test_an_unknown_subcommand_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "invalid choice: 'frobnicate'" in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [],
            "fleetloop: which command? one of: run, policy, replay, demo, rollup, bench, sim, whatif, "
            "actuate, fleet, scrape",
        ),
        (
            ["policy"],
            "fleetloop policy: which command? one of: validate, apply, status, rollback, remove-shadow, "
            "compare, diff",
        ),
        (["actuate"], "fleetloop actuate: which command? one of: haproxy, vllm-router, sglang-router"),
    ],
)
def test_a_missing_subcommand_lists_the_choices_not_argparse_s_internal_name(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = one_line(capsys.readouterr().err)
    assert err == message
    assert "_command" not in err


@pytest.mark.parametrize("command", ["run", "fleet", "scrape", "sim", "whatif", "replay", "bench", "policy"])
def test_every_subcommand_s_help_has_a_description_without_rest_markup(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    usage, _, rest = text.partition("\n\n")
    assert usage.startswith(f"usage: fleetloop {command}")
    description = rest.split("\n\n")[0]
    assert description, text[:400]
    assert not description.startswith(("options:", "positional arguments:")), text[:400]
    assert "``" not in text


@pytest.mark.parametrize("seconds", ["5", "9", "3601"])
def test_demo_seconds_out_of_bounds_is_one_line(capsys: pytest.CaptureFixture[str], seconds: str) -> None:
    assert main(["demo", "--seconds", seconds]) == 2
    line = one_line(capsys.readouterr().err)
    assert line == f"fleetloop demo: --seconds must be between 10 and 3600, got {seconds}"


def test_sim_with_a_missing_scenario_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["sim", "--scenario", "missing.yaml"]) == 2
    out, err = capsys.readouterr()
    assert one_line(err) == "fleetloop sim: missing.yaml: cannot read (No such file or directory)"
    assert out == ""


def test_replay_refuses_a_reversed_window_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    """``--from`` after ``--to`` is an empty window: one line, exit 2 (no broker is asked)."""
    code = main(
        [
            "replay",
            "--bootstrap-servers",
            "127.0.0.1:9",
            "--from",
            "2026-01-02T00:00:00Z",
            "--to",
            "2026-01-01T00:00:00Z",
        ]
    )
    assert code == 2
    assert "empty window" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--bootstrap-server", "b:9092", "--group-id", "g"],
         "fleetloop run: the following arguments are required: --bootstrap-servers"),
        (["run", "--bootstrap-servers", "b:9092", "--group", "g"],
         "fleetloop run: unrecognized arguments: --group g"),
        (["policy", "diff", "a.yaml", "b.yaml", "--js"],
         "fleetloop policy diff: unrecognized arguments: --js"),
    ],
)  # fmt: skip
def test_an_abbreviated_flag_is_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--bootstrap-server`` (singular) was taken for ``--bootstrap-servers``."""
    assert main(argv) == 2
    assert one_line(capsys.readouterr().err) == message


def test_no_parser_of_the_whole_tree_takes_abbreviations() -> None:
    stack = [build_parser(environ={})]
    seen = 0
    while stack:
        parser = stack.pop()
        assert parser.allow_abbrev is False, parser.prog
        seen += 1
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
    assert seen > 30
