"""The OCI state runc writes on a createRuntime hook's stdin (runtime-spec "State"), with the
CRI annotations containerd adds naming the pod and container."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def oci_state(
    container: str, pid: int, bundle: Path, pod: str = "pod-a", namespace: str = "team-a"
) -> dict[str, Any]:
    """The state of container ``container`` (process ``pid``) being created from ``bundle``,
    in pod ``namespace``/``pod``, its container named ``main``."""
    return {
        "ociVersion": "1.0.2",
        "id": container,
        "status": "creating",
        "pid": pid,
        "bundle": str(bundle),
        "annotations": {
            "io.kubernetes.cri.container-name": "main",
            "io.kubernetes.cri.sandbox-name": pod,
            "io.kubernetes.cri.sandbox-namespace": namespace,
        },
    }
