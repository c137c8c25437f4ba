"""Benchmarks that need a real node (:data:`~tests.support.benchsmoke.NEEDS_REAL_NODE`) run in
their smoke mode (``--smoke``) as subprocesses: each exits 0 and ends with ``<name>: <number>``
(numbers not checked). Each starts its own local cluster with one real node (hack/local-cluster
with ``LOCAL_CLUSTER_NODES``, the chart installed), not the session's ``control_plane``: it
installs its own release and times pods on a node nothing else uses. The other benchmarks run
in ``tests/integration/test_benchmarks_smoke.py``.
"""

from __future__ import annotations

import pytest

from tests.support.benchsmoke import NEEDS_REAL_NODE, run_smoke

pytestmark = pytest.mark.e2e

SMOKE_TIMEOUT_S = 840.0
"""Longest a smoke run may take, seconds: a cluster with a real node, the images, the chart."""


@pytest.mark.timeout(SMOKE_TIMEOUT_S + 60)
@pytest.mark.parametrize("script", sorted(NEEDS_REAL_NODE))
def test_benchmark_smoke_on_a_real_node(script: str) -> None:
    print(run_smoke(script, [], SMOKE_TIMEOUT_S))
