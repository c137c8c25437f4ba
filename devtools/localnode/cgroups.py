"""The node's cgroups: one subtree per hierarchy for its runtime and one for its pods, every
process in them found and killed, the trees removed."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from devtools.localnode.common import CGROUP_FS, TAG


def hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, named ones, and the v2 one)."""
    found = []
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if fields[2] in ("cgroup", "cgroup2") and fields[1].startswith(str(CGROUP_FS)):
                found.append(Path(fields[1]))
    return found


def cgroup_names(name: str) -> tuple[str, str]:
    """(pods cgroup root, runtime cgroup) of a node, relative to each hierarchy; unique per
    cluster directory, so two clusters' nodes of the same name never share one."""
    return f"dra-node-{TAG}-{name}", f"dra-node-{TAG}-{name}.runtime"


def make_cgroups(name: str) -> None:
    for h in hierarchies():
        for cg in cgroup_names(name):
            d = h / cg
            d.mkdir(exist_ok=True)
            if (h / "cpuset.cpus").exists():  # cpuset v1: a new cgroup starts empty
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (d / f).write_text((h / f).read_text())


def cgroup_tree(top: Path) -> list[Path]:
    """``top`` and every cgroup below it, parents first. The kubelet, containerd and runc
    remove pod cgroups meanwhile: one that vanishes between listing and reading is skipped
    (``os.walk`` ignores it; ``Path.rglob`` raises FileNotFoundError)."""
    return [Path(d) for d, _, _ in os.walk(top)]


def cgroup_pids(name: str) -> set[int]:
    pids: set[int] = set()
    for h in hierarchies():
        for cg in cgroup_names(name):
            for d in cgroup_tree(h / cg):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(p) for p in (d / "cgroup.procs").read_text().split())
    return pids


def remove_cgroups(name: str) -> list[str]:
    """rmdir the node's cgroup trees, deepest first; returns those that stayed."""
    left = []
    for h in hierarchies():
        for cg in cgroup_names(name):
            for d in sorted(cgroup_tree(h / cg), key=lambda p: -len(p.parts)):
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(str(d))
    return left


def join_cgroup(name: str, pid: int) -> None:
    runtime = cgroup_names(name)[1]
    for h in hierarchies():
        with contextlib.suppress(OSError):
            (h / runtime / "cgroup.procs").write_text(f"{pid}\n")


def pid_in_node(pid: int, name: str) -> bool:
    """Whether a recorded PID still belongs to the node (guards against PID reuse)."""
    try:
        cgroups = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    return f"/{cgroup_names(name)[1]}" in cgroups or f"/{cgroup_names(name)[0]}/" in cgroups
