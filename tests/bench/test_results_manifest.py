"""bench/results holds one current result per benchmark: every file there is one that ``fleetloop
bench results`` makes, each says the command, commit and date that made it, bench/README.md lists
them with their commands (and says which are not committed for the current code, whose files are
not there), and the directory stays small."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import orjson
import pytest
from fleetloop.bench.results import MADE_BY_MD, OUT, RESULTS, made_by, stamp, strip_made_by
from fleetloop.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "bench" / "results"
STACK = "stack/"  # bench stack's own results, kept by its work; listed here, stamped there


def _files() -> set[str]:
    return {str(p.relative_to(RESULTS_DIR)) for p in RESULTS_DIR.rglob("*") if p.is_file()}


def _listed() -> dict[str, str]:
    """Every file the list makes and commits -> the result's name (a directory's files included)."""
    out: dict[str, str] = {}
    for r in RESULTS:
        if not r.committed:
            continue
        for name in r.files.values():
            path = RESULTS_DIR / name
            if path.is_dir():
                out.update({str(p.relative_to(RESULTS_DIR)): r.name for p in path.rglob("*") if p.is_file()})
            else:
                out[name] = r.name
    return out


def test_every_file_is_a_listed_result_and_every_result_is_there() -> None:
    assert _files() == set(_listed())
    assert len(_files()) <= 60
    assert len({r.name for r in RESULTS}) == len(RESULTS)
    # a result not committed for the current code has none of its files here (stale ones go)
    absent = [name for r in RESULTS if not r.committed for name in r.files.values()]
    assert not [name for name in absent if (RESULTS_DIR / name).exists()]


def test_every_result_says_what_made_it() -> None:
    by_name = {r.name: r for r in RESULTS}
    for rel, name in _listed().items():
        if rel.startswith(STACK):
            continue
        path = RESULTS_DIR / rel
        if path.suffix == ".json":
            by = orjson.loads(path.read_bytes())["made_by"]
        elif path.suffix in {".md", ".html"}:
            m = re.search(r"Made by `?(.+?)`? at commit ([0-9a-f]{40}) on ([0-9TZ:-]+)\.", path.read_text())
            assert m, rel
            by = {"command": m.group(1), "commit": m.group(2), "date": m.group(3)}
        else:
            continue  # a report's images: its page says what made them
        assert by["command"] == by_name[name].command, rel
        assert re.fullmatch(r"[0-9a-f]{40}", by["commit"]), rel
        known = subprocess.run(["git", "cat-file", "-e", f"{by['commit']}^{{commit}}"], cwd=ROOT, check=False)
        assert known.returncode == 0, (rel, by["commit"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", by["date"]), rel


def test_the_readme_lists_every_result_with_its_command_and_the_one_that_makes_them_all() -> None:
    text = (ROOT / "bench" / "README.md").read_text()
    for r in RESULTS:
        row = re.search(rf"^\| {re.escape(r.name)} \|.*`{re.escape(r.command)}`.*$", text, re.M)
        assert row, r.name
        assert ("not committed" in row.group(0)) == (not r.committed), r.name
    assert "make bench-results" in text
    recipe = re.search(r"^bench-results:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert recipe is not None
    assert recipe.group(1).endswith("fleetloop bench results")


def test_a_stamp_is_replaced_not_added(tmp_path: Path) -> None:
    by = made_by("fleetloop bench x --json", "0" * 40, "2026-01-02T03:04:05Z")
    md, js, html = tmp_path / "a.md", tmp_path / "a.json", tmp_path / "a.html"
    md.write_text("# x\n\nbody\n")
    js.write_bytes(orjson.dumps([1, 2]))
    html.write_text("<html><body><p>x</p></body></html>\n")
    for _ in range(2):
        for path in (md, js, html):
            stamp(path, by)
    assert len(MADE_BY_MD.findall(md.read_text())) == 1
    assert strip_made_by(md.read_text()) == "# x\n\nbody\n"
    assert orjson.loads(js.read_bytes()) == {"made_by": by, "result": [1, 2]}
    assert html.read_text().count("Made by") == 1


def test_the_list_names_each_result_and_a_wrong_name_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "results", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in listed] == [r.name for r in RESULTS]
    assert [line.split("\t")[1].endswith("(not committed)") for line in listed] == [
        not r.committed for r in RESULTS
    ]
    assert all(OUT not in r.files.values() for r in RESULTS)
    assert main(["bench", "results", "--only", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no result named nope" in err
    assert len(err.strip().splitlines()) == 1
