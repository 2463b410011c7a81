"""An import-linter contract type: no import cycles between modules (``type = acyclic_modules`` in
``.importlinter``; ``lint-imports`` runs it with the other contracts).

The graph is grimp's, which counts every import statement: at the top, inside a function, under
``if TYPE_CHECKING``. A function-local import that closes a cycle hides it from Python's import
machinery, not from this check. (import-linter's own ``acyclic_siblings`` works on packages, where
fleetloop still has package-level cycles, daemon and sim for one, that are not module cycles.)
"""

from __future__ import annotations

import itertools
from typing import Any

import grimp
from importlinter.application import contract_utils, output
from importlinter.application.contract_utils import AlertLevel
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


class AcyclicModulesContract(Contract):
    """Options: ``containers`` (the packages whose modules may not import each other in a circle)
    and ``ignore_imports`` (known cycles, each one import, named until it is broken)."""

    type_name = "acyclic_modules"

    containers = fields.ListField(subfield=fields.StringField())
    ignore_imports = fields.SetField(subfield=fields.ImportExpressionField(), required=False)

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        removal = contract_utils.remove_ignored_imports_and_report(
            graph=graph,
            ignore_imports=self.ignore_imports,  # type: ignore[arg-type]
            unmatched_alerting=AlertLevel.ERROR,
        )
        containers: list[str] = self.containers  # type: ignore[assignment]
        modules = set()
        for container in containers:
            modules |= {container, *graph.find_descendants(container)}
        cycles = [_a_cycle(graph, component) for component in cycles_of(graph, modules)]
        return ContractCheck(
            kept=not cycles,
            warnings=list(removal.warnings),
            ignored_import_count=removal.ignored_import_count,
            metadata={"cycles": cycles},
        )

    def render_broken_contract(self, check: ContractCheck) -> None:
        for size, path in check.metadata["cycles"]:
            output.print_error(f"{size} modules import each other; one cycle:")
            output.new_line()
            for line in path:
                output.print_error(f"    {line}", bold=False)
            output.new_line()


def cycles_of(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself),
    each sorted, in sorted order (Tarjan's algorithm, iterative)."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & modules) for m in sorted(modules)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(modules):
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                nxt = edges[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(found)


def _a_cycle(graph: grimp.ImportGraph, component: list[str]) -> tuple[int, list[str]]:
    """One cycle through the component's first module, each step with its line, for the report."""
    first = component[0]
    inside = set(component)
    back = min(m for m in graph.find_modules_directly_imported_by(first) if m in inside)
    chain = graph.find_shortest_chain(importer=back, imported=first) or (back, first)
    path = [first, *chain]
    return len(component), [_step(graph, a, b) for a, b in itertools.pairwise(path)]


def _step(graph: grimp.ImportGraph, importer: str, imported: str) -> str:
    details: list[Any] = graph.get_import_details(importer=importer, imported=imported)
    where = f" (l.{details[0]['line_number']}: {details[0]['line_contents']})" if details else ""
    return f"{importer} -> {imported}{where}"
