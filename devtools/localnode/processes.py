"""The node's processes: the holder of its mount namespace, containerd and the kubelet started
inside it, the images imported, and every process of the node killed at `down`."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from devtools.localnode.cgroups import cgroup_pids, join_cgroup, pid_in_node
from devtools.localnode.common import (
    BIN,
    CONTAINERD_SOCKET,
    CREATED,
    DEFAULT_KUBELET_ROOT,
    IMAGES,
    NodeError,
    alive,
    read_pid,
    run,
    tail,
)
from devtools.localnode.configs import kubelet_root, node_mounts


def start_holder(name: str, d: Path) -> int:
    """The process that keeps the node's mount namespace open, with its bind mounts."""
    # The host's / may be private (no systemd here), and then `--propagation slave` leaves it
    # private in the node; runc refuses HostToContainer mounts (the chart's host-root mount)
    # from a private mount. Shared inside the node's namespace only: no peer of the host's.
    script = ["set -e", "mount --make-rshared /"]
    created = []
    for target, sub in node_mounts(kubelet_root(d)).items():
        src = d / sub
        src.mkdir(parents=True, exist_ok=True)
        real = Path(os.path.realpath(target))
        if not real.exists():
            real.mkdir(parents=True)
            created.append(str(real))
        script.append(f"mount --bind {shlex.quote(str(src))} {shlex.quote(str(real))}")
    CREATED.parent.mkdir(parents=True, exist_ok=True)
    with open(CREATED, "a") as f:  # removed when the last node of any cluster goes
        f.writelines(p + "\n" for p in created)
    script.append("exec sleep infinity")
    cmd = ["unshare", "--mount", "--propagation", "slave", "--", "/bin/sh", "-c", "\n".join(script)]
    with open(d / "logs" / "holder.log", "ab") as err:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True,
        )  # fmt: skip
    join_cgroup(name, proc.pid)
    (d / "run" / "holder.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the namespace is ready once `sleep` runs in it
        with contextlib.suppress(OSError):
            if Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep":
                return proc.pid
        if proc.poll() is not None:
            raise NodeError(f"node holder exited: {(d / 'logs' / 'holder.log').read_text()}")
        time.sleep(0.02)
    raise NodeError("node holder did not start within 10s")


def in_node(d: Path, argv: list[str]) -> list[str]:
    holder = read_pid(d, "holder")
    if not alive(holder):
        raise NodeError(f"node {d.name} is not running (no holder process)")
    return ["nsenter", f"--mount=/proc/{holder}/ns/mnt", "--", *argv]


def start_component(name: str, d: Path, comp: str, argv: list[str]) -> int:
    with open(d / "logs" / f"{comp}.log", "ab") as out:
        proc = subprocess.Popen(
            in_node(d, argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=d,
        )  # fmt: skip
    join_cgroup(name, proc.pid)
    (d / "run" / f"{comp}.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def containerd_argv(d: Path) -> list[str]:
    return [str(BIN / "containerd"), "--config", str(d / "containerd.toml"), "--log-level", "warn"]


def kubelet_argv(name: str, d: Path) -> list[str]:
    labels = os.environ.get("LOCAL_NODE_LABELS", "")
    root = kubelet_root(d)
    return [
        str(BIN / "kubelet"),
        *([f"--root-dir={root}"] if root != DEFAULT_KUBELET_ROOT else []),
        f"--config={d / 'kubelet.yaml'}",
        f"--kubeconfig={d / 'kubelet.kubeconfig'}",
        f"--hostname-override={name}",
        *([f"--node-labels={labels}"] if labels else []),
        "--v=1",
    ]


def ctr(d: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "ctr"), "--address", CONTAINERD_SOCKET, "-n", "k8s.io", *args]
    return run(*in_node(d, argv))


def wait_containerd(d: Path, deadline: float) -> None:
    while True:
        res = subprocess.run(
            in_node(d, [str(BIN / "ctr"), "--address", CONTAINERD_SOCKET, "version"]),
            capture_output=True, text=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if res.returncode == 0:
            return
        if not alive(read_pid(d, "containerd")) or time.monotonic() > deadline:
            raise NodeError(f"containerd did not start:\n{tail(d / 'logs' / 'containerd.log')}")
        time.sleep(0.2)


def import_images(d: Path) -> list[str]:
    import glob

    done = []
    for archive in sorted(glob.glob(IMAGES)):
        ctr(d, "images", "import", "--no-unpack=false", archive)
        done.append(Path(archive).name)
    return done


def kill_node_processes(name: str, d: Path) -> int:
    """SIGKILL every process of the node: its cgroups, then the recorded PIDs. Returns count."""
    killed: set[int] = set()
    for _ in range(50):
        pids = cgroup_pids(name)
        for comp in ("holder", "containerd", "kubelet"):
            pid = read_pid(d, comp)
            if pid is not None and alive(pid) and pid_in_node(pid, name):
                pids.add(pid)
        pids = {p for p in pids if alive(p)}
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        time.sleep(0.1)
    return len(killed)
