"""A layer's public face, loaded lazily: ``from dra_driver.prepare import ClaimPreparation``
imports ``prepare/preparation.py`` at that moment and nothing else of the layer, so that a
command or program that needs one module of a layer (the MPS node service, ``render-slices``)
does not load the rest (the Kubernetes client, protobuf).

A layer's ``__init__.py`` lists its face once, as imports under ``if TYPE_CHECKING:`` (what
type checkers read; ``from dra_driver.infra import logs`` puts a whole module in the face) with
the same names in ``__all__``, and sets
``__getattr__ = lazy_face(__name__, __file__)``; the first look-up of a name reads that block
(Python docs, "Customizing module attribute access", PEP 562). ``tests/test_layering.py``
checks that every name in ``__all__`` loads and that ``app/``, ``devtools/`` and
``benchmarks/`` import other layers only through their faces."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from functools import cache
from pathlib import Path


@cache
def face_names(init_file: str) -> dict[str, tuple[str, str]]:
    """Name in the face -> (the module it comes from, its name there), read from the ``if
    TYPE_CHECKING:`` imports of ``init_file`` (a layer's ``__init__.py``)."""
    names: dict[str, tuple[str, str]] = {}
    for node in ast.parse(Path(init_file).read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom) and imp.module:
                    names.update({a.asname or a.name: (imp.module, a.name) for a in imp.names})
    return names


def lazy_face(package: str, init_file: str) -> Callable[[str], object]:
    """The module ``__getattr__`` of ``package``'s face (see the module).

    Raises (from the returned function):
        AttributeError: ``name`` is not in the face.
    """

    def __getattr__(name: str) -> object:
        source = face_names(init_file).get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, original = source
        if module == package:  # a submodule of the layer, in the face as a whole
            return importlib.import_module(f"{package}.{original}")
        return getattr(importlib.import_module(module), original)

    return __getattr__
