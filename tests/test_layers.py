"""Imports point one way, as docs/design.md's layer table says: read every import of every module (inside
functions too) with `ast`, and fail on a package cycle, an import of a higher layer, or an import between the
study process's side and the trial process's side.

Also a script that counts them, for any checkout: python tests/test_layers.py [ROOT]
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\s*(\d+)\s+(parent|trial|shared|tests)\s+(\S.*?)\s*$")
FORBIDDEN_SIDES = {("parent", "trial"), ("trial", "parent")}


@dataclass(frozen=True)
class Layer:
    rank: int  # 0 is the top: a package may import only from packages of a higher rank
    side: str  # parent: the study process; trial: the trial process; shared: both import it; tests: only the tests


@dataclass(frozen=True)
class Edge:
    module: str  # autotune.search.session
    imported: str  # autotune.worker.measurement.energy
    line: int

    def __str__(self) -> str:
        return f"{self.module} -> {self.imported} (line {self.line})"


def layer_table(design: Path) -> dict[str, Layer]:
    """Package (or top-level module) -> its layer, from the table in docs/design.md."""
    text = design.read_text()
    block = text.split("<!-- layers -->", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    table = {}
    for line in block.splitlines():
        match = ROW.match(line)
        if match:
            for package in match[3].split(","):
                table[package.strip()] = Layer(int(match[1]), match[2])
    return table


def package_of(module: str) -> str:
    """autotune.search.loop -> search; autotune.specs -> specs; autotune -> autotune."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(root: Path, path: Path) -> list[Edge]:
    """Every autotune module this file imports, at module level, inside functions or under TYPE_CHECKING."""
    module = module_name(root, path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            edges += [Edge(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                exists = _module_path(root, submodule) is not None
                edges.append(Edge(module, submodule if exists else base, node.lineno))
    return list(dict.fromkeys(edge for edge in edges if edge.imported.split(".")[0] == "autotune"))


def _module_path(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def all_edges(root: Path) -> list[Edge]:
    return [edge for path in sorted((root / "autotune").rglob("*.py")) for edge in imports_of(root, path)]


def upward(edges: list[Edge], table: dict[str, Layer]) -> list[Edge]:
    """Imports of a package of the same or a higher layer, or across the parent / trial boundary."""
    wrong = []
    for edge in edges:
        source, target = package_of(edge.module), package_of(edge.imported)
        if source == target:
            continue
        low, high = table[source], table[target]
        if high.rank <= low.rank or (low.side, high.side) in FORBIDDEN_SIDES:
            wrong.append(edge)
    return wrong


def package_cycles(edges: list[Edge]) -> list[list[str]]:
    """The packages that reach each other (strongly connected components of more than one package)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        source, target = package_of(edge.module), package_of(edge.imported)
        if source != target:
            graph[source].add(target)
    components = _strongly_connected(graph)
    return sorted(sorted(component) for component in components if len(component) > 1)


def module_cycles(edges: list[Edge]) -> list[list[str]]:
    """Modules that import each other, directly or through others (within a package too)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        if edge.module != edge.imported:
            graph[edge.module].add(edge.imported)
    return sorted(sorted(component) for component in _strongly_connected(graph) if len(component) > 1)


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative enough for a dozen packages."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


# ------------------------------------------------------------------------------------------- tests


def test_every_package_has_a_layer() -> None:
    table = layer_table(ROOT / "docs" / "design.md")
    packages = {package_of(module_name(ROOT, path)) for path in (ROOT / "autotune").rglob("*.py")}
    assert packages - set(table) == set(), "add these to the layer table of docs/design.md"


def test_no_package_cycle() -> None:
    assert package_cycles(all_edges(ROOT)) == []


def test_no_module_cycle() -> None:
    """E.g. the worker's entry point, its tasks and its tensor-parallel ranks once imported each other."""
    assert module_cycles(all_edges(ROOT)) == []


def test_imports_point_down_and_never_cross_the_process_boundary() -> None:
    wrong = upward(all_edges(ROOT), layer_table(ROOT / "docs" / "design.md"))
    assert [str(edge) for edge in wrong] == []


def test_no_module_of_the_product_imports_the_tests_package() -> None:
    """autotune/testing/ is reached by name through its switch (autotune/for_tests.py) alone, and only when a test
    asks: nothing imports it."""
    into = [edge for edge in all_edges(ROOT) if package_of(edge.imported) == "testing"]
    assert [str(edge) for edge in into if package_of(edge.module) != "testing"] == []


def test_the_walker_sees_imports_inside_functions(tmp_path: Path) -> None:
    package = tmp_path / "autotune"
    (package / "worker").mkdir(parents=True)
    (package / "search").mkdir()
    for folder in (package, package / "worker", package / "search"):
        (folder / "__init__.py").write_text("")
    (package / "worker" / "tasks.py").write_text("")
    (package / "search" / "loop.py").write_text("def late():\n    from autotune.worker import tasks\n")
    table = {"search": Layer(2, "parent"), "worker": Layer(5, "trial"), "autotune": Layer(9, "shared")}
    edges = all_edges(tmp_path)
    assert [str(edge) for edge in upward(edges, table)] == ["autotune.search.loop -> autotune.worker.tasks (line 2)"]


# ------------------------------------------------------------------------------------------ script


def main(root: Path) -> None:
    """Print the package cycles and the imports that go up or cross sides, in the checkout at `root`."""
    edges = all_edges(root)
    table = layer_table(ROOT / "docs" / "design.md")  # this checkout's table: the order the change aims at
    missing = {package_of(edge.module) for edge in edges} - set(table)
    for package in missing:
        table[package] = Layer(-1, "shared")  # unknown here: everything it imports counts as pointing down
    cycles = package_cycles(edges)
    wrong = upward(edges, table)
    print(f"{root}: {len(edges)} imports of autotune modules")
    print(f"package cycles: {len(cycles)}" + "".join(f"\n  {' <-> '.join(cycle)}" for cycle in cycles))
    modules = module_cycles(edges)
    print(f"module cycles: {len(modules)}" + "".join(f"\n  {' <-> '.join(cycle)}" for cycle in modules))
    print(f"imports against the layers: {len(wrong)}" + "".join(f"\n  {edge}" for edge in wrong))


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT)
