"""Where a node lives and what it is made of (paths, binaries, images, names), and the helpers every
part uses: the log line, the one error type, commands, pid files, ports."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


CLUSTER = Path(os.environ.get("LOCAL_CLUSTER_DIR", "/tmp/dra-local-cluster")).absolute()


NODES = CLUSTER / "nodes"


CACHE = Path(os.environ.get("DRA_DRIVER_CACHE", str(Path.home() / ".cache" / "dra-driver")))


BIN = CACHE / "bin"


IMAGES = os.environ.get("LOCAL_NODE_IMAGES", str(ROOT / "build" / "images" / "*.oci.tar"))


RUNC = os.environ.get("LOCAL_NODE_RUNC", shutil.which("runc") or "/usr/sbin/runc")


SANDBOX_IMAGE = os.environ.get("LOCAL_NODE_SANDBOX_IMAGE", "localhost/pause:3.10.1")


READY_TIMEOUT = float(os.environ.get("LOCAL_NODE_READY_TIMEOUT", "120"))


CGROUP_FS = Path("/sys/fs/cgroup")


NODE_BINARIES = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr")


CNI_PLUGINS = ("bridge", "host-local", "loopback")


# Standard node paths -> directory under the node's own directory.
NODE_MOUNTS = {
    "/var/lib/kubelet": "kubelet",
    "/var/lib/containerd": "containerd-root",
    "/run/containerd": "containerd-state",
    "/var/run/cdi": "cdi",
    "/var/log/pods": "pod-logs",
    "/var/lib/gpu-fraction-dra": "gpu-fraction-state",
    "/run/gpu-fraction": "gpu-fraction-run",
    "/var/lib/cni": "cni-state",
}


DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"


CONTAINERD_SOCKET = "/run/containerd/containerd.sock"


NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


TAG = hashlib.sha256(str(CLUSTER).encode()).hexdigest()[:6]
"""Distinguishes this cluster's node cgroups and bridges from another cluster's."""


CLOSED_PORT = 9  # discard: nothing listens there on loopback


CREATED = Path(os.environ.get("LOCAL_NODE_REGISTRY", "/run/dra-local-node")) / "created-mountpoints"
"""Host directories that some cluster's `up` created as mount points, machine-wide: whichever
cluster's last node goes when no other node mounts them removes them."""


def log(msg: str) -> None:
    print(f"local-node: {msg}", file=sys.stderr, flush=True)


class NodeError(Exception):
    pass


def node_dir(name: str) -> Path:
    return NODES / name


def run(*args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(args), capture_output=capture, text=True, stdin=subprocess.DEVNULL)
    if check and res.returncode != 0:
        raise NodeError(
            f"{' '.join(args[:3])} failed (exit {res.returncode}): {res.stderr.strip()}"
        )
    return res


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_index(name: str) -> int:
    """A small number per node (bridge name, pod subnet), stable while the node exists."""
    f = node_dir(name) / "index"
    if f.exists():
        return int(f.read_text())
    taken = {int(p.read_text()) for p in NODES.glob("*/index") if p.read_text().strip()}
    idx = next(i for i in range(1, 250) if i not in taken)
    f.write_text(f"{idx}\n")
    return idx


def bridge_name(idx: int) -> str:
    return f"drn{TAG}{idx}"  # at most 15 characters (IFNAMSIZ)


def read_pid(d: Path, comp: str) -> int | None:
    try:
        return int((d / "run" / f"{comp}.pid").read_text())
    except (OSError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def describe(pid: int) -> str:
    """``comm`` and state of a process, e.g. ``sleep Z`` (a zombie its parent never reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    return f"{comm} {stat.rsplit(')', 1)[-1].split()[0]}"
