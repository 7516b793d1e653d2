"""The imports between ``coscale`` modules form no cycle.

A cycle makes import order matter (a half-initialised module, an ImportError that depends on
which module came first) and ties together layers that should not know each other. The graphs
are read from the source with `ast`; nothing is imported.

Two graphs are checked, and each test lists every cycle it finds, with the import lines:

- module level: the imports that run when a module is imported (imports inside functions and
  under ``if TYPE_CHECKING:`` do not count);
- deferred too: the module-level imports plus those inside functions, where a cycle is a
  layering cycle that a deferred import only hides (e.g. policy -> tasks.builtin -> tasks.tiers
  -> solution_sources -> policy, removed by moving ``builtin:`` models to `coscale.models.policy`).

Only `KNOWN_CYCLES` may remain; an entry that is no cycle any more is reported as a warning.
"""

from __future__ import annotations

import ast
import itertools
import warnings
from collections import deque
from pathlib import Path

import pytest

import coscale

PACKAGE_DIR = Path(coscale.__file__).resolve().parent

KNOWN_CYCLES: set[frozenset[str]] = set()
"""Import cycles that are known and tolerated for now, each as the set of its modules."""

Edges = dict[str, dict[str, str]]  # module -> {imported module: "file:line" of the import}


# ----------------------------------------------------------------------------- the graph
def module_names(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file under ``package_dir``."""
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_nodes(node: ast.AST, deferred: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements under ``node``; those inside functions only when ``deferred``."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [node]
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
        children: list[ast.AST] = list(node.orelse)  # only the else branch runs
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not deferred:
        return []
    else:
        children = list(ast.iter_child_nodes(node))
    return [found for child in children for found in import_nodes(child, deferred)]


def imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Dotted names ``node`` may import (``from a import b`` gives ``a.b``, a module or not)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: climb from the module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    return [f"{base}.{alias.name}" for alias in node.names]


def targets(name: str, importer: str, modules: dict[str, Path]) -> set[str]:
    """The ``coscale`` modules that importing ``name`` runs, seen from ``importer``.

    The longest prefix of ``name`` that is a module, and the packages above it that are not
    packages of ``importer`` (those are already running when ``importer`` runs).
    """
    while name and name not in modules:
        name = name.rpartition(".")[0]
    found = set()
    while name:
        if name != importer and not importer.startswith(name + "."):
            found.add(name)
        name = name.rpartition(".")[0]
    return found


def import_graph(package_dir: Path, deferred: bool) -> Edges:
    """Module -> the package's modules it imports, with where (module level, or ``deferred``)."""
    modules = module_names(package_dir)
    graph: Edges = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges = graph.setdefault(module, {})
        for node in import_nodes(tree, deferred):
            for name in imported_names(node, module, path.name == "__init__.py"):
                for target in targets(name, module, modules):
                    where = f"{path.relative_to(package_dir.parent)}:{node.lineno}"
                    edges.setdefault(target, where)
    return graph


# ---------------------------------------------------------------------------- the cycles
def cycles(graph: Edges) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, {})))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def describe(component: frozenset[str], graph: Edges) -> str:
    """A shortest cycle through ``component``, each import with its file and line."""
    start = min(component)
    parent: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:  # breadth first inside the component until an import leads back to start
        node = queue.popleft()
        if start in graph[node]:
            break
        for child in sorted(graph[node]):
            if child in component and child not in parent:
                parent[child] = node
                queue.append(child)
    path: list[str] = [start]
    step: str | None = node
    while step is not None:
        path.insert(1, step)
        step = parent[step]
    path = [*path[1:], start]
    hops = [f"{a} -> {b} ({graph[a][b]})" for a, b in itertools.pairwise(path)]
    return f"{sorted(component)}:\n    " + "\n    ".join(hops)


def unexpected(graph: Edges) -> list[str]:
    """Every cycle of ``graph`` that is not in `KNOWN_CYCLES`, described."""
    return [describe(c, graph) for c in cycles(graph) if c not in KNOWN_CYCLES]


# --------------------------------------------------------------------------------- tests
def test_no_import_cycle_at_module_level():
    found = unexpected(import_graph(PACKAGE_DIR, deferred=False))
    assert not found, "module-level import cycles:\n" + "\n".join(found)


def test_no_import_cycle_with_deferred_imports():
    graph = import_graph(PACKAGE_DIR, deferred=True)
    for stale in KNOWN_CYCLES - set(cycles(graph)):
        warnings.warn(
            f"KNOWN_CYCLES: {sorted(stale)} is no cycle any more; remove it", stacklevel=1
        )
    found = unexpected(graph)
    assert not found, (
        "import cycles (counting imports inside functions; move the function to where it "
        "belongs or make the dependency one-way):\n" + "\n".join(found)
    )


@pytest.fixture
def toy(tmp_path) -> Path:
    """A package with a module-level cycle (a <-> b), a deferred one (c <-> d), and a
    ``TYPE_CHECKING`` import and a relative import that close no cycle."""
    pkg = tmp_path / "toy"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "import toy.b\n",
        "b.py": "from toy import a\n",
        "c.py": "def f():\n    from toy.d import g\n",
        "d.py": "from toy import c\n\ndef g():\n    pass\n",
        "e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from toy import f\n",
        "f.py": "import toy.e\n",
        "sub/__init__.py": "from . import x\n",
        "sub/x.py": "from ..a import thing\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    return pkg


def test_graph_builder_on_a_toy_package(toy):
    module_level = import_graph(toy, deferred=False)
    deferred = import_graph(toy, deferred=True)
    assert cycles(module_level) == [frozenset({"toy.a", "toy.b"})]
    assert sorted(map(sorted, cycles(deferred))) == [["toy.a", "toy.b"], ["toy.c", "toy.d"]]
    assert module_level["toy.sub.x"] == {"toy.a": "toy/sub/x.py:1"}  # relative, one level up
    assert module_level["toy.sub"] == {"toy.sub.x": "toy/sub/__init__.py:1"}
    assert "toy.f" not in module_level["toy.e"]  # under TYPE_CHECKING
    text = describe(frozenset({"toy.c", "toy.d"}), deferred)
    assert "toy.c -> toy.d (toy/c.py:2)" in text and "toy.d -> toy.c (toy/d.py:1)" in text
