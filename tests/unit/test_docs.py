"""The README and docs/ say what is so: the README stays a short guide that opens with its two
commands, every link and repository path they name exists, the command table names real commands
and flags, the policy table is the shipped default's, and no document points outside the
repository or tells the history of its own making (that lives in git and docs/decisions/)."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import yaml
from fleetloop.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
GUIDES = [README, *DOCS, ROOT / "bench" / "README.md", ROOT / "scenarios" / "README.md"]
# A path in backticks that starts with one of these is a claim that the path exists.
TOP = ("fleetloop/", "tests/", "docs/", "bench/", "examples/", "scenarios/", "policies/", "schemas/",
       "deploy/", "docker/", "scripts/")  # fmt: skip
HISTORY = re.compile(r"\b(session|sessions) [0-9]+|\bissue #?[0-9]+\b|round [0-9]|-s[0-9]{1,2}\b", re.I)


def _tracked(*paths: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", *paths], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / p for p in out.decode().split("\0") if p]


def test_the_readme_is_a_short_guide_that_opens_with_its_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 350
    first = re.search(r"^```\n(.*?)^```$", text, re.S | re.M)
    assert first is not None
    assert first.group(1) == "make demo\nmake test\n"
    assert text.index("```") < text.index("\n## ")  # at its top, before any section


def test_every_link_between_the_documents_resolves() -> None:
    checked = 0
    for doc in GUIDES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)}: {target}"
            checked += 1
    assert checked > 20, checked


def test_every_repository_path_the_documents_name_exists() -> None:
    checked = 0
    for doc in GUIDES:
        for path in re.findall(r"`([\w./-]+)`", doc.read_text()):
            if not path.startswith(TOP) or "..." in path:
                continue
            assert (ROOT / path).exists(), f"{doc.relative_to(ROOT)}: {path}"
            checked += 1
    assert checked > 50, checked


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subs[0].choices) if subs else {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    """The parser's options, or for a command group (``bench NAME``) those every member takes."""
    children = _children(parser)
    if children:
        return set.intersection(*(_flags(c) for c in children.values()))
    return {o for a in parser._actions for o in a.option_strings}


def test_the_command_table_names_real_commands_and_flags() -> None:
    text = README.read_text()
    table = text[text.index("## Commands") : text.index("## How it works")]
    cells = re.findall(r"`(fleetloop [^`]*)`", "\n".join(ln.split(" | ")[0] for ln in table.splitlines()))
    assert len(cells) >= 15, cells
    for cell in cells:
        words = []
        for token in cell.split()[1:]:
            if not re.fullmatch(r"[a-z][a-z-]*(\\\|[a-z-]+)*", token):
                break
            words.append(token.split("\\|"))
        paths: list[list[str]] = [[]]
        for alternatives in words:
            paths = [[*p, w] for p in paths for w in alternatives]
        accepted: set[str] = set()  # a row of alternatives lists their flags together
        for path in paths:
            parser = build_parser(environ={})
            for word in path:
                assert word in _children(parser), (cell, word)
                parser = _children(parser)[word]
            accepted |= _flags(parser)
        for flag in re.findall(r"(--[a-z][a-z-]*)", cell):
            assert flag in accepted, (cell, flag)


def test_the_policy_table_is_the_shipped_default_s() -> None:
    text = README.read_text()
    spec = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())["spec"]
    said = dict(re.findall(r"^\| (\w+) \| `([a-z-]+)` \|", text, re.M))
    sections = ("routing", "breaker", "admission", "retry_budget", "autoscale", "batching")
    assert said == {s: spec[s]["type"] for s in sections}
    ratio = spec["retry_budget"]["params"]
    m = re.search(r"retries at most (\d+)% of requests plus (\d+)/s", text)
    assert m is not None
    assert int(m.group(1)) == round(100 * ratio["retry_ratio"])
    assert int(m.group(2)) == ratio["min_retries_per_s"]


def test_no_document_points_to_a_design_document_outside_the_repository() -> None:
    for path in _tracked():
        if path.suffix in {".png", ".jar", ".gz"} or not path.is_file() or path.is_symlink():
            continue
        text = path.read_text(errors="replace")
        for name in ("DESIGN" + ".md", "STYLE" + ".md"):
            assert name not in text, f"{path.relative_to(ROOT)} names {name}"


def test_no_history_in_the_documents_the_tests_or_the_code() -> None:
    found = []
    places = ("README.md", "docs", "bench", "fleetloop", "tests", "scenarios", "examples", "scripts")
    for path in _tracked(*places):
        rel = str(path.relative_to(ROOT))
        if path.suffix in {".png", ".jar"} or not path.is_file():
            continue
        if HISTORY.search(rel):
            found.append(f"{rel}: its name")
        # whitespace folded, so a reference broken over two lines ("issue\n# 15") counts as well
        text = re.sub(r"\s+(?:#\s+)?", " ", path.read_text(errors="replace"))
        found += [
            f"{rel}: ...{text[max(0, m.start() - 40) : m.end() + 20]}..." for m in HISTORY.finditer(text)
        ]
    assert not found, "\n".join(found[:40])
