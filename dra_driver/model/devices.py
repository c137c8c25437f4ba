"""Records shared by the pure core and the effects: a published device and a device's health.

No I/O and no imports of effect modules: :mod:`dra_driver.publish.slices` (publishing),
:mod:`dra_driver.model.plans` (planning), :mod:`dra_driver.publish.devicehealth` and the kubelet's
health
stream all speak these types.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from dra_driver.model.gpu import MIB, Gpu
from dra_driver.model.vocabulary import ComputeMode, FractionModel


@dataclass(frozen=True)
class PublishedDevice:
    """One published device: a GPU in one compute mode, shared by the claims that get it.

    Every device allows multiple allocations (each claim gets a share, with a share ID) and
    consumes its GPU's counter set in full; the scheduler charges that once, at the first
    share, so while one device of a GPU has shares no other device of that GPU is allocated:
    a GPU serves one compute mode (and one device shape) at a time.

    Attributes:
        name: device name in the pool, a DNS label: ``gpu-<index>-<mode>`` (the GPU in
            ``mode``), ``gpu-<index>-<mode>-<product>`` (an extended-resource device), or for
            checkpoints of older versions the names they published.
        gpu: the parent GPU.
        fraction_model: ``products`` (capacity ``slots``: a claim's product is its share of
            the slots) or ``capacity`` (capacity ``memory`` in bytes).
        product: the one product an extended-resource device offers, else None.
        portion: that product's share of the card, else None.
        memory_bytes: the card's memory (a claim's share is its ``consumedCapacity``).
        compute_mode: ``time-slicing`` or ``sm-sharing``: the mode of every claim it holds.
        counter_set: the GPU's counter set (``gpu-<index>``), consumed in full.
        slots: products model: slots of the whole GPU (``slotsPerGpu``), else 0.
        sizes: products model: the slot counts a claim may take (one per offered product,
            ascending; the ``validValues`` of the ``slots`` capacity), else empty.
        default_size: products model: the slots a claim that names none consumes (the
            ``requestPolicy.default`` of ``slots``, see :func:`dra_driver.publish.offer.offer`),
            else 0.
    """

    name: str
    gpu: Gpu
    fraction_model: FractionModel
    product: str | None
    portion: Fraction | None
    memory_bytes: int
    compute_mode: ComputeMode
    counter_set: str | None = None
    slots: int = 0
    sizes: tuple[int, ...] = ()
    default_size: int = 0


@dataclass(frozen=True)
class DeviceStatus:
    """Health of one device: healthy or not, and why (<= 1024 characters are sent)."""

    healthy: bool
    message: str


def product_memory_bytes(gpu: Gpu, portion: Fraction) -> int:
    """Guaranteed memory of a product: ``portion`` x card bytes rounded down to a whole MiB;
    exactly the card for portion 1."""
    return portion_bytes(gpu.memory_bytes, portion)


def portion_bytes(card_bytes: int, portion: Fraction) -> int:
    """``portion`` of a card of ``card_bytes`` bytes, rounded down to a whole MiB (bytes);
    exactly ``card_bytes`` for portion 1 (the rule of :func:`product_memory_bytes`)."""
    if portion == 1:
        return card_bytes
    return math.floor(portion * card_bytes / MIB) * MIB
