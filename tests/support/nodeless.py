"""A kubelet-less local control plane (``hack/local-cluster`` with no nodes) for tests that
need only the API server, the scheduler and the controllers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO


def local_cluster(state: Path, cmd: str) -> subprocess.CompletedProcess[str]:
    """Run ``hack/local-cluster <cmd>`` (``up``, ``down``, ``status``) for the cluster whose
    state is ``state``, without nodes; its output is captured."""
    env = {**os.environ, "LOCAL_CLUSTER_DIR": str(state), "LOCAL_CLUSTER_NODES": ""}
    return subprocess.run(
        [sys.executable, str(REPO / "hack" / "local-cluster"), cmd],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
