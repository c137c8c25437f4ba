"""Installing the driver's Helm chart into the local cluster (hack/local-cluster with real nodes
from hack/local-node), shared by `make demo`, the end-to-end tests and the benchmarks.

Standard library only (plus the `helm` binary that hack/build-k8s builds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HACK = REPO / "hack"
CHART = REPO / "deployments" / "helm" / "gpu-fraction-dra"
CACHE = Path(os.environ.get("DRA_DRIVER_CACHE", str(Path.home() / ".cache" / "dra-driver")))
BIN = CACHE / "bin"


def image_ref(image: str) -> str:
    """The reference of an image that ``make image`` builds (``plugin``, ``tenant``, ...)."""
    return subprocess.run(
        [sys.executable, str(HACK / "build-image"), "--print-ref", image],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def plugin_image() -> tuple[str, str]:
    """(repository, tag) of the plugin image that ``make image`` builds."""
    repo, _, tag = image_ref("plugin").rpartition(":")
    return repo, tag


def local_values(cluster_dir: Path) -> dict[str, Any]:
    """Chart values that every install into the local cluster needs.

    - the image from ``make image``, never pulled (it was imported into each node);
    - ``hostNetwork`` with the API server's loopback address: the local API server listens on
      127.0.0.1 only, which a pod's own network namespace cannot reach;
    - no metrics endpoint and no probes: nodes on one machine share its network, so the
      metrics ports of two nodes' plugins (or of the old and new pod during a rolling update)
      would collide.
    """
    repo, tag = plugin_image()
    port = json.loads((cluster_dir / "ports.json").read_text())["apiserver"]
    return {
        "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
        "hostNetwork": True,
        "extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(port)},
        ],
        "metricsPort": 0,
    }


def ensure_helm() -> None:
    """Build helm from its Go module if it is missing or stale (hack/build-k8s; a no-op when
    current).

    Raises:
        RuntimeError: when the build fails.
    """
    if subprocess.run([str(HACK / "build-k8s"), "helm"]).returncode != 0:
        raise RuntimeError("hack/build-k8s helm failed (see above)")


def link_kubectl() -> Path:
    """Make the kubectl that hack/build-k8s built (the cluster's version, v1.37.2) available
    beside ``dra-driver``: a symlink ``<virtualenv>/bin/kubectl`` (``.venv/bin/kubectl`` under
    ``make demo``). Outside a virtualenv nothing is linked.

    Returns:
        The path to run kubectl by: the link, or the built binary outside a virtualenv.

    Raises:
        RuntimeError: kubectl has not been built (run ``hack/build-k8s kubectl``).
    """
    built = BIN / "kubectl"
    if not os.access(built, os.X_OK):
        raise RuntimeError(f"{built} missing: run hack/build-k8s kubectl")
    if sys.prefix == sys.base_prefix:
        return built
    link = Path(sys.prefix) / "bin" / "kubectl"
    if not (link.is_symlink() and link.resolve() == built.resolve()):
        link.unlink(missing_ok=True)
        link.symlink_to(built)
    return link


def helm(kubeconfig: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the locally built helm against ``kubeconfig``.

    Raises:
        RuntimeError: when helm fails and ``check`` is set (its stderr in the message).
    """
    done = subprocess.run(
        [str(BIN / "helm"), *args],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args[:2])} failed: {done.stderr.strip()}")
    return done


def install(kubeconfig: Path, release: str, namespace: str, values_file: Path, *extra: str) -> None:
    """``helm upgrade --install`` of the chart with ``values_file`` (create the namespace);
    builds helm first when needed."""
    ensure_helm()
    helm(kubeconfig, "upgrade", "--install", release, str(CHART), "--namespace", namespace,
         "--create-namespace", "-f", str(values_file), *extra)  # fmt: skip


def container_log(node_dir: Path, namespace: str, pod: str, container: str) -> list[str]:
    """A container's output as the node's kubelet logged it (CRI log format, text only).

    ``node_dir`` is the node's directory (``<cluster dir>/nodes/<name>``); the kubelet writes
    ``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log`` there.
    """
    lines = []
    for path in sorted((node_dir / "pod-logs").glob(f"{namespace}_{pod}_*/{container}/*.log")):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ", 3)
            lines.append(parts[3] if len(parts) == 4 else line)
    return lines
