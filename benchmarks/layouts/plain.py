"""Baseline layout: one plain device per GPU (``gpu-<i>``), no counters, no capacity, no
sharing; attributes as render-slices gives the GPU's whole-card device, with
``fractionModel: plain``. Every product class name asks one whole device of class
``gpu-plain``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # noqa: E402

CLASS = "gpu-plain"


def slices(node: str, gpus: int) -> list[dict[str, Any]]:
    devices = [
        {"name": f"gpu-{i}", "attributes": {**attrs, "fractionModel": {"string": "plain"}}}
        for i, attrs in enumerate(benchlib.gpu_attributes(node, gpus))
    ]
    return benchlib.pool_slices(node, [], devices)


def classes() -> list[dict[str, Any]]:
    return [benchlib.device_class(CLASS, 'attrs.fractionModel == "plain"')]


def claim_spec(class_name: str) -> dict[str, Any]:
    benchlib.product_of(class_name)
    return benchlib.one_request({"deviceClassName": CLASS})
