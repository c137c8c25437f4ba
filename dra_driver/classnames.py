"""Names derived from the driver's vocabulary: DeviceClass names (``gpu-quarter``,
``gpu-quarter-sm-sharing``, ``gpu-memory``), extended-resource names and label values.

Pure: the DeviceClasses (:mod:`dra_driver.deviceclasses`), the sizing admission policy
(:mod:`dra_driver.sizing`) and the ResourceSlices (:mod:`dra_driver.slices`) share these names.
"""

from __future__ import annotations

import re

from dra_driver.vocabulary import ComputeMode

DEFAULT_COMPUTE_MODE = ComputeMode.TIME_SLICING
"""The mode whose classes carry no mode suffix (``gpu-quarter``)."""

CAPACITY_CLASS_STEM = "memory"
"""Stem of the capacity model's class names (``gpu-memory``); reserved as a product name."""


def device_class_name(product: str | None, compute_mode: str) -> str:
    """Class name: ``gpu-<product>`` or ``gpu-memory`` (product None), plus ``-<mode>`` for a
    mode other than time-slicing. At most 55 characters for valid product names."""
    stem = product if product is not None else CAPACITY_CLASS_STEM
    base = f"gpu-{stem}"
    return base if compute_mode == DEFAULT_COMPUTE_MODE else f"{base}-{compute_mode}"


def label_value(text: str) -> str:
    """``text`` as a label value (at most 63 characters of ``[A-Za-z0-9_.-]``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.") or "dra-driver"


def extended_resource_name(driver: str, compute_mode: str, product: str) -> str:
    """``<driver>/<product>`` (time-slicing) or ``<driver>/<product>-<mode>``: the extended
    resource a pod may request instead of a claim (``resources.limits``)."""
    suffix = "" if compute_mode == DEFAULT_COMPUTE_MODE else f"-{compute_mode}"
    return f"{driver}/{product}{suffix}"
