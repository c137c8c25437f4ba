"""The GPU record every inventory source returns, and the source interface."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dra_driver.model.errors import StartupError

MIB = 1024 * 1024
"""Bytes in one MiB."""

MPS_MIN_COMPUTE_CAPABILITY = (7, 0)
"""Oldest compute capability (Volta) whose MPS clients each own a GPU address space and get
execution resource provisioning (NVIDIA MPS docs, "Introduction", "Volta MPS"); pre-Volta MPS
was reported as unsupported to NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu
#974)."""


def pre_volta_reason(compute_capability: str) -> str | None:
    """Why a GPU of ``compute_capability`` (``"<major>.<minor>"``) cannot get MPS fractions,
    or None when it can (or when the value does not parse: nothing is refused on a guess)."""
    major, _, minor = compute_capability.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        return None
    if (int(major), int(minor)) >= MPS_MIN_COMPUTE_CAPABILITY:
        return None
    return (
        f"compute capability {compute_capability} < 7.0: pre-Volta MPS clients share one GPU "
        "address space and get no resource provisioning, so fractions cannot be enforced"
    )


@dataclass(frozen=True)
class Gpu:
    """One physical NVIDIA GPU as seen by NVML (or simulated with the same fields).

    Attributes:
        index: NVML device index (0-based).
        minor: device minor number; the device node is ``/dev/nvidia<minor>``.
        uuid: NVML UUID, e.g. ``GPU-0f5b1c9e-...``.
        name: product name as NVML reports it, e.g. ``NVIDIA H200``.
        memory_bytes: device memory processes can allocate, in bytes: the card's total minus
            what the driver reserves for itself (NVML ``nvmlDeviceGetMemoryInfo`` v2
            ``total - reserved``; see :func:`dra_driver.gpus.nvml.usable_memory_bytes`).
        sm_count: streaming multiprocessor count.
        compute_capability: ``"<major>.<minor>"``, e.g. ``"9.0"``.
        architecture: lower-case architecture name, e.g. ``hopper``.
        pci_bus_id: PCI bus id in the ``0000:19:00.0`` form (lower-case hex).
        mig_enabled: whether MIG mode is currently enabled (such GPUs are not offered as
            MPS fractions).
        driver_version: NVIDIA kernel driver version, e.g. ``615.71.09``.
        cuda_driver_version: CUDA driver API version, ``"<major>.<minor>"``, e.g. ``13.4``.
    """

    index: int
    minor: int
    uuid: str
    name: str
    memory_bytes: int
    sm_count: int
    compute_capability: str
    architecture: str
    pci_bus_id: str
    mig_enabled: bool
    driver_version: str
    cuda_driver_version: str

    @property
    def memory_mib(self) -> int:
        """:attr:`memory_bytes` in whole MiB (rounded down)."""
        return self.memory_bytes // MIB

    @property
    def device_node(self) -> str:
        """The GPU's character device path, ``/dev/nvidia<minor>``."""
        return f"/dev/nvidia{self.minor}"


@dataclass(frozen=True)
class SkippedGpu:
    """A GPU the source saw but could not read; reported, never offered.

    Attributes:
        index: NVML device index.
        reason: human-readable error, e.g. ``NVML_ERROR_GPU_IS_LOST``.
    """

    index: int
    reason: str


@dataclass(frozen=True)
class Inventory:
    """The result of one discovery: readable GPUs in index order plus skipped ones."""

    gpus: tuple[Gpu, ...]
    skipped: tuple[SkippedGpu, ...] = ()


def driver_change(before: Inventory, now: Inventory) -> str | None:
    """How the NVIDIA driver changed between two discoveries of one running plugin, or None:
    a GPU (same UUID) with another device minor (``/dev/nvidia<minor>``: a reloaded driver may
    number its GPUs anew, and a CDI spec naming the old node gives a container another GPU or
    none) or another driver version. GPUs that came or went are not a change of the driver
    (lost GPUs are tainted instead)."""
    old = {g.uuid: g for g in before.gpus}
    for gpu in now.gpus:
        was = old.get(gpu.uuid)
        if was is None:
            continue
        if was.minor != gpu.minor:
            return f"GPU {gpu.uuid} is {gpu.device_node} now, was {was.device_node}"
        if was.driver_version != gpu.driver_version:
            return f"NVIDIA driver {gpu.driver_version} now, was {was.driver_version}"
    return None


class GpuSource(Protocol):
    """Anything that can list the node's GPUs (NVML or a simulated inventory)."""

    def discover(self) -> Inventory:
        """Return the node's GPUs; per-GPU read failures go to ``Inventory.skipped``.

        Raises:
            GpuSourceError: when the source as a whole cannot be used (no driver, NVML init
                failure).
        """
        ...


class GpuSourceError(StartupError, RuntimeError):
    """The GPU source as a whole is unusable (e.g. NVML cannot be initialised)."""


NVML_INIT_FAILED = "NVML init failed (is the NVIDIA driver loaded?)"
"""The start of :class:`GpuSourceError`'s message when ``nvmlInit`` fails (NVML's own error
text follows, e.g. ``Driver Not Loaded`` after a reboot before the driver is loaded)."""
