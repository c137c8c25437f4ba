"""The import graph's rule: pure modules (no I/O: decisions and records) import no effect
module, so the pure core can be read and tested on its own (docs/architecture.md)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import dra_driver

PACKAGE = Path(dra_driver.__file__).parent

PURE = {
    "dra_driver.allocation",
    "dra_driver.apijson",
    "dra_driver.cdi",
    "dra_driver.claimcaps",
    "dra_driver.claimplan",
    "dra_driver.classnames",
    "dra_driver.claimstatus",
    "dra_driver.config",
    "dra_driver.devicehealth",
    "dra_driver.devicetaints",
    "dra_driver.devices",
    "dra_driver.errors",
    "dra_driver.gpus.model",
    "dra_driver.ids",
    "dra_driver.params",
    "dra_driver.quantities",
    "dra_driver.textlimits",
    "dra_driver.vocabulary",
    "dra_driver.mps.base",
    "dra_driver.mps.edits",
    "dra_driver.mps.hooks",
    "dra_driver.mps.names",
    "dra_driver.mps.rows",
    "dra_driver.mps.targets",
    "dra_driver.occupancy",
    "dra_driver.occupancywait",
    "dra_driver.offer",
    "dra_driver.overcommit",
}
"""Modules that decide or describe and never touch files, processes, sockets or the API."""

HAND_WRITTEN_LIMIT = 400
"""Most lines a hand-written module may have (issue: 'no hand-written module over ~400')."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _project_imports(path: Path) -> Iterator[tuple[str, list[str]]]:
    """``(module, names)`` of each project import in ``path``: ``from x import a, b`` gives
    ``(x, [a, b])``, ``import x.y`` gives ``(x.y, [])``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((a.name, []) for a in node.names if a.name.startswith("dra_driver"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dra_driver"):
            assert node.module is not None
            yield node.module, [a.name for a in node.names]


def _imports(path: Path) -> set[str]:
    """Project modules ``path`` imports (``from dra_driver.x import y`` counts x and x.y)."""
    return {
        m
        for module, names in _project_imports(path)
        for m in (module, *(f"{module}.{n}" for n in names))
    }


def _imported_modules(path: Path, modules: set[str]) -> set[str]:
    """Project modules whose code runs when ``path`` is imported: ``from pkg import sub`` of a
    submodule counts ``pkg.sub`` alone (the package is already being initialised)."""
    found: set[str] = set()
    for module, names in _project_imports(path):
        subs = {f"{module}.{n}" for n in names} & modules
        found |= subs
        if module in modules and (not names or len(subs) < len(names)):
            found.add(module)
    return found


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "_proto" not in p.parts}


def test_pure_modules_import_only_pure_modules() -> None:
    sources = _sources()
    assert set(sources) >= PURE, PURE - set(sources)
    offending = {
        name: sorted(m for m in _imports(sources[name]) if m in sources and m not in PURE)
        for name in PURE
    }
    assert {k: v for k, v in offending.items() if v} == {}


def test_no_hand_written_module_is_over_the_limit() -> None:
    sizes = {name: len(p.read_text().splitlines()) for name, p in _sources().items()}
    assert len(sizes) > 40
    assert {n: s for n, s in sizes.items() if s > HAND_WRITTEN_LIMIT} == {}


def test_compute_mode_names_are_spelled_in_one_module() -> None:
    spelled = {
        name
        for name, p in _sources().items()
        if '"time-slicing"' in p.read_text() or '"sm-sharing"' in p.read_text()
    }
    assert spelled == {"dra_driver.vocabulary"}


def test_no_module_imports_itself_through_others() -> None:
    """No import cycle between project modules, counting imports inside functions and under
    ``TYPE_CHECKING`` (a cycle there still ties the two modules' meanings together)."""
    sources = _sources()
    graph = {name: _imported_modules(path, set(sources)) - {name} for name, path in sources.items()}
    cycles = []
    for start in graph:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            module = todo.pop()
            if module == start:
                cycles.append(start)
                break
            if module not in seen:
                seen.add(module)
                todo.extend(graph[module])
    assert cycles == []
