"""The few NVML calls enforcement and accounting need, behind a small injectable facade.

Real implementation: :class:`PynvmlFacade` (``nvidia-ml-py`` 13.615.71, module ``pynvml``).
Per-cgroup memory limits (``nvmlDeviceGet/SetMemoryLimits_v1``) exist from driver r615 /
CUDA 13.4; sizes are bytes; the namespace is the cgroup directory path (NVIDIA MPS docs,
"MPS v3 Memory Partitioning").
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

from dra_driver.model.errors import ClaimError

NVML_COMPUTE_MODES = ("DEFAULT", "EXCLUSIVE_THREAD", "PROHIBITED", "EXCLUSIVE_PROCESS")
"""NVML compute modes by value (``NVML_COMPUTEMODE_*`` = 0, 1, 2, 3)."""

UNLIMITED = 0xFFFFFFFFFFFFFFFF
"""``NVML_DEVICE_MEMORY_LIMIT_MAX``: "no hard limit" in per-cgroup memory limits."""


class NvmlError(ClaimError, RuntimeError):
    """An NVML call failed (message includes the NVML error text)."""


@dataclass(frozen=True)
class CgroupMemory:
    """Per-cgroup GPU memory of one GPU (bytes; ``hard_bytes`` = :data:`UNLIMITED` when unset)."""

    soft_bytes: int
    hard_bytes: int
    used_bytes: int


@dataclass(frozen=True)
class MpsProcess:
    """One MPS client process on a GPU (host PID; used memory in bytes, None if unknown)."""

    pid: int
    used_bytes: int | None


class NvmlFacade(Protocol):
    """NVML operations used by the MPS enforcer and accounting; GPUs are named by UUID.

    Every method raises :class:`NvmlError` when NVML fails.
    """

    def has_gpu(self, uuid: str) -> bool:
        """Whether NVML knows a GPU with this UUID."""
        ...

    def compute_mode(self, uuid: str) -> str:
        """The GPU's compute mode, one of :data:`NVML_COMPUTE_MODES`."""
        ...

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        """Set the compute mode (root; not persistent across driver reloads)."""
        ...

    def cgroup_memory(self, uuid: str, cgroup: str) -> CgroupMemory:
        """Soft/hard limit and current use of ``cgroup`` (a directory path) on the GPU."""
        ...

    def set_cgroup_limits(self, uuid: str, cgroup: str, soft_bytes: int, hard_bytes: int) -> None:
        """Set the soft and hard limit of ``cgroup`` on the GPU (root)."""
        ...

    def mps_processes(self, uuid: str) -> list[MpsProcess]:
        """MPS client processes on the GPU (``nvmlDeviceGetMPSComputeRunningProcesses_v3``)."""
        ...

    def process_sm_utilization(self, uuid: str) -> dict[int, float]:
        """SM utilization of each process that used the GPU since the previous call for it,
        percent of the whole GPU's SMs (``nvmlDeviceGetProcessUtilization``, ``smUtil``,
        averaged over the samples of each PID); {} when no process ran."""
        ...


class PynvmlFacade:
    """:class:`NvmlFacade` over ``pynvml``; initialises NVML on first use.

    Args:
        nvml: the ``pynvml`` module (injectable).
    """

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nv = nvml
        self._lock = threading.Lock()
        self._ready = False
        self._last_sample_us: dict[str, int] = {}

    def _handle(self, uuid: str) -> Any:
        with self._lock:
            if not self._ready:
                self._call(self._nv.nvmlInit)
                self._ready = True
        return self._call(self._nv.nvmlDeviceGetHandleByUUID, uuid)

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            raise NvmlError(f"{getattr(fn, '__name__', 'NVML')}: {exc}") from exc

    def close(self) -> None:
        """Shut NVML down if it was initialised."""
        with self._lock:
            if self._ready:
                self._ready = False
                self._call(self._nv.nvmlShutdown)

    def has_gpu(self, uuid: str) -> bool:
        """See :meth:`NvmlFacade.has_gpu`."""
        try:
            self._handle(uuid)
        except NvmlError:
            return False
        return True

    def compute_mode(self, uuid: str) -> str:
        """See :meth:`NvmlFacade.compute_mode`."""
        value = int(self._call(self._nv.nvmlDeviceGetComputeMode, self._handle(uuid)))
        return NVML_COMPUTE_MODES[value] if 0 <= value < len(NVML_COMPUTE_MODES) else str(value)

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        """See :meth:`NvmlFacade.set_compute_mode`."""
        if mode not in NVML_COMPUTE_MODES:
            raise NvmlError(f"unknown compute mode {mode!r}")
        self._call(
            self._nv.nvmlDeviceSetComputeMode, self._handle(uuid), NVML_COMPUTE_MODES.index(mode)
        )

    def cgroup_memory(self, uuid: str, cgroup: str) -> CgroupMemory:
        """See :meth:`NvmlFacade.cgroup_memory`."""
        limits = self._nv.c_nvmlGetMemoryLimits_v1_t()
        limits.nameSpace = cgroup.encode()
        self._call(self._nv.nvmlDeviceGetMemoryLimits_v1, self._handle(uuid), limits)
        return CgroupMemory(int(limits.softLimit), int(limits.hardLimit), int(limits.currentUsed))

    def set_cgroup_limits(self, uuid: str, cgroup: str, soft_bytes: int, hard_bytes: int) -> None:
        """See :meth:`NvmlFacade.set_cgroup_limits`."""
        limits = self._nv.c_nvmlSetMemoryLimits_v1_t()
        limits.nameSpace = cgroup.encode()
        limits.softLimit = soft_bytes
        limits.hardLimit = hard_bytes
        self._call(self._nv.nvmlDeviceSetMemoryLimits_v1, self._handle(uuid), limits)

    def mps_processes(self, uuid: str) -> list[MpsProcess]:
        """See :meth:`NvmlFacade.mps_processes`."""
        procs = self._call(self._nv.nvmlDeviceGetMPSComputeRunningProcesses_v3, self._handle(uuid))
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append(MpsProcess(int(p.pid), int(used) if isinstance(used, int) else None))
        return out

    def process_sm_utilization(self, uuid: str) -> dict[int, float]:
        """See :meth:`NvmlFacade.process_sm_utilization`. The first call per GPU reads every
        sample NVML still holds (its buffer covers the last few seconds); later calls read those
        newer than the newest one seen. [INFERRED] that under MPS NVML attributes samples to the
        client PIDs rather than to the MPS server; ``hack/gpu-check`` verifies it on hardware."""
        handle = self._handle(uuid)
        since = self._last_sample_us.get(uuid, 0)
        try:
            samples = self._nv.nvmlDeviceGetProcessUtilization(handle, since)
        except self._nv.NVMLError as exc:
            if getattr(exc, "value", None) == getattr(self._nv, "NVML_ERROR_NOT_FOUND", None):
                return {}  # no process sampled since ``since``
            raise NvmlError(f"nvmlDeviceGetProcessUtilization: {exc}") from exc
        return process_sm_means(samples, uuid, self._last_sample_us)


def process_sm_means(samples: Any, uuid: str, last_seen_us: dict[str, int]) -> dict[int, float]:
    """Pure but for ``last_seen_us``: the mean ``smUtil`` per ``pid`` of NVML process
    utilization samples (objects with ``pid``, ``timeStamp`` in microseconds, ``smUtil`` in
    percent), and the newest ``timeStamp`` recorded under ``uuid``."""
    per_pid: dict[int, list[int]] = {}
    newest = last_seen_us.get(uuid, 0)
    for sample in samples:
        per_pid.setdefault(int(sample.pid), []).append(int(sample.smUtil))
        newest = max(newest, int(sample.timeStamp))
    last_seen_us[uuid] = newest
    return {pid: sum(v) / len(v) for pid, v in per_pid.items()}
