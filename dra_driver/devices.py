"""Records shared by the pure core and the effects: a published device and a device's health.

No I/O and no imports of effect modules: :mod:`dra_driver.slices` (publishing),
:mod:`dra_driver.claimplan` (planning), :mod:`dra_driver.devicehealth` and the kubelet's health
stream all speak these types.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from dra_driver.gpus.model import Gpu


@dataclass(frozen=True)
class FractionDevice:
    """One published device: a product fraction of a GPU, or a GPU's shared capacity device.

    Attributes:
        name: device name in the pool, a DNS label: ``gpu-<index>-<product>-<n>`` (products)
            or ``gpu-<index>`` (capacity).
        gpu: the parent GPU.
        fraction_model: ``products`` or ``capacity``.
        product: product name (products model), else None.
        portion: share of the card (products model), else None.
        memory_bytes: the device's guaranteed memory: the product's memory (``portion`` x card,
            rounded down to a whole MiB; the whole card for portion 1), or for the capacity
            model the whole card (a claim's share is its ``consumedCapacity``).
        compute_mode: ``time-slicing`` or ``sm-sharing`` (the GPU's mode).
        counter_set: the counter set it consumes from (products model), else None.
        slots: slots consumed from ``counter_set`` (products model), else 0.
    """

    name: str
    gpu: Gpu
    fraction_model: str
    product: str | None
    portion: Fraction | None
    memory_bytes: int
    compute_mode: str
    counter_set: str | None = None
    slots: int = 0


@dataclass(frozen=True)
class DeviceStatus:
    """Health of one device: healthy or not, and why (<= 1024 characters are sent)."""

    healthy: bool
    message: str
