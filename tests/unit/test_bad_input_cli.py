# ruff: noqa: E501 - one row per bad case: the table reads down, not wrapped
"""Bad files and flags, every command that takes them: one line on stderr naming the problem, exit
code 2, never a traceback, and (the point of checking up front) before anything long runs or any
broker is asked: every row here finishes in well under a second (brokers at 127.0.0.1:9 refuse).

Placeholders in an argv: BIN (a binary, non-UTF-8 file), EMPTY (an empty file), S (a shipped
scenario), P (the shipped default policy), FILE (an existing regular file), WM (a valid worker map),
DEEP (YAML nested 1,000 deep);
in a message, ``{BIN}`` etc. stand for the same paths.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fleetloop.cli.main import main
from fleetloop.user_input import MAX_INPUT_BYTES, UserInputError, read_text

REPO_ROOT = Path(__file__).resolve().parents[2]
BROKER = ["--bootstrap-servers", "127.0.0.1:9"]
WHATIF = ["whatif", *BROKER, "--from", "beginning", "--to", "end"]
REPLAY = ["replay", *BROKER, "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z"]
VLLM = ["actuate", "vllm-router", *BROKER]
HAPROXY = ["actuate", "haproxy", *BROKER, "--runtime-api", "/tmp/fleetloop-no-such.sock"]
NOT_UTF8 = "{BIN}: not UTF-8 text (byte 0xff at offset 3)"

CASES: list[tuple[str, list[str], str]] = [
    # -- any user file that is not UTF-8: the file and the byte offset, whichever command reads it
    ("sim-scenario-bin", ["sim", "--scenario", "BIN"], f"fleetloop sim: {NOT_UTF8}"),
    ("fleet-scenario-bin", ["fleet", "--scenario", "BIN"], f"fleetloop fleet: {NOT_UTF8}"),
    ("policy-validate-bin", ["policy", "validate", "BIN"], f"invalid  {NOT_UTF8}"),
    ("policy-diff-bin", ["policy", "diff", "P", "BIN"], f"fleetloop: policy refused: {NOT_UTF8}"),
    ("policy-apply-bin", ["policy", "apply", "BIN", *BROKER], f"fleetloop: policy refused: {NOT_UTF8}"),
    ("run-policy-bin", ["run", *BROKER, "--policy", "BIN"], f"fleetloop: policy refused: {NOT_UTF8}"),
    ("replay-policy-bin", [*REPLAY, "--policy", "BIN"], f"fleetloop: policy refused: {NOT_UTF8}"),
    ("whatif-policy-bin", [*WHATIF, "--policy", "BIN"], f"fleetloop: policy refused: {NOT_UTF8}"),
    ("sim-policy-bin", ["sim", "--scenario", "S", "--policy", "BIN"], f"fleetloop sim: {NOT_UTF8}"),
    ("vllm-worker-map-bin", [*VLLM, "--url", "http://127.0.0.1:1", "--worker-map", "BIN"], f"--worker-map {NOT_UTF8}"),
    ("haproxy-backend-map-bin", [*HAPROXY, "--backend-map", "BIN"], f"--backend-map {NOT_UTF8}"),
    # -- an input that is not a regular file (it would be read without bound), or is empty
    ("sim-scenario-dev-zero", ["sim", "--scenario", "/dev/zero"], "fleetloop sim: /dev/zero: cannot read (not a regular file)"),
    ("policy-validate-dev-zero", ["policy", "validate", "/dev/zero"], "invalid  /dev/zero: cannot read (not a regular file)"),
    ("sim-scenario-empty", ["sim", "--scenario", "EMPTY"], "fleetloop sim: {EMPTY} is empty"),
    ("policy-validate-empty", ["policy", "validate", "EMPTY"], "invalid  {EMPTY} is empty"),
    # -- YAML nested past the parser's recursion (a few KiB, far inside the size cap)
    ("sim-scenario-deep", ["sim", "--scenario", "DEEP"], "fleetloop sim: {DEEP}: nested too deeply to read"),
    ("policy-validate-deep", ["policy", "validate", "DEEP"], "invalid  {DEEP}: nested too deeply to read"),
    ("run-policy-deep", ["run", *BROKER, "--policy", "DEEP"], "fleetloop: policy refused: {DEEP}: nested too deeply"),
    # -- seeds numpy would refuse with a traceback
    ("sim-seed-negative", ["sim", "--scenario", "S", "--seed", "-1"], "fleetloop sim: --seed must be between 0 and 2**63-101, got -1"),
    ("fleet-seed-negative", ["fleet", "--scenario", "S", "--seed", "-1"], "fleetloop fleet: --seed must be between 0 and 2**63-101, got -1"),
    # -- output paths, refused before the run instead of after it
    ("sim-report-is-a-file", ["sim", "--scenario", "S", "--report", "FILE"], "fleetloop sim: --report {FILE}: exists and is not a directory"),
    ("sim-report-unwritable", ["sim", "--scenario", "S", "--report", "/proc/nope"], "fleetloop sim: --report /proc/nope: cannot write there"),
    ("whatif-report-is-a-file", [*WHATIF, "--policy", "P", "--report", "FILE"], "fleetloop whatif: --report {FILE}: exists and is not a directory"),
    ("fleet-nodes-file-no-dir", ["fleet", "--scenario", "S", "--nodes-file", "/proc/x/nodes.json"], "fleetloop fleet: --nodes-file /proc/x/nodes.json: no directory /proc/x"),
    # -- --compare lists
    ("sim-compare-comma", ["sim", "--scenario", "S", "--compare", ","], "fleetloop sim: --compare ',': name at least one baseline or policy file"),
    ("sim-compare-comma-json", ["sim", "--scenario", "S", "--compare", ",", "--json"], "fleetloop sim: --compare ',': name at least one"),
    ("sim-compare-empty", ["sim", "--scenario", "S", "--compare", ""], "fleetloop sim: --compare '': name at least one"),
    ("sim-compare-twice", ["sim", "--scenario", "S", "--compare", "default,default", "--json"], "fleetloop sim: --compare 'default,default': default named twice"),
    ("sim-compare-gap", ["sim", "--scenario", "S", "--compare", "default,,classic"], "an empty name between commas"),
    # -- a URL's port, refused before an HTTP client overflows in connect()
    ("vllm-url-port-overflow", [*VLLM, "--url", "http://127.0.0.1:99999", "--worker-map", "WM"], "--url 'http://127.0.0.1:99999': the port must be in 1..65535"),
    # -- the router's metrics page: loopback only, a real port, a sane period, a model name the schema takes
    ("vllm-metrics-url-remote", [*VLLM, "--url", "http://127.0.0.1:1", "--worker-map", "WM", "--metrics-url", "http://10.0.0.1:9/metrics"], "--metrics-url 'http://10.0.0.1:9/metrics': want http://127.0.0.1:PORT/metrics (loopback only)"),
    ("sglang-metrics-url-port", ["actuate", "sglang-router", *BROKER, "--url", "http://127.0.0.1:1", "--worker-map", "WM", "--metrics-url", "http://127.0.0.1:0/metrics"], "--metrics-url 'http://127.0.0.1:0/metrics': the port must be in 1..65535"),
    ("vllm-metrics-period-nan", [*VLLM, "--url", "http://127.0.0.1:1", "--worker-map", "WM", "--metrics-period-s", "nan"], "--metrics-period-s must be in [0.1, 10]"),
    ("vllm-model-bad", [*VLLM, "--url", "http://127.0.0.1:1", "--worker-map", "WM", "--model", "a b"], "--model 'a b': want a name of letters, digits and _.:/@- (up to 200)"),
    # -- non-finite or negative durations
    ("fleet-drain-negative", ["fleet", "--scenario", "S", "--drain-s", "-5"], "fleetloop fleet: --drain-s must be in [0, 3600], got -5.0"),
    ("fleet-drain-nan", ["fleet", "--scenario", "S", "--drain-s", "nan"], "fleetloop fleet: --drain-s must be in [0, 3600], got nan"),
    ("scrape-duration-nan", ["scrape", "--runtime", "vllm", "--target", "h:1", "--pool", "p", *BROKER, "--duration-s", "nan"], "fleetloop scrape: --duration-s must be > 0"),
]  # fmt: skip


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "bin.yaml").write_bytes(b"a: \xff\xfe\x00binary")
    (tmp_path / "empty.yaml").write_text("# nothing but a comment\n")
    (tmp_path / "file.txt").write_text("a regular file\n")
    (tmp_path / "deep.yaml").write_text("spec: " + "[" * 1000 + "]" * 1000 + "\n")
    (tmp_path / "wm.yaml").write_text("pools: {p: {p/0: 'http://127.0.0.1:1'}}\n")
    return {
        "BIN": str(tmp_path / "bin.yaml"),
        "EMPTY": str(tmp_path / "empty.yaml"),
        "FILE": str(tmp_path / "file.txt"),
        "DEEP": str(tmp_path / "deep.yaml"),
        "WM": str(tmp_path / "wm.yaml"),
        "S": str(REPO_ROOT / "scenarios" / "steady-chat.yaml"),
        "P": str(REPO_ROOT / "policies" / "default.yaml"),
    }


@pytest.mark.parametrize(("argv", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_line_exit_2(
    argv: list[str], says: str, files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [files.get(a, a) for a in argv]
    says = says.format(**files)  # a placeholder in the message: the file's path
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert says in lines[0], (says, lines[0])
    assert code == 2
    assert out == ""


def test_whatif_does_not_overwrite_its_default_scenario_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --scenario-out (and --report), the default in the current directory is not replaced
    unasked: refused before the broker is read, naming --scenario-out."""
    monkeypatch.chdir(tmp_path)
    earlier = tmp_path / "whatif-scenario.yaml"
    earlier.write_text("an earlier run's scenario\n")
    code = main([*WHATIF, "--policy", str(REPO_ROOT / "policies" / "default.yaml")])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert "whatif-scenario.yaml exists" in err
    assert "--scenario-out" in err
    assert earlier.read_text() == "an earlier run's scenario\n"


def test_whatif_help_names_the_default_scenario_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["whatif", "--help"])
    help_text = "".join(capsys.readouterr().out.split())  # argparse wraps lines at a hyphen too
    assert "elsewhatif-scenario.yamlinthecurrentdirectory,refusedifitexists" in help_text


def test_an_input_file_over_the_cap_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(MAX_INPUT_BYTES + 1)  # sparse: nothing is written, nothing need be read
    with pytest.raises(UserInputError, match=r"big.yaml: 4194305 bytes, over the 4 MiB limit"):
        read_text(big)
    assert main(["sim", "--scenario", str(big)]) == 2
    err = capsys.readouterr().err
    assert err == f"fleetloop sim: {big}: 4194305 bytes, over the 4 MiB limit for an input file\n"
