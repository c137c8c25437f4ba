"""Simulated node hardware that a real container runtime accepts.

A simulated inventory (``--gpus simulated:...``) has no NVIDIA driver, yet the CDI specs the
plugin writes go to a real containerd and runc, which check them: containerd stats every
``deviceNodes`` host path (a missing one fails container creation), runc stats every mount
source and hook path. So a simulated node gets, under its *simulation root* (a host path the
plugin owns, the same inside and outside its container):

- ``dev/nvidia<minor>`` per GPU and the control nodes ``dev/nvidiactl``,
  ``dev/nvidia-uvm``, ``dev/nvidia-uvm-tools``: character devices with the NVIDIA driver's
  numbers (major 195: minor N for GPU N, 255 for nvidiactl; nvidia-uvm's major is assigned
  dynamically by a real kernel, :data:`UVM_MAJOR` stands in for it). Containers receive them
  at ``/dev/...``; opening one fails (no driver), which is all a container start needs.
- ``bin/nvidia-cdi-hook``: a recording stand-in for the NVIDIA Container Toolkit's hook. runc
  runs it as the ``createRuntime`` hook of the ``hard`` tier; it writes its arguments and the
  container's ``NVIDIA_GPU_MEMORY_REQUEST``/``NVIDIA_GPU_MEMORY_LIMIT`` (read from the OCI
  bundle's ``config.json``, since a hook receives the OCI state on stdin, not the container's
  environment) to ``hook-records/<container-id>.<gpu-uuid>``. It is a ``/bin/sh`` script using
  only ``sed`` of the host (two processes: it costs a container start about what NVIDIA's
  compiled hook does), and never fails the container.
- ``lost-gpus`` (written by tests, not by the plugin): GPU indexes the simulated inventory
  reports as gone, so a running plugin sees a GPU vanish as it would on a real node.
- ``driver-unloaded`` (written by tests): while it exists, discovery fails as NVML's
  ``nvmlInit`` does when the NVIDIA driver is not loaded (after a reboot, before the driver
  is installed or loaded), so the plugin's start without a driver can be replayed.

Real GPU nodes use none of this: their CDI specs name ``/dev/nvidia*`` and NVIDIA's hook.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dra_driver.infra.atomicfile import ensure_dir, write_atomic
from dra_driver.model.cdi import CONTROL_DEVICE_NODES
from dra_driver.model.gpu import Gpu

NVIDIA_MAJOR = 195
"""Character major of ``/dev/nvidia<N>`` and ``/dev/nvidiactl`` (NVIDIA's driver, fixed)."""
NVIDIACTL_MINOR = 255
UVM_MAJOR = 508
"""Stand-in major of ``/dev/nvidia-uvm`` (minor 0) and ``-uvm-tools`` (minor 1); dynamic on a
real kernel."""

HOOK_NAME = "nvidia-cdi-hook"
RECORDS = "hook-records"
LOST_GPUS = "lost-gpus"
"""File under the simulation root listing GPU indexes the node reports as gone (a test writes
it to take a GPU away from a running plugin; see SimulatedGpuSource)."""
DRIVER_UNLOADED = "driver-unloaded"
"""File under the simulation root whose presence makes discovery fail as without the NVIDIA
driver (a test writes it)."""
DRIVER_RELOADED = "driver-reloaded"
"""File under the simulation root holding an integer: the NVIDIA driver was reloaded and its
GPUs' device minors start there (a test writes it; see SimulatedGpuSource.minor_offset)."""

_HOOK_SCRIPT = r"""#!/bin/sh
# Recording stand-in for nvidia-cdi-hook on a SIMULATED node (written by dra-driver).
# Records its arguments and the container's GPU memory variables; never fails. Two sed
# processes in all: NVIDIA's hook is compiled and starts in about a millisecond, and a pod
# start measured on a simulated node should not measure the stand-in.
records=@RECORDS@
w='[[:space:]]*'
id=; bundle=; request=; limit=
while read -r k x; do
  case $k in i) id=$x ;; b) bundle=$x ;; esac
done <<EOF
$(sed -n -e "h; s/.*\"id\"$w:$w\"\([A-Za-z0-9_.-]*\)\".*/i \1/p" \
  -e "g; s/.*\"bundle\"$w:$w\"\([^\"]*\)\".*/b \1/p" 2>/dev/null)
EOF
gpu=unknown
prev=
for a in "$@"; do
  [ "$prev" = "--gpu-id" ] && gpu=$a
  prev=$a
done
while read -r k x; do
  case $k in r) request=$x ;; l) limit=$x ;; esac
done <<EOF
$(sed -n -e "h; s/.*\"NVIDIA_GPU_MEMORY_REQUEST=\([^\"]*\)\".*/r \1/p" \
  -e "g; s/.*\"NVIDIA_GPU_MEMORY_LIMIT=\([^\"]*\)\".*/l \1/p" "$bundle/config.json" 2>/dev/null)
EOF
[ -d "$records" ] || mkdir -p "$records" 2>/dev/null || exit 0
{
  printf 'container=%s\n' "${id:-unknown}"
  printf 'args=%s\n' "$*"
  printf 'gpu=%s\n' "$gpu"
  printf 'NVIDIA_GPU_MEMORY_REQUEST=%s\n' "$request"
  printf 'NVIDIA_GPU_MEMORY_LIMIT=%s\n' "$limit"
} > "$records/${id:-unknown}.$gpu" 2>/dev/null
exit 0
"""


@dataclass(frozen=True)
class SimulatedNode:
    """Paths of a simulated node's hardware (host paths).

    Attributes:
        root: the simulation root.
        hook_path: the recording stand-in of ``nvidia-cdi-hook``.
    """

    root: Path
    hook_path: Path

    @property
    def device_root(self) -> Path:
        """Host directory standing for ``/``: ``/dev/nvidia0`` is ``<root>/dev/nvidia0``."""
        return self.root

    @property
    def records(self) -> Path:
        """Where the hook stand-in writes one file per (container, GPU)."""
        return self.root / RECORDS


def device_numbers(gpus: Iterable[Gpu]) -> dict[str, tuple[int, int]]:
    """Pure: container path -> (major, minor) of every device node a simulated node needs."""
    nodes = {g.device_node: (NVIDIA_MAJOR, g.minor) for g in gpus}
    ctl, uvm, uvm_tools = CONTROL_DEVICE_NODES
    nodes.update(
        {ctl: (NVIDIA_MAJOR, NVIDIACTL_MINOR), uvm: (UVM_MAJOR, 0), uvm_tools: (UVM_MAJOR, 1)}
    )
    return nodes


def hook_script(records: Path) -> str:
    """Pure: the recording hook's text, writing into ``records``."""
    quoted = "'" + str(records).replace("'", "'\\''") + "'"
    return _HOOK_SCRIPT.replace("@RECORDS@", quoted)


def install(
    root: str | Path, gpus: Iterable[Gpu], hook_path: str | Path | None = None
) -> SimulatedNode:
    """Create the simulated node's device nodes and hook under ``root`` (idempotent).

    A device node that exists with the right type and numbers is left alone; anything else at
    its path is replaced. Needs ``CAP_MKNOD`` (the plugin runs as root).

    Args:
        root: simulation root (host path; created 0755).
        gpus: the simulated inventory's GPUs.
        hook_path: where to write the hook stand-in; default ``<root>/bin/nvidia-cdi-hook``.

    Raises:
        OSError: when a node or the hook cannot be created (e.g. no CAP_MKNOD).
    """
    node = SimulatedNode(Path(root), Path(hook_path or Path(root) / "bin" / HOOK_NAME))
    for path, (major, minor) in device_numbers(gpus).items():
        host = node.device_root / path.lstrip("/")
        ensure_dir(host.parent, 0o755)
        want = os.makedev(major, minor)
        try:
            st = host.lstat()
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == want:
                continue
            host.unlink()
        except FileNotFoundError:
            pass
        os.mknod(host, 0o666 | stat.S_IFCHR, want)
        os.chmod(host, 0o666)
    ensure_dir(node.hook_path.parent, 0o755)
    write_atomic(node.hook_path, hook_script(node.records).encode(), mode=0o755, durable=False)
    os.chmod(node.hook_path, 0o755)  # whatever the umask
    return node
