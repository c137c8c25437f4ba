"""The error tree: every exception class of the package derives from the project base, and the
two branches are handled where the errors module says (per claim; one line, exit 2)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import dra_driver
from dra_driver.model.errors import ClaimError, DriverError, StartupError


def _exception_classes() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(dra_driver.__path__, "dra_driver."):
        if info.name.endswith("__main__") or "._proto" in info.name:
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
            ):
                found.append(obj)
    return found


def test_every_exception_derives_from_the_project_base() -> None:
    classes = _exception_classes()
    assert len(classes) >= 15  # the walk found the package's classes
    outside = [f"{c.__module__}.{c.__name__}" for c in classes if not issubclass(c, DriverError)]
    assert outside == []


def test_claim_and_startup_branches_are_disjoint() -> None:
    for cls in _exception_classes():
        assert not (issubclass(cls, ClaimError) and issubclass(cls, StartupError)), cls


@pytest.mark.integration  # starts a real process
def test_a_startup_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "node.yaml"
    bad.write_text("apiVersion: gpu-fraction.dra.dev/v1alpha1\nkind: NodeConfig\nbogus: 1\n")
    args = ["render-slices", "--node", "n1", "--gpus", "simulated:H200x1", "--config", str(bad)]
    done = subprocess.run(
        [sys.executable, "-m", "dra_driver", *args], capture_output=True, text=True, timeout=60
    )
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2
    assert len(err) == 1 and err[0].startswith("error: ") and "bogus" in err[0]
