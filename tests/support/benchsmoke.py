"""Running the scripts in ``benchmarks/`` in their smoke mode (``--smoke``: tiny sizes, numbers
printed, not checked) as subprocesses, for the integration and e2e smoke tests."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support.paths import REPO

BENCHMARKS = REPO / "benchmarks"
"""The benchmark scripts' folder (``benchlib.py`` and ``layouts/`` are not scripts)."""

LIBRARIES = frozenset({"benchlib.py"})
"""Modules in :data:`BENCHMARKS` that are imported by the scripts, not run."""

NEEDS_CONTROL_PLANE = frozenset(
    {"bench_packing.py", "bench_scheduler.py", "check_modes.py", "check_quota_admission.py"}
)
"""Scripts that need a Kubernetes control plane (kubelet-less Nodes created through the API,
the real kube-scheduler): given one with ``--kubeconfig``."""

NEEDS_REAL_NODE = frozenset({"bench_pod_start.py"})
"""Scripts that need a real node (kubelet, containerd, the chart installed): they start their
own local cluster with one (``hack/local-cluster`` with ``LOCAL_CLUSTER_NODES``)."""

RESULT_LINE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*: -?[0-9]+(\.[0-9]+)?")
"""The last line every benchmark prints: ``<name>: <number>``."""


def scripts() -> list[str]:
    """File names of every benchmark script (``benchmarks/*.py`` minus the libraries), sorted;
    a new script is picked up without editing the tests."""
    return sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name not in LIBRARIES)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run_smoke(script: str, args: list[str], timeout: float) -> str:
    """Run ``benchmarks/<script> --smoke <args>`` with this interpreter from the repository
    root, at most ``timeout`` seconds; returns its stdout. Fails the test when it exits non-zero
    or its last stdout line is not ``<name>: <number>``."""
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--smoke", *args],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    shown = f"stdout:\n{_tail(proc.stdout)}\nstderr:\n{_tail(proc.stderr)}"
    assert proc.returncode == 0, f"{script} --smoke exited {proc.returncode}\n{shown}"
    lines = proc.stdout.splitlines()
    last = lines[-1] if lines else ""
    assert RESULT_LINE.fullmatch(last), f"{script}: last line {last!r} is not <name>: <number>"
    return proc.stdout
