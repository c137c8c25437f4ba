"""NVML for simulated GPUs: what the MPS enforcer asks NVML, answered for a GPU-less node.

Like the simulated device nodes and hook (:mod:`dra_driver.gpus.simnode`), this lets the real
MPS enforcer run on a simulated node, against the MPS emulator (:mod:`dra_driver.mpsemu`):

- a GPU exists while the simulated inventory lists it (a GPU taken away through the
  ``lost-gpus`` file is gone, as ``nvmlDeviceGetHandleByUUID`` would report);
- its compute mode is kept in ``<root>/compute-mode/<uuid>`` (``DEFAULT`` until set), so it
  outlives a plugin restart as a real GPU's does until the driver reloads;
- per-cgroup memory limits are remembered for the plugin's life and never enforced (no GPU);
- MPS client processes, their memory and their SM utilization are what the emulated MPS
  servers granted their clients (``<daemon pipe>/<server>/usage.json``,
  :mod:`dra_driver.model.simusage`; a tenant asks for it with ``tenant-probe --use-memory
  --use-sm``); a cgroup's ``currentUsed`` is the memory of the clients whose
  ``/proc/<pid>/cgroup`` is that cgroup or below it.

Nothing here is real NVML: on a GPU node
:class:`~dra_driver.enforce.mps.nvmlcontrol.PynvmlFacade` is used.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from dra_driver.enforce.mps.nvmlcontrol import (
    NVML_COMPUTE_MODES,
    UNLIMITED,
    CgroupMemory,
    MpsProcess,
    NvmlError,
)
from dra_driver.infra.atomicfile import write_atomic
from dra_driver.model import simusage


class SimulatedNvml:
    """An :class:`~dra_driver.enforce.mps.nvmlcontrol.NvmlFacade` for simulated GPUs (see the
    module).

    Args:
        root: directory of its state (``<simulation root>/nvml``).
        gpus: the UUIDs of the GPUs present now (the simulated inventory).
        pipes: the MPS control daemons' pipe directories, whose servers' usage files it reads.
        proc: the ``/proc`` to read client cgroups from.
    """

    def __init__(
        self,
        root: Path,
        gpus: Callable[[], Iterable[str]],
        pipes: Iterable[Path] = (),
        proc: Path = Path("/proc"),
    ) -> None:
        self.root = root
        self.gpus = gpus
        self.pipes = tuple(pipes)
        self.proc = proc
        self._lock = threading.Lock()
        self._cgroups: dict[tuple[str, str], CgroupMemory] = {}

    def _check(self, uuid: str) -> None:
        if not self.has_gpu(uuid):
            raise NvmlError(f"nvmlDeviceGetHandleByUUID: Not Found ({uuid}, simulated)")

    def has_gpu(self, uuid: str) -> bool:
        return uuid in set(self.gpus())

    def _mode_file(self, uuid: str) -> Path:
        return self.root / "compute-mode" / uuid

    def compute_mode(self, uuid: str) -> str:
        self._check(uuid)
        try:
            mode = self._mode_file(uuid).read_text().strip()
        except FileNotFoundError:
            return "DEFAULT"
        except OSError as exc:
            raise NvmlError(f"simulated compute mode of {uuid} unreadable: {exc}") from exc
        return mode if mode in NVML_COMPUTE_MODES else "DEFAULT"

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        self._check(uuid)
        if mode not in NVML_COMPUTE_MODES:
            raise NvmlError(f"nvmlDeviceSetComputeMode: Invalid Argument ({mode})")
        write_atomic(self._mode_file(uuid), f"{mode}\n".encode(), 0o644, durable=False)

    def cgroup_memory(self, uuid: str, cgroup: str) -> CgroupMemory:
        self._check(uuid)
        with self._lock:
            limits = self._cgroups.get((uuid, cgroup), CgroupMemory(0, UNLIMITED, 0))
        used = sum(c.used_bytes for c in self._clients(uuid) if self._within(c.pid, cgroup))
        return CgroupMemory(limits.soft_bytes, limits.hard_bytes, used)

    def set_cgroup_limits(self, uuid: str, cgroup: str, soft_bytes: int, hard_bytes: int) -> None:
        self._check(uuid)
        with self._lock:
            self._cgroups[(uuid, cgroup)] = CgroupMemory(soft_bytes, hard_bytes, 0)

    def mps_processes(self, uuid: str) -> list[MpsProcess]:
        self._check(uuid)
        return [MpsProcess(c.pid, c.used_bytes) for c in self._clients(uuid)]

    def process_sm_utilization(self, uuid: str) -> dict[int, float]:
        self._check(uuid)
        return {c.pid: c.sm_percent for c in self._clients(uuid) if c.sm_percent > 0}

    def _clients(self, uuid: str) -> list[simusage.ClientUse]:
        """The emulated clients using GPU ``uuid`` (unreadable usage files are skipped)."""
        out: list[simusage.ClientUse] = []
        for pipe in self.pipes:
            for path in sorted(pipe.glob(f"*/{simusage.USAGE_FILE}")):
                try:
                    use = simusage.parse(path.read_bytes())
                except (OSError, ValueError):
                    continue
                if not use.gpus or uuid in use.gpus:
                    out.extend(use.clients)
        return out

    def _within(self, pid: int, cgroup: str) -> bool:
        """Whether process ``pid``'s cgroup (``0::<path>`` of ``/proc/<pid>/cgroup``) is the
        directory ``cgroup`` or below it (:func:`cgroup_within`)."""
        try:
            lines = (self.proc / str(pid) / "cgroup").read_text().splitlines()
        except OSError:
            return False
        own = next((x[3:] for x in lines if x.startswith("0::")), "")
        return cgroup_within(own, cgroup)


def cgroup_within(own: str, directory: str) -> bool:
    """Pure: whether a process whose cgroup v2 path is ``own`` (as ``/proc/<pid>/cgroup``
    shows it, relative to the reader's cgroup namespace: ``/../..`` first when the process is
    outside it) lies in the cgroup ``directory`` (a path under the cgroup mount) or below it:
    some tail of ``directory`` of at least two components is ``own`` or a parent of it."""
    parts = [x for x in own.split("/") if x and x != ".."]
    tail = [x for x in directory.split("/") if x]
    for k in range(len(tail) - 1):
        n = len(tail) - k
        if parts[:n] == tail[k:]:
            return True
    return False
