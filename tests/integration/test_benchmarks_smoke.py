"""Every benchmark in ``benchmarks/`` runs in its smoke mode (``--smoke``) as a subprocess: it
exits 0 and its last line is ``<name>: <number>`` (the numbers are not checked; tiny sizes on
a shared machine say nothing). One test per script, so a new script is covered without an
edit here.

Scripts that need no cluster run as they are. Those that need a control plane only
(:data:`~tests.support.benchsmoke.NEEDS_CONTROL_PLANE`: kubelet-less Nodes through the API)
share one kubelet-less control plane started here (hack/local-cluster without nodes, as
``test_occupancy_cluster.py`` does; ``make integration`` builds its binaries first) and get
its ``--kubeconfig``. The e2e tier's ``control_plane`` is not used: its real nodes run the
plugin and would take the benchmarks' pods, which name no node. Scripts that need a real node
run in ``tests/e2e/test_benchmarks_smoke.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.benchsmoke import NEEDS_CONTROL_PLANE, NEEDS_REAL_NODE, run_smoke, scripts
from tests.support.nodeless import local_cluster

SMOKE_TIMEOUT_S = 240.0
"""Longest a smoke run may take (pytest's per-test timeout is 300 s, fixture set-up included)."""


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The kubeconfig of a kubelet-less control plane, up for this module's tests."""
    state = tmp_path_factory.mktemp("bench-smoke") / "cluster"
    try:
        up = local_cluster(state, "up")
        if up.returncode != 0:
            pytest.fail(f"hack/local-cluster up failed:\n{up.stderr[-3000:]}")
        yield state / "kubeconfig"
    finally:
        local_cluster(state, "down")


def test_every_classified_benchmark_exists() -> None:
    """A renamed or removed script must not leave a stale entry that no test runs."""
    missing = (NEEDS_CONTROL_PLANE | NEEDS_REAL_NODE) - set(scripts())
    assert not missing, (
        f"classified in tests/support/benchsmoke.py but not in benchmarks/: {missing}"
    )


@pytest.mark.parametrize("script", [s for s in scripts() if s not in NEEDS_REAL_NODE])
def test_benchmark_smoke(script: str, request: pytest.FixtureRequest) -> None:
    args = []
    if script in NEEDS_CONTROL_PLANE:
        args = ["--kubeconfig", str(request.getfixturevalue("kubeconfig"))]
    print(run_smoke(script, args, SMOKE_TIMEOUT_S))
