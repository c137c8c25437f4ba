"""Shared builder of the mode-per-GPU candidate layouts (``modes2``, ``modes4``).

Per GPU ``i``: a counter set ``gpu-<i>`` with one counter ``gpu: 1``, and shareable devices
(``allowMultipleAllocations: true``) that each consume the whole counter. The scheduler charges
a shareable device's counters once, at its first share, so two devices of one GPU exclude each
other while either holds a share, and each holds many shares.

- ``gpu-<i>-ts`` / ``gpu-<i>-sm``: capacity ``eighths`` = 8 (a card), request policy default 1,
  valid range 1 .. 8 in steps of 1 (``EIGHTHS_POLICY``). Integer units because a fractional
  range (``fraction`` = 1, step 125m) is rounded up to whole units by kube-scheduler 1.37.2:
  ``DRAFractionalCapacityRange`` has MinCompatibilityVersion 1.37, so it is off at the default
  compatibility version (a 250m request was allocated ``consumedCapacity: {fraction: "1"}``);
- with ``memory=True`` also ``gpu-<i>-ts-memory`` / ``gpu-<i>-sm-memory``: capacity ``memory``
  = the card in bytes, request policy as the capacity model's (min 1Gi, step 256Mi).

Classes: ``gpu-<product>[-sm-sharing]`` select the fraction device of the mode; a product class
name becomes ``capacity.requests.eighths`` = the product's portion x 8 (``claim_spec``).
``gpu-memory[-sm-sharing]`` select the memory devices (``memory=True``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # noqa: E402

MODES = {"time-slicing": "ts", "sm-sharing": "sm"}
UNITS = 8
EIGHTHS_POLICY = {"default": "1", "validRange": {"min": "1", "max": str(UNITS), "step": "1"}}
MIN_MIB, STEP_MIB = 1024, 256


def memory_capacity(card_bytes: int) -> dict[str, Any]:
    """Capacity ``memory`` of a card: the largest on-grid amount is the default and max."""
    card_mib = card_bytes // benchlib.MIB
    top = MIN_MIB + (card_mib - MIN_MIB) // STEP_MIB * STEP_MIB
    policy = {
        "default": f"{top}Mi",
        "validRange": {"min": f"{MIN_MIB}Mi", "step": f"{STEP_MIB}Mi", "max": f"{top}Mi"},
    }
    return {"memory": {"value": f"{card_mib}Mi", "requestPolicy": policy}}


def _device(name: str, attrs: dict[str, Any], i: int, capacity: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": attrs,
        "capacity": capacity,
        "allowMultipleAllocations": True,
        "consumesCounters": [{"counterSet": f"gpu-{i}", "counters": {"gpu": {"value": "1"}}}],
    }


def slices(node: str, gpus: int, memory: bool) -> list[dict[str, Any]]:
    counter_sets = [{"name": f"gpu-{i}", "counters": {"gpu": {"value": "1"}}} for i in range(gpus)]
    devices = []
    for i, base in enumerate(benchlib.gpu_attributes(node, gpus)):
        for mode, short in MODES.items():
            attrs = {**base, "computeMode": {"string": mode}}
            fraction = {"eighths": {"value": str(UNITS), "requestPolicy": EIGHTHS_POLICY}}
            devices.append(
                _device(
                    f"gpu-{i}-{short}",
                    {**attrs, "fractionModel": {"string": "fraction"}},
                    i,
                    fraction,
                )
            )
            if memory:
                card = memory_capacity(base["gpuMemory"]["int"])
                devices.append(
                    _device(
                        f"gpu-{i}-{short}-memory",
                        {**attrs, "fractionModel": {"string": "capacity"}},
                        i,
                        card,
                    )
                )
    return benchlib.pool_slices(node, counter_sets, devices)


def _class_name(stem: str, mode: str) -> str:
    return f"gpu-{stem}" if mode == "time-slicing" else f"gpu-{stem}-{mode}"


def classes(memory: bool) -> list[dict[str, Any]]:
    out = []
    for mode in MODES:
        sel = f'attrs.fractionModel == "fraction" && attrs.computeMode == "{mode}"'
        out += [benchlib.device_class(_class_name(p, mode), sel) for p in benchlib.PRODUCT_SIZES]
        if memory:
            sel = f'attrs.fractionModel == "capacity" && attrs.computeMode == "{mode}"'
            out.append(benchlib.device_class(_class_name("memory", mode), sel))
    return out


def claim_spec(class_name: str) -> dict[str, Any]:
    product, _ = benchlib.product_of(class_name)
    units = str(round(benchlib.PRODUCT_SIZES[product] * UNITS))
    return benchlib.one_request(
        {"deviceClassName": class_name, "capacity": {"requests": {"eighths": units}}}
    )
