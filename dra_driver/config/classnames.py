"""Names derived from the driver's vocabulary (pure): DeviceClass names (``gpu-quarter``,
``gpu-quarter-sm-sharing``, ``gpu-memory``), the slots of product classes, and label values.

Pure: the ResourceSlices (:mod:`dra_driver.publish.slices`), the occupancy command and the
chart's DeviceClasses and sizing policies (``deployments/helm/gpu-fraction-dra/templates``,
the objects' one source) share these names; a test holds the chart to them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dra_driver.model.vocabulary import COMPUTE_MODES, ComputeMode

if TYPE_CHECKING:
    from dra_driver.config.node import NodeConfig

DEFAULT_COMPUTE_MODE = ComputeMode.TIME_SLICING
"""The mode whose classes carry no mode suffix (``gpu-quarter``)."""

CAPACITY_CLASS_STEM = "memory"
"""Stem of the capacity model's class names (``gpu-memory``); reserved as a product name."""


def mode_suffix(compute_mode: str) -> str:
    """What a mode adds to class and extended-resource names: nothing for the default mode,
    ``-<mode>`` for the others (``-sm-sharing``)."""
    return "" if compute_mode == DEFAULT_COMPUTE_MODE else f"-{compute_mode}"


MODE_CLASS_SUFFIXES: tuple[str, ...] = tuple(
    mode_suffix(m) for m in COMPUTE_MODES if m != DEFAULT_COMPUTE_MODE
)
"""Suffixes of the other modes' class and extended-resource names (``-sm-sharing``)."""


def device_class_name(product: str | None, compute_mode: str) -> str:
    """Class name: ``gpu-<product>`` or ``gpu-memory`` (product None), plus ``-<mode>`` for a
    mode other than time-slicing. At most 55 characters for valid product names."""
    stem = product if product is not None else CAPACITY_CLASS_STEM
    return f"gpu-{stem}{mode_suffix(compute_mode)}"


def label_value(text: str) -> str:
    """``text`` as a label value (at most 63 characters of ``[A-Za-z0-9_.-]``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.") or "dra-driver"


def product_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a product's name, or None. Class names must stay one per product
    and mode: ``memory`` is the capacity model's stem (``gpu-memory``), and a name ending in a
    mode's suffix would name another product's class (``gpu-quarter-sm-sharing`` is the
    sm-sharing class of ``quarter``; ``memory-sm-sharing`` the capacity model's)."""
    if name == CAPACITY_CLASS_STEM:
        return "is reserved (capacity model class gpu-memory)"
    suffix = next((s for s in MODE_CLASS_SUFFIXES if name.endswith(s)), None)
    if suffix is not None:
        return (
            f"ends in {suffix!r}: its class {device_class_name(name, DEFAULT_COMPUTE_MODE)!r} "
            "would be named like another product's (or the capacity model's) class in that mode"
        )
    return None


def class_slots(config: NodeConfig, compute_modes: Sequence[str] = COMPUTE_MODES) -> dict[str, int]:
    """Product class name -> the slots its claims consume (``portion * slotsPerGpu``): what the
    chart's sizing policy writes into each claim of the class."""
    return {
        device_class_name(p.name, mode): int(p.portion * config.slots)
        for p in config.all_products()
        for mode in compute_modes
    }
