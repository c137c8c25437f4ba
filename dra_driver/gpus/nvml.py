"""The real GPU inventory through NVML (``nvidia-ml-py``, module ``pynvml``)."""

from __future__ import annotations

from typing import Any

import structlog

from dra_driver.model.gpu import (
    MIB,
    NVML_INIT_FAILED,
    Gpu,
    GpuSourceError,
    Inventory,
    SkippedGpu,
)

log = structlog.get_logger(__name__)

_ARCHITECTURES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada-lovelace",
    9: "hopper",
    10: "blackwell",
}
"""``nvmlDeviceGetArchitecture`` values (NVML_DEVICE_ARCH_*) to names."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def cuda_version_text(raw: int) -> str:
    """NVML's CUDA driver version integer (e.g. 13040) as ``"13.4"``."""
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def usable_memory_bytes(nv: Any, handle: Any, index: int) -> int:
    """Device memory processes can allocate, in bytes: ``total - reserved`` of
    ``nvmlDeviceGetMemoryInfo(handle, version=nvmlMemory_v2)``.

    The v1 call's ``total`` includes the memory the driver reserves for itself (a few hundred
    MiB: about 450 MiB on a T4, KAI Scheduler #2212), which no process can allocate; a ``full``
    product built on it would promise memory that is not there. When the driver lacks the v2
    call (``NVMLError_FunctionNotFound``, ``_NotSupported``, ``_ArgumentVersionMismatch``) the
    v1 total is used and a warning logged.

    Raises:
        nv.NVMLError: when the v1 call fails too.
    """
    unsupported = (
        nv.NVMLError_FunctionNotFound,
        nv.NVMLError_NotSupported,
        nv.NVMLError_ArgumentVersionMismatch,
    )
    try:
        info = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
    except unsupported as exc:
        total = int(nv.nvmlDeviceGetMemoryInfo(handle).total)
        log.warning(
            "NVML memory info v2 unsupported: offering the v1 total, which includes "
            "driver-reserved memory no process can allocate",
            gpu=index,
            total_mib=total // MIB,
            error=str(exc),
        )
        return total
    return int(info.total) - int(info.reserved)


def normalize_pci_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:19:00.0`` as the 4-digit-domain lower-case form ``0000:19:00.0``."""
    domain, _, rest = bus_id.partition(":")
    return f"{int(domain, 16):04x}:{rest.lower()}"


class NvmlGpuSource:
    """A :class:`~dra_driver.model.gpu.GpuSource` backed by NVML.

    ``nvml`` is the ``pynvml`` module (injectable for tests). Each discovery calls
    ``nvmlInit``/``nvmlShutdown`` once.

    Raises:
        GpuSourceError: from :meth:`discover` when NVML cannot be initialised or counted.
    """

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml

    def discover(self) -> Inventory:
        """Read every GPU; a GPU whose reads fail is skipped with a warning."""
        nv = self._nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise GpuSourceError(f"{NVML_INIT_FAILED}: {exc}") from exc
        try:
            driver = _text(nv.nvmlSystemGetDriverVersion())
            cuda = cuda_version_text(nv.nvmlSystemGetCudaDriverVersion())
            count = nv.nvmlDeviceGetCount()
            gpus: list[Gpu] = []
            skipped: list[SkippedGpu] = []
            for index in range(count):
                try:
                    gpus.append(self._read(index, driver, cuda))
                except nv.NVMLError as exc:
                    log.warning("gpu skipped: NVML read failed", gpu=index, error=str(exc))
                    skipped.append(SkippedGpu(index=index, reason=str(exc)))
            return Inventory(gpus=tuple(gpus), skipped=tuple(skipped))
        except nv.NVMLError as exc:
            raise GpuSourceError(f"NVML query failed: {exc}") from exc
        finally:
            nv.nvmlShutdown()

    def _read(self, index: int, driver: str, cuda: str) -> Gpu:
        nv = self._nvml
        h = nv.nvmlDeviceGetHandleByIndex(index)
        major, minor_cc = nv.nvmlDeviceGetCudaComputeCapability(h)
        try:
            current_mig, _pending = nv.nvmlDeviceGetMigMode(h)
            mig = bool(current_mig)
        except nv.NVMLError_NotSupported:
            mig = False
        try:
            arch = _ARCHITECTURES.get(nv.nvmlDeviceGetArchitecture(h), "unknown")
        except nv.NVMLError_NotSupported:
            arch = "unknown"
        return Gpu(
            index=index,
            minor=nv.nvmlDeviceGetMinorNumber(h),
            uuid=_text(nv.nvmlDeviceGetUUID(h)),
            name=_text(nv.nvmlDeviceGetName(h)),
            memory_bytes=usable_memory_bytes(nv, h, index),
            sm_count=int(nv.nvmlDeviceGetAttributes(h).multiprocessorCount),
            compute_capability=f"{major}.{minor_cc}",
            architecture=arch,
            pci_bus_id=normalize_pci_bus_id(_text(nv.nvmlDeviceGetPciInfo(h).busId)),
            mig_enabled=mig,
            driver_version=driver,
            cuda_driver_version=cuda,
        )
