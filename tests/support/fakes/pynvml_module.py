"""A fake ``pynvml`` module for :class:`~dra_driver.gpus.nvml.NvmlGpuSource`: the calls the
inventory makes, answering from :class:`FakeCard` records (memory in bytes)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace


class NVMLError(Exception):
    """Base of the fake's NVML errors (as ``pynvml.NVMLError``)."""


class NVMLError_NotSupported(NVMLError):  # noqa: N801 (pynvml's name)
    pass


class NVMLError_FunctionNotFound(NVMLError):  # noqa: N801
    pass


class NVMLError_ArgumentVersionMismatch(NVMLError):  # noqa: N801
    pass


nvmlMemory_v2 = 0x2000028  # noqa: N816 (pynvml's name; its value in nvidia-ml-py 13.615)


@dataclass
class FakeCard:
    """One GPU as NVML reports it; ``reserved``: what the v2 call reports as reserved."""

    total: int
    reserved: int
    name: str = "Tesla T4"
    uuid: str = "GPU-7e1b2a3c-0000-4000-8000-000000000001"
    compute_capability: tuple[int, int] = (7, 5)


class FakePynvml:
    """Module-like object: ``NvmlGpuSource(FakePynvml([...]))``.

    Args:
        cards: the GPUs, index order.
        v2: whether ``nvmlDeviceGetMemoryInfo_v2`` exists (False: an old driver, the v2 call
            raises ``NVMLError_FunctionNotFound`` as pynvml does when the symbol is missing).
    """

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_ArgumentVersionMismatch = NVMLError_ArgumentVersionMismatch
    nvmlMemory_v2 = nvmlMemory_v2

    def __init__(self, cards: list[FakeCard], v2: bool = True) -> None:
        self.cards = cards
        self.v2 = v2
        self.memory_calls: list[int | None] = []

    def nvmlInit(self) -> None:  # noqa: N802 (pynvml's names below)
        pass

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return "580.95.05"

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        return 13000

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:  # noqa: N802
        return self.cards[h].compute_capability

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:  # noqa: N802
        raise NVMLError_NotSupported("MIG")

    def nvmlDeviceGetArchitecture(self, h: int) -> int:  # noqa: N802
        return 6

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:  # noqa: N802
        return h

    def nvmlDeviceGetUUID(self, h: int) -> str:  # noqa: N802
        return self.cards[h].uuid

    def nvmlDeviceGetName(self, h: int) -> bytes:  # noqa: N802
        return self.cards[h].name.encode()

    def nvmlDeviceGetMemoryInfo(  # noqa: N802
        self, h: int, version: int | None = None
    ) -> SimpleNamespace:
        self.memory_calls.append(version)
        card = self.cards[h]
        if version is None:
            return SimpleNamespace(total=card.total, free=card.total, used=0)
        if not self.v2:
            raise NVMLError_FunctionNotFound("Function Not Found")
        if version != nvmlMemory_v2:
            raise NVMLError_ArgumentVersionMismatch("Argument Version Mismatch")
        free = card.total - card.reserved
        return SimpleNamespace(total=card.total, reserved=card.reserved, free=free, used=0)

    def nvmlDeviceGetAttributes(self, h: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(multiprocessorCount=40)

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode())
