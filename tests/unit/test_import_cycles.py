"""The cycle contract (tests/support/import_cycles.py, run by lint-imports) sees a cycle that a
function-local import closes, and one under TYPE_CHECKING; a chain that does not close is kept."""

from __future__ import annotations

import sys
from pathlib import Path

import grimp
import pytest
from tests.support.import_cycles import AcyclicModulesContract, cycles_of


def package(tmp_path: Path, name: str, files: dict[str, str]) -> grimp.ImportGraph:
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    for module, text in files.items():
        (root / f"{module}.py").write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        return grimp.build_graph(name, cache_dir=None)
    finally:
        sys.path.remove(str(tmp_path))


def check(graph: grimp.ImportGraph, name: str, **options: object) -> bool:
    contract = AcyclicModulesContract("t", {}, {"containers": [name], **options})
    return contract.check(graph, verbose=False).kept


LOCAL = {
    "a": "from cyc_local import b\n",
    "b": "def later():\n    from cyc_local import c\n    return c\n",
    "c": "import cyc_local.a\n",
}


def test_a_cycle_closed_by_a_function_local_import_is_found(tmp_path: Path) -> None:
    graph = package(tmp_path, "cyc_local", LOCAL)
    assert cycles_of(graph, set(graph.modules)) == [["cyc_local.a", "cyc_local.b", "cyc_local.c"]]
    assert not check(graph, "cyc_local")


def test_a_cycle_under_type_checking_is_found(tmp_path: Path) -> None:
    files = {
        "a": "from cyc_typing import b\n",
        "b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyc_typing.a import X\n",
    }
    assert not check(package(tmp_path, "cyc_typing", files), "cyc_typing")


def test_a_chain_is_kept_and_a_named_import_breaks_a_known_cycle(tmp_path: Path) -> None:
    chain = {"a": "from no_cyc import b\n", "b": "def f():\n    from no_cyc import c\n", "c": ""}
    assert check(package(tmp_path, "no_cyc", chain), "no_cyc")
    graph = package(tmp_path, "known_cyc", {k: v.replace("cyc_local", "known_cyc") for k, v in LOCAL.items()})
    assert check(graph, "known_cyc", ignore_imports=["known_cyc.b -> known_cyc.c"])


@pytest.mark.parametrize("size", [1, 400])
def test_cycles_of_a_long_ring_without_recursion(tmp_path: Path, size: int) -> None:
    files = {f"m{i}": f"from ring{size} import m{(i + 1) % size}\n" for i in range(size)}
    graph = package(tmp_path, f"ring{size}", files)
    found = cycles_of(graph, set(graph.modules))
    assert [len(c) for c in found] == [size]
