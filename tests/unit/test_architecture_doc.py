"""docs/architecture.md names the packages in the layers `.importlinter` holds every module to, in
the same order, and every path it names exists."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def _contract_layers() -> list[set[str]]:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    layers = config["importlinter:contract:layers"]["layers"]
    return [{p.strip() for p in line.split("|")} for line in layers.strip().splitlines()]


def _doc_layers() -> list[set[str]]:
    text = DOC.read_text()
    table = text.split("<!-- layers:start -->", 1)[1].split("<!-- layers:end -->", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `([\w]+)` \|", table, re.M)
    assert rows, "docs/architecture.md lost its layers table"
    layers: dict[int, set[str]] = {}
    for layer, package in rows:
        layers.setdefault(int(layer), set()).add(package)
    assert sorted(layers) == list(range(1, len(layers) + 1)), sorted(layers)
    return [layers[k] for k in sorted(layers)]


def test_the_layers_in_the_doc_are_the_contract_s() -> None:
    assert _doc_layers() == _contract_layers()


def test_every_package_of_the_doc_is_one_of_fleetloop_s() -> None:
    for layer in _doc_layers():
        for name in layer:
            assert (ROOT / "fleetloop" / name).is_dir() or (ROOT / "fleetloop" / f"{name}.py").exists(), name


def test_every_path_the_doc_names_exists() -> None:
    paths = re.findall(r"`((?:fleetloop|tests|docs)/[\w./-]+)`", DOC.read_text())
    assert len(paths) > 5, paths
    for path in paths:
        assert (ROOT / path).exists(), path
