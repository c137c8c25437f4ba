"""The real GPU inventory through NVML (``nvidia-ml-py``, module ``pynvml``)."""

from __future__ import annotations

from typing import Any

import structlog

from dra_driver.gpus.model import Gpu, GpuSourceError, Inventory, SkippedGpu

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


def normalize_pci_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:19:00.0`` as the 4-digit-domain lower-case form ``0000:19:00.0``."""
    domain, _, rest = bus_id.partition(":")
    return f"{int(domain, 16):04x}:{rest.lower()}"


class NvmlGpuSource:
    """A :class:`~dra_driver.gpus.model.GpuSource` backed by NVML.

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
            raise GpuSourceError(f"NVML init failed (is the NVIDIA driver loaded?): {exc}") from exc
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
            memory_bytes=int(nv.nvmlDeviceGetMemoryInfo(h).total),
            sm_count=int(nv.nvmlDeviceGetAttributes(h).multiprocessorCount),
            compute_capability=f"{major}.{minor_cc}",
            architecture=arch,
            pci_bus_id=normalize_pci_bus_id(_text(nv.nvmlDeviceGetPciInfo(h).busId)),
            mig_enabled=mig,
            driver_version=driver,
            cuda_driver_version=cuda,
        )
