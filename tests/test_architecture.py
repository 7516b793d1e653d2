"""The rooms of ``coscale`` (its subpackages and top-level modules) import one another one way.

A module-level cycle is caught by `test_imports`; here the modules are collapsed into their room
(``coscale.loop.curriculum`` -> ``loop``, ``coscale.distributed`` -> ``distributed``), so that two
rooms that import each other through different files (loop -> sft for one function, sft -> loop
for another) fail too: then neither room can be read, tested or moved without the other. Imports
inside functions count (a deferred import only hides the dependency). The direction is the
house design's: app -> pipeline -> stages -> run / callbacks -> measure -> modules / datamodules -> the
Lightning-free core (loop, sft, rl, scoring, rollout, models, tasks above loop), with
`coscale.distributed`, `coscale.seeds` and `coscale.log` (which uses only the first) importable
from every room.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_imports import PACKAGE_DIR, Edges, cycles, describe, import_graph


def room(module: str) -> str | None:
    """The room of a ``coscale`` module: its subpackage or top-level module (None: the package's
    own ``__init__``, which only re-exports)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def room_graph(package_dir: Path) -> Edges:
    """Room -> the rooms it imports, each with one import that does it ("file:line")."""
    graph: Edges = {}
    for module, imports in import_graph(package_dir, deferred=True).items():
        source = room(module)
        if source is None:
            continue
        edges = graph.setdefault(source, {})
        for target, where in sorted(imports.items()):
            if room(target) not in (None, source):
                edges.setdefault(room(target), where)
    return graph


def room_cycles(package_dir: Path) -> list[str]:
    """Every set of rooms that import one another, with a shortest cycle through it."""
    graph = room_graph(package_dir)
    return [describe(c, graph) for c in cycles(graph)]


def test_no_cycle_between_rooms():
    found = room_cycles(PACKAGE_DIR)
    assert not found, (
        "rooms that import each other (move the shared piece to the room below both):\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize(
    ("low", "high"),
    [
        ("stages", "callbacks"),  # both measure through coscale.measure, neither imports the other
        ("callbacks", "stages"),
        ("run", "stages"),  # the run's machinery serves the stages, never the other way
        ("callbacks", "run"),
        ("distributed", "models"),  # any room may use the collectives: they import only torch
        ("loop", "tasks"),  # tasks load Problems (coscale.loop.problem) into the loop
        ("loop", "sft"),
    ],
)
def test_room_does_not_import(low, high):
    where = room_graph(PACKAGE_DIR).get(low, {}).get(high)
    assert where is None, f"coscale.{low} imports coscale.{high} ({where})"


@pytest.mark.parametrize("low", ["distributed", "seeds"])
def test_rooms_every_room_may_use_import_no_other_room(low):
    assert room_graph(PACKAGE_DIR).get(low, {}) == {}


def test_the_logger_every_room_uses_imports_only_the_collectives():
    assert set(room_graph(PACKAGE_DIR).get("log", {})) == {"distributed"}


def test_room_graph_on_a_toy_package(tmp_path):
    pkg = tmp_path / "toy"
    for sub in ("a", "b", "c"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from toy.a import x\n")  # the root: no room
    (pkg / "a" / "x.py").write_text("from toy.b.y import f\n")
    (pkg / "b" / "y.py").write_text("def f():\n    from toy.a import x\n")  # deferred counts
    (pkg / "b" / "z.py").write_text("from toy import top\n")
    (pkg / "c" / "w.py").write_text("import toy.top\n")
    (pkg / "top.py").write_text("")
    graph = room_graph(pkg)
    assert graph["a"] == {"b": "toy/a/x.py:1"} and graph["b"] == {
        "a": "toy/b/y.py:2",
        "top": "toy/b/z.py:1",
    }
    assert graph["c"] == {"top": "toy/c/w.py:1"} and graph["top"] == {}
    (found,) = room_cycles(pkg)
    assert "a -> b (toy/a/x.py:1)" in found and "b -> a (toy/b/y.py:2)" in found


def test_only_the_rollout_factory_imports_the_vllm_backend():
    """``coscale.rollout.vllm`` (whose engine needs vllm) is reached through the factory alone,
    so a backend is chosen in one place and no other module depends on vLLM's layout."""
    allowed = ("coscale.rollout.factory", "coscale.rollout.vllm")
    found = [
        f"{module} imports {target} ({where})"
        for module, imports in import_graph(PACKAGE_DIR, deferred=True).items()
        if not module.startswith(allowed)
        for target, where in imports.items()
        if target == "coscale.rollout.vllm" or target.startswith("coscale.rollout.vllm.")
    ]
    assert not found, "\n".join(found)


def test_the_architecture_page_names_every_room_that_imports_each_room():
    """docs/architecture.md's "used by" column is the import graph read backwards: each row's
    rooms are imported by exactly the rooms it names ("any room": the rooms below all others)."""
    import re

    page = (PACKAGE_DIR.parent / "docs" / "architecture.md").read_text()
    importers: dict[str, set[str]] = {}
    for source, targets in room_graph(PACKAGE_DIR).items():
        for target in targets:
            importers.setdefault(target, set()).add(source)
    rows = re.findall(r"^\| (`coscale/[^|]+) \|[^\n]*\| ([^|\n]+) \|$", page, re.M)
    assert len(rows) > 10
    for rooms, used_by in rows:
        if used_by == "any room":
            continue
        named = set(re.findall(r"`(\w+)`", used_by))
        for path in re.findall(r"`coscale/(\w+)", rooms):
            assert importers.get(path, set()) == named, (path, sorted(importers.get(path, ())))
