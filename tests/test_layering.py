"""The import graph's rules, read from the package's folders themselves:

- each folder of ``dra_driver``, nested ones too (``enforce/rules``), is a layer named by its
  dotted path (``enforce.rules``) whose ``__init__.py`` docstring says which layers it may import
  (a line ``May import: model, infra, enforce.rules.``); a module imports only its own layer, the
  layers its folder declares, and the package root (``dra_driver``: the driver name); a folder's
  sub-folders are layers of their own, so the folder declares them too; the declared graph has
  no cycle, and every declared layer is imported by some module of the folder (a line allows no
  more than the code uses, so a wrong new import fails here);
- pure modules (every module of ``model/``, and any module whose docstring's first line starts
  with "Pure" or says "(pure)") import only pure modules, so the pure core can be read and
  tested on its own;
- no module is longer than the cap, compute-mode names are spelled once, and no import cycle.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import dra_driver
from dra_driver.faces import face_names

PACKAGE = Path(dra_driver.__file__).parent
GENERATED = "_proto"
"""The generated gRPC code (``hack/gen-proto``): no layer of its own, used by ``kubelet``."""

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


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def _layer(module: str) -> str | None:
    """The layer (folder, dotted from the package: ``enforce.rules``) of a module, None for the
    package root's own modules."""
    parts = module.split(".")[1:]
    if parts and _is_package(parts):
        return ".".join(parts)
    return ".".join(parts[:-1]) or None


def _is_package(parts: list[str]) -> bool:
    return PACKAGE.joinpath(*parts, "__init__.py").exists()


def _layers() -> dict[str, Path]:
    """Layer -> its ``__init__.py``, nested folders included, the generated code left out."""
    return {
        ".".join(init.parent.relative_to(PACKAGE).parts): init
        for init in sorted(PACKAGE.rglob("__init__.py"))
        if init.parent != PACKAGE and GENERATED not in init.parts
    }


def _declared() -> dict[str, set[str]]:
    """Layer -> the layers its ``__init__.py`` says it may import."""
    layers = {}
    for layer, init in _layers().items():
        doc = _docstring(init)
        match = re.search(r"^May import: (.+?)\.?$", doc, re.MULTILINE)
        assert match, f"{init} does not say what its layer may import ('May import: ...')"
        words = re.findall(r"[a-z_][a-z_.]*[a-z_]|[a-z_]", match.group(1).split("(")[0])
        allowed = set() if words[:1] == ["nothing"] else set(words)
        if "every" in words:
            allowed = set(_layers()) | {GENERATED}
        layers[layer] = allowed - {"of", "the", "and", "layer", "generated"}
    return layers


def _used() -> dict[str, set[str]]:
    """Layer -> the other layers its modules import (the generated code counts as a layer)."""
    sources = _sources()
    used: dict[str, set[str]] = {}
    for name, path in sources.items():
        own = _layer(name)
        if own is None:
            continue
        for m in _imports(path):
            layer = GENERATED if m.startswith(f"dra_driver.{GENERATED}") else _layer(m)
            if (m in sources or layer == GENERATED) and layer not in (None, own):
                used.setdefault(own, set()).add(layer)
    return used


def test_every_layer_declares_what_it_may_import_and_the_layers_form_no_cycle() -> None:
    declared = _declared()
    assert {
        "model",
        "infra",
        "config",
        "gpus",
        "enforce",
        "enforce.rules",
        "enforce.mps",
        "enforce.mpsservice",
        "publish",
        "prepare",
    } <= set(declared)
    for layer, allowed in declared.items():
        assert allowed <= set(declared) | {GENERATED}, (layer, allowed - set(declared))
    # no cycle: every layer's allowed layers, followed transitively, never lead back to it
    for layer in declared:
        todo, seen = [a for a in declared[layer] if a != layer], set()
        while todo:
            other = todo.pop()
            assert other != layer, f"layers import each other in a cycle through {layer}"
            if other not in seen and other in declared:
                seen.add(other)
                todo.extend(a for a in declared[other] if a != other)


def test_modules_import_only_their_layer_and_the_layers_it_declares() -> None:
    declared = _declared()
    offending = {
        layer: sorted(used - declared[layer] - {layer})
        for layer, used in _used().items()
        if used - declared[layer] - {layer}
    }
    assert offending == {}


def test_every_declared_layer_is_used() -> None:
    """A "May import" line names only what the folder's modules import ("every" aside: the
    app wires the whole package)."""
    used = _used()
    unused = {
        layer: sorted(allowed - used.get(layer, set()))
        for layer, allowed in _declared().items()
        if "every" not in _docstring(_layers()[layer]).split("May import:")[1].split("\n")[0]
        and allowed - used.get(layer, set())
    }
    assert unused == {}


def _pure(name: str, path: Path) -> bool:
    """In ``model/``, or the docstring's first line says so: it starts with "Pure" or carries
    "(pure)"."""
    first = _docstring(path).split("\n", 1)[0].lower()
    return _layer(name) == "model" or first.startswith("pure") or "(pure)" in first


def test_pure_modules_import_only_pure_modules() -> None:
    sources = _sources()
    pure = {n for n, p in sources.items() if _pure(n, p)}
    assert len(pure) > 25
    offending = {
        name: sorted(m for m in _imports(sources[name]) if m in sources and m not in pure)
        for name in pure
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
    assert spelled == {"dra_driver.model.vocabulary"}


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


def test_unit_tests_mirror_the_package_folders() -> None:
    """``tests/unit/<folder>/`` for the code of ``dra_driver/<folder>/`` (and of ``devtools/``
    and ``benchmarks/``): no test file at the top, no folder the code does not have."""
    unit = PACKAGE.parent / "tests" / "unit"
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert sorted(p.name for p in unit.glob("test_*.py")) == []
    strays = (
        {p.name for p in unit.iterdir() if p.is_dir() and p.name != "__pycache__"}
        - folders
        - {"devtools", "benchmarks"}
    )
    assert strays == set()


KUBERNETES_CLIENT_USERS = {
    "dra_driver.infra.kubeconfig": "builds API clients",
    "dra_driver.infra.rawapi": "JSON requests; hands on ApiClient and ApiException",
    "dra_driver.publish.publisher": "ResourceSlices through ResourceV1Api",
    "dra_driver.publish.slicewatch": "the ResourceSlice watch",
    "dra_driver.observe.podevents": "reads a claim (its reservedFor pods) through ResourceV1Api",
    "dra_driver.cluster.occupancyread": "the occupancy command's lists",
    "dra_driver.model.quantities": "the client's quantity parser only, no request",
}
"""The modules that import the official Kubernetes client library, and why; the others reach
the API server through these (a client passed along is typed with ``infra.rawapi``'s
``ApiClient``)."""


def test_the_kubernetes_client_is_imported_only_where_requests_are_made() -> None:
    importers = set()
    for name, path in _sources().items():
        for node in ast.walk(ast.parse(path.read_text())):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(m == "kubernetes" or m.startswith("kubernetes.") for m in modules):
                importers.add(name)
    assert importers == set(KUBERNETES_CLIENT_USERS)


FACELESS = {"model", "mpsemu", GENERATED}
"""Layers without a lazy face: the vocabulary (its small pure modules are its face), the MPS
emulator (its modules are programs of their own) and the generated code."""


@pytest.mark.parametrize("layer", sorted(set(_layers()) - FACELESS - {"app"}))
def test_every_name_of_a_layers_face_loads(layer: str) -> None:
    package = importlib.import_module(f"dra_driver.{layer}")
    names = getattr(package, "__all__", [])
    if "." in layer and not names:
        return  # a sub-folder: its parent's face speaks for it
    assert names, f"dra_driver/{layer}/__init__.py has no __all__ (its public face)"
    assert sorted(names) == sorted(set(names))
    missing = [n for n in names if getattr(package, n, None) is None]
    assert missing == []
    typed = set(face_names(str(PACKAGE / layer.replace(".", "/") / "__init__.py")))
    assert typed <= set(names), "a TYPE_CHECKING import of the face is not in __all__"


def test_the_wiring_imports_other_layers_only_through_their_faces() -> None:
    """``app/``, ``devtools/`` and ``benchmarks/`` import ``from dra_driver.<layer> import
    ...``, never a layer's module (model, mpsemu and the generated code aside)."""
    root = PACKAGE.parent
    files = [*(PACKAGE / "app").glob("*.py"), *(root / "devtools").rglob("*.py")]
    files += [*(root / "benchmarks").rglob("*.py")]
    offending = []
    for path in files:
        for module, names in _project_imports(path):
            parts = module.split(".")
            if len(parts) < 2 or parts[1] in FACELESS | {"app"}:
                continue
            if len(parts) > 2:
                offending.append(f"{path.relative_to(root)}: {module}")
                continue
            face = importlib.import_module(module).__all__
            offending += [f"{path.relative_to(root)}: {module}.{n}" for n in names if n not in face]
    assert offending == []


def test_no_module_imports_relatively() -> None:
    """Every project import names its module in full, which the checks above read."""
    relative = [
        f"{name}:{node.lineno}"
        for name, path in _sources().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]
    assert relative == []


def test_the_architecture_page_has_a_section_per_folder_and_names_files_that_exist() -> None:
    """docs/architecture.md keeps step with the folders: one ``### <folder>`` section per layer
    (nested ones as ``enforce/rules``), and every ``folder/file.py`` it names exists."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    sections = set(re.findall(r"^### (\S+)$", page, re.MULTILINE))
    assert sections == {layer.replace(".", "/") for layer in _layers()}
    named = set(re.findall(r"`([a-z_]+(?:/[a-z_]+)*/[a-z_]+\.py)`", page))
    assert len(named) > 30
    root = PACKAGE.parent
    missing = sorted(n for n in named if not (PACKAGE / n).exists() and not (root / n).exists())
    assert missing == []
