"""``make test`` runs every tier and reports each, on a copy of the Makefile whose tools are
stand-ins (no virtualenv, cluster or Go build is touched)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import REPO

ROOT = REPO
TIERS = ("lint", "unit", "integration", "e2e")


def stub(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def make_test(tmp_path: Path, failing: set[str]) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run ``make test`` in ``tmp_path`` with the repository's Makefile; tools of the tiers
    in ``failing`` exit 1. Returns the result and the log of what ran."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    stamp = tmp_path / ".venv" / ".installed"
    stamp.parent.mkdir()
    stamp.write_text("")
    os.utime(tmp_path / "pyproject.toml", (1, 1))  # the virtualenv counts as installed
    ran = tmp_path / "ran"
    status = {tier: "1" if tier in failing else "0" for tier in TIERS}
    stub(tmp_path / ".venv/bin/ruff", f"echo lint >> {ran}; exit {status['lint']}")
    stub(tmp_path / ".venv/bin/mypy", "exit 0")
    python = (
        f'case "$*" in *"-m e2e"*) t=e2e; s={status["e2e"]};; '
        f'*"-m integration"*) t=integration; s={status["integration"]};; '
        f"*) t=unit; s={status['unit']};; esac"
    )
    stub(tmp_path / ".venv/bin/python", f'{python}; echo "$t" >> {ran}; exit "$s"')
    stub(tmp_path / "hack/install-node-prereqs", "exit 0")
    stub(tmp_path / "hack/build-k8s", f'echo "build-k8s $*" >> {ran}; exit 0')
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    result = subprocess.run(
        ["make", "test"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60
    )
    return result, ran.read_text() if ran.exists() else ""


@pytest.mark.parametrize("failing", [set(), {"lint"}, {"unit"}, {"integration"}, {"lint", "e2e"}])
def test_make_test_runs_every_tier_and_reports_each(tmp_path: Path, failing: set[str]) -> None:
    result, ran = make_test(tmp_path, failing)
    tiers = [line for line in ran.splitlines() if not line.startswith("build-k8s")]
    assert set(tiers) == set(TIERS), result.stdout + result.stderr
    assert (result.returncode != 0) == bool(failing)
    summary = result.stdout.splitlines()[-len(TIERS) :]
    assert summary == [f"make test: {t} {'FAILED' if t in failing else 'passed'}" for t in TIERS], (
        result.stdout
    )


def test_integration_builds_the_control_plane_and_helm_before_its_tests(tmp_path: Path) -> None:
    """A cold build of the binaries inside a test's fixture ran past pytest's 300 s timeout
    on a fresh machine (CI on a new clone: test_occupancy_cluster errored)."""
    result, ran = make_test(tmp_path, set())
    lines = ran.splitlines()
    assert "integration" in lines, result.stdout + result.stderr
    before = lines[: lines.index("integration")]
    built = {name for line in before if line.startswith("build-k8s") for name in line.split()[1:]}
    assert built >= {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "helm"}
