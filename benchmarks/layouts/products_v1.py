"""The products layout the driver published before issue 11 (main at ffc424e), generated here
standalone so it can still be measured: one device per product fraction, no sharing.

Per GPU ``i`` (default products eighth, quarter, half, full; time-slicing):

- counter set ``gpu-<i>`` with counters ``memory`` (the card's bytes) and ``slots`` (8);
- devices ``gpu-<i>-<product>-<n>``: eighth x8, quarter x4, half x2, full x1 (15 per GPU,
  120 per 8-GPU node), each with capacity ``memory`` = its product memory (portion x card,
  rounded down to a MiB; the full card for ``full``) and consuming that memory and
  ``portion x 8`` slots from the GPU's counter set;
- attributes: the GPU's (as render-slices gives them today) plus ``fractionModel: products``,
  ``product``, ``portion`` (``"1/4"``) and ``computeMode: time-slicing``.

Slices as then: counter sets in one slice (8 per slice), devices in further slices, whole GPUs
per slice (4 GPUs = 60 devices, under the limit of 64). Classes ``gpu-<product>[-sm-sharing]``
select ``fractionModel == "products" && product == <product> && computeMode == <mode>``; a
claim names only the class (one device of the product).
"""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # noqa: E402

SLOTS = 8
PRODUCTS = {"eighth": Fraction(1, 8), "quarter": Fraction(1, 4), "half": Fraction(1, 2)}
PRODUCTS["full"] = Fraction(1)
MODES = ("time-slicing", "sm-sharing")
DEVICES_PER_GPU = sum(int(1 / p) for p in PRODUCTS.values())
GPUS_PER_SLICE = benchlib.MAX_DEVICES_PER_SLICE // DEVICES_PER_GPU


def quantity(n_bytes: int) -> str:
    """Bytes as the API quantity the old layout wrote: ``<n>Mi`` (every amount here is a whole
    number of MiB), ``<n>Gi`` when a whole number of GiB."""
    if n_bytes % (1024 * benchlib.MIB) == 0:
        return f"{n_bytes // (1024 * benchlib.MIB)}Gi"
    if n_bytes % benchlib.MIB == 0:
        return f"{n_bytes // benchlib.MIB}Mi"
    return str(n_bytes)


def product_memory(card: int, portion: Fraction) -> int:
    """``portion`` x ``card`` bytes rounded down to a whole MiB; the card for portion 1."""
    if portion == 1:
        return card
    return int(portion * card) // benchlib.MIB * benchlib.MIB


def _device(i: int, gpu: dict[str, Any], product: str, n: int) -> dict[str, Any]:
    portion = PRODUCTS[product]
    memory = quantity(product_memory(gpu["gpuMemory"]["int"], portion))
    attrs = {
        **gpu,
        "computeMode": {"string": "time-slicing"},
        "fractionModel": {"string": "products"},
        "product": {"string": product},
        "portion": {"string": str(portion)},
    }
    return {
        "name": f"gpu-{i}-{product}-{n}",
        "attributes": attrs,
        "capacity": {"memory": {"value": memory}},
        "consumesCounters": [
            {
                "counterSet": f"gpu-{i}",
                "counters": {
                    "memory": {"value": memory},
                    "slots": {"value": str(int(portion * SLOTS))},
                },
            }
        ],
    }


def slices(node: str, gpus: int) -> list[dict[str, Any]]:
    attrs = benchlib.gpu_attributes(node, gpus)
    counter_sets = [
        {
            "name": f"gpu-{i}",
            "counters": {
                "memory": {"value": quantity(gpu["gpuMemory"]["int"])},
                "slots": {"value": str(SLOTS)},
            },
        }
        for i, gpu in enumerate(attrs)
    ]
    devices = [
        _device(i, gpu, product, n)
        for i, gpu in enumerate(attrs)
        for product, portion in PRODUCTS.items()
        for n in range(int(1 / portion))
    ]
    return benchlib.pool_slices(node, counter_sets, devices, GPUS_PER_SLICE * DEVICES_PER_GPU)


def classes() -> list[dict[str, Any]]:
    return [
        benchlib.device_class(
            f"gpu-{product}" if mode == "time-slicing" else f"gpu-{product}-{mode}",
            f'attrs.fractionModel == "products" && attrs.product == "{product}"'
            f' && attrs.computeMode == "{mode}"',
        )
        for product in PRODUCTS
        for mode in MODES
    ]


def claim_spec(class_name: str) -> dict[str, Any]:
    benchlib.product_of(class_name)
    return benchlib.one_request({"deviceClassName": class_name})
