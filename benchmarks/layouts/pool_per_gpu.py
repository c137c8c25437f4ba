"""Candidate layout, not what the driver publishes: the render-slices layout with one pool
per GPU instead of one per node.

Pool ``<node>-gpu-<i>`` holds GPU ``i``'s counter set (one slice) and its devices (a second
slice); devices, attributes, classes and the sizing policy are render-slices' own. The point:
the scheduler's counter accounting for a device's first share walks every device of its pool
(``checkAvailableCounters`` calling ``IsDeviceAllocated``, k8s.io/dynamic-resource-allocation
v0.37.2), so a pool of 2 devices costs less there than a node's pool of 16; the price is 8
pools and 16 slices per 8-GPU node.

Measured once, idle 2-core machine, 150 nodes, 600 ``gpu-quarter`` pods, alternating with
render-slices in one run (``bench_scheduler.py --nodes 150 --pods 600 --layout render-slices
--layout file:benchmarks/layouts/pool_per_gpu.py`` twice over): ratios to plain devices
0.57 and 0.66, render-slices 0.75 and 0.59. No gain beyond the run-to-run spread.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # noqa: E402

_DRIVER_LAYOUT = benchlib.RenderSlicesLayout(None)


def slices(node: str, gpus: int) -> list[dict[str, Any]]:
    rendered = _DRIVER_LAYOUT.slices(node, gpus)
    sets = {c["name"]: c for s in rendered for c in s["spec"].get("sharedCounters", [])}
    devices: dict[str, list[dict[str, Any]]] = {name: [] for name in sets}
    for s in rendered:
        for d in s["spec"].get("devices", []):
            devices[d["consumesCounters"][0]["counterSet"]].append(d)
    out = []
    for name, counter_set in sets.items():
        pool = {"name": f"{node}-{name}", "generation": 1, "resourceSliceCount": 2}
        parts = (("sharedCounters", [counter_set]), ("devices", devices[name]))
        out += [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-{name}-{n}"},
                "spec": {"driver": benchlib.DRIVER, "nodeName": node, "pool": pool, key: items},
            }
            for n, (key, items) in enumerate(parts)
        ]
    return out


def classes() -> list[dict[str, Any]]:
    return _DRIVER_LAYOUT.classes()


def policies() -> list[dict[str, Any]]:
    return _DRIVER_LAYOUT.policies()


def sized_slots(class_name: str) -> str | None:
    return _DRIVER_LAYOUT.sized_slots(class_name)


def claim_spec(class_name: str) -> dict[str, Any]:
    return _DRIVER_LAYOUT.claim_spec(class_name)
