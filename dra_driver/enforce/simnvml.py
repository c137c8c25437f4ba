"""NVML for simulated GPUs: what the MPS enforcer asks NVML, answered for a GPU-less node.

Like the simulated device nodes and hook (:mod:`dra_driver.gpus.simnode`), this lets the real
MPS enforcer run on a simulated node, against the MPS emulator (:mod:`dra_driver.mpsemu`):

- a GPU exists while the simulated inventory lists it (a GPU taken away through the
  ``lost-gpus`` file is gone, as ``nvmlDeviceGetHandleByUUID`` would report);
- its compute mode is kept in ``<root>/compute-mode/<uuid>`` (``DEFAULT`` until set), so it
  outlives a plugin restart as a real GPU's does until the driver reloads;
- per-cgroup memory limits are remembered for the plugin's life and never enforced (no GPU);
- there are no MPS client processes with GPU memory to report.

Nothing here is real NVML: on a GPU node :class:`~dra_driver.enforce.nvmlcontrol.PynvmlFacade` is
used.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from dra_driver.enforce.nvmlcontrol import (
    NVML_COMPUTE_MODES,
    UNLIMITED,
    CgroupMemory,
    MpsProcess,
    NvmlError,
)
from dra_driver.infra.atomicfile import write_atomic


class SimulatedNvml:
    """An :class:`~dra_driver.enforce.nvmlcontrol.NvmlFacade` for simulated GPUs (see the module).

    Args:
        root: directory of its state (``<simulation root>/nvml``).
        gpus: the UUIDs of the GPUs present now (the simulated inventory).
    """

    def __init__(self, root: Path, gpus: Callable[[], Iterable[str]]) -> None:
        self.root = root
        self.gpus = gpus
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
            return self._cgroups.get((uuid, cgroup), CgroupMemory(0, UNLIMITED, 0))

    def set_cgroup_limits(self, uuid: str, cgroup: str, soft_bytes: int, hard_bytes: int) -> None:
        self._check(uuid)
        with self._lock:
            self._cgroups[(uuid, cgroup)] = CgroupMemory(soft_bytes, hard_bytes, 0)

    def mps_processes(self, uuid: str) -> list[MpsProcess]:
        self._check(uuid)
        return []

    def process_sm_utilization(self, uuid: str) -> dict[int, float]:
        self._check(uuid)
        return {}
