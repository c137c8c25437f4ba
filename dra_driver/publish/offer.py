"""What a node offers (pure): GPU inventory + node configuration -> the devices of each GPU.

:func:`offer` is the single source of truth for which devices exist: the publisher publishes
exactly these (rendered by :mod:`dra_driver.publish.slices`), and Prepare maps an allocated device
name
back to its GPU and compute mode with :func:`devices_by_name`. Per offered GPU and compute
mode one shared device; see :mod:`dra_driver.publish.slices` for the layout and its reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dra_driver.config.node import CapacityPolicy, GpuConfig, NodeConfig, Product
from dra_driver.model.devices import PublishedDevice, product_memory_bytes
from dra_driver.model.gpu import Gpu, Inventory, pre_volta_reason
from dra_driver.model.quantities import canonical_quantity
from dra_driver.model.vocabulary import ComputeMode, FractionModel


@dataclass(frozen=True)
class ExcludedGpu:
    """A GPU that is present but not offered, with the reason (logged as a warning)."""

    index: int
    uuid: str
    reason: str


@dataclass(frozen=True)
class OfferedGpu:
    """An offered GPU: its effective configuration and its devices (in publishing order)."""

    gpu: Gpu
    config: GpuConfig
    devices: tuple[PublishedDevice, ...]

    @property
    def counter_set(self) -> str:
        """Name of the GPU's counter set, which every device of the GPU consumes in full."""
        return gpu_counter_set(self.gpu)


@dataclass(frozen=True)
class Offer:
    """Result of :func:`offer`: offered GPUs in index order plus the excluded ones."""

    gpus: tuple[OfferedGpu, ...]
    excluded: tuple[ExcludedGpu, ...]

    @property
    def devices(self) -> list[PublishedDevice]:
        """Every device of every offered GPU, in publishing order."""
        return [d for g in self.gpus for d in g.devices]


def gpu_counter_set(gpu: Gpu) -> str:
    """Counter set name of a GPU: ``gpu-<index>`` (a DNS label)."""
    return f"gpu-{gpu.index}"


def capacity_request_policy(memory_bytes: int, policy: CapacityPolicy) -> dict[str, Any] | None:
    """The ``requestPolicy`` of a capacity device with ``memory_bytes`` (API JSON), or None when
    ``minimum + step`` exceeds the card (the API rejects such a range; the GPU is not offered).

    ``validRange.max`` is the largest ``minimum + n * step`` within the card; ``default`` is the
    configured default rounded up to the grid (at most ``max``), or ``minimum`` when unset: a
    claim that names no amount gets the least the device gives, never the card (a claim is
    counted by quota as one device whatever it consumes).
    """
    lo, step = policy.minimum, policy.step
    if lo + step > memory_bytes:
        return None
    hi = lo + (memory_bytes - lo) // step * step
    if policy.default is None:
        default = lo
    else:
        default = min(hi, lo + max(0, -(-(policy.default - lo) // step)) * step)
    return {
        "default": canonical_quantity(default),
        "validRange": {
            "min": canonical_quantity(lo),
            "step": canonical_quantity(step),
            "max": canonical_quantity(hi),
        },
    }


def offer(inventory: Inventory, config: NodeConfig) -> Offer:
    """Decide which GPUs are offered and their devices. Pure; never raises for a GPU.

    Per offered GPU and per compute mode it is offered in (both for ``computeMode: auto``),
    one shared device ``gpu-<i>-<mode>``; with ``extendedResources`` also one device per
    product before it (``gpu-<i>-<mode>-<product>``, listed first so that an extended-resource
    claim, which takes a device's default, finds its product's device before the shared one).

    Excluded (not offered): MIG-enabled GPUs (MPS fractions need MIG off), GPUs older than Volta
    (compute capability < 7.0, :func:`~dra_driver.gpus.pre_volta_reason`), GPUs disabled by the
    configuration (``enabled: false``), capacity-model GPUs smaller than ``minimum + step``,
    products-model GPUs on which every product would round to 0 bytes.
    """
    planned: list[OfferedGpu] = []
    excluded: list[ExcludedGpu] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        cfg = config.for_gpu(gpu)
        reason = _exclusion(gpu, cfg)
        if reason:
            excluded.append(ExcludedGpu(gpu.index, gpu.uuid, reason))
            continue
        if cfg.fraction_model == FractionModel.CAPACITY:
            devices = tuple(_device(gpu, mode, FractionModel.CAPACITY) for mode in cfg.modes)
        else:
            devices = _product_devices(gpu, cfg, config)
        planned.append(OfferedGpu(gpu, cfg, devices))
    return Offer(tuple(planned), tuple(excluded))


def _exclusion(gpu: Gpu, cfg: GpuConfig) -> str | None:
    """Why ``gpu`` is not offered, or None."""
    if gpu.mig_enabled:
        return "MIG mode is enabled"
    too_old = pre_volta_reason(gpu.compute_capability)
    if too_old:
        return too_old
    if not cfg.enabled:
        return "disabled by node configuration"
    if cfg.fraction_model == FractionModel.CAPACITY:
        if capacity_request_policy(gpu.memory_bytes, cfg.capacity) is None:
            return "card memory is smaller than capacity.minimum + capacity.step"
    elif not _fitting_products(gpu, cfg):
        return "no product fits the card"
    return None


def _fitting_products(gpu: Gpu, cfg: GpuConfig) -> list[Product]:
    return [p for p in cfg.products if product_memory_bytes(gpu, p.portion) > 0]


def _device(
    gpu: Gpu,
    mode: ComputeMode,
    model: FractionModel,
    slots: int = 0,
    sizes: tuple[int, ...] = (),
    product: Product | None = None,
    default_size: int = 0,
) -> PublishedDevice:
    suffix = f"-{product.name}" if product is not None else ""
    return PublishedDevice(
        name=f"gpu-{gpu.index}-{mode}{suffix}",
        gpu=gpu,
        fraction_model=model,
        product=product.name if product is not None else None,
        portion=product.portion if product is not None else None,
        memory_bytes=gpu.memory_bytes,
        compute_mode=mode,
        counter_set=gpu_counter_set(gpu),
        slots=slots,
        sizes=sizes,
        default_size=default_size,
    )


def shared_default_size(sizes: tuple[int, ...], extended_resources: bool) -> int:
    """Slots a claim that names none consumes on a GPU's shared device (``requestPolicy.default``
    of ``slots``; ``sizes`` ascending).

    The smallest size: a product-class claim that escaped the sizing admission policy gets the
    least, never the card. With extended resources on, the largest: the scheduler's own
    claims for extended resources name no size and are meant for the per-product devices,
    listed before the shared one; the scheduler takes the first device that fits, and a shared
    device that already holds shares can never fit a whole card, so such a claim never lands
    on a shared device in use with a size other than its product's (the allocation guard,
    ``product-sizes`` policy, refuses it should it happen).
    """
    return sizes[-1] if extended_resources else sizes[0]


def _product_devices(gpu: Gpu, cfg: GpuConfig, config: NodeConfig) -> tuple[PublishedDevice, ...]:
    total = config.slots
    products = _fitting_products(gpu, cfg)
    sizes = tuple(sorted({int(p.portion * total) for p in products}))
    default = shared_default_size(sizes, config.extended_resources)
    devices: list[PublishedDevice] = []
    for mode in cfg.modes:
        if config.extended_resources:
            for p in products:
                size = int(p.portion * total)
                devices.append(_device(gpu, mode, FractionModel.PRODUCTS, total, (size,), p, size))
        devices.append(_device(gpu, mode, FractionModel.PRODUCTS, total, sizes, None, default))
    return tuple(devices)


def offered_devices(inventory: Inventory, config: NodeConfig) -> list[PublishedDevice]:
    """All devices the node publishes, in publishing order (see :func:`offer`)."""
    return offer(inventory, config).devices


def devices_by_name(inventory: Inventory, config: NodeConfig) -> dict[str, PublishedDevice]:
    """Map device name -> :class:`PublishedDevice`, for Prepare to resolve an allocation result."""
    return {d.name: d for d in offered_devices(inventory, config)}
