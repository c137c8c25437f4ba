"""Taints in the published ResourceSlices: every device of an unhealthy GPU carries its GPU's
taint, other devices carry none, and the bodies stay valid resource.k8s.io/v1 objects."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.config.node import GpuConfig, NodeConfig
from dra_driver.gpus import Inventory, SimulatedGpuSource
from dra_driver.publish.devicetaints import GPU_LOST, MPS_CHECK_FAILED, DeviceTaint, taint_key
from dra_driver.publish.slices import MAX_DEVICES_PER_SLICE_ADVANCED, build_slices, slice_devices
from tests.support import k8sschema

DRIVER = DEFAULT_DRIVER_NAME
NODE = "node-a"
KEY = taint_key(DRIVER)
LOST = DeviceTaint(KEY, GPU_LOST, "2026-03-01T12:00:00Z")
FAILED = DeviceTaint(KEY, MPS_CHECK_FAILED, "2026-03-01T12:00:05Z")
PRODUCTS_ER = NodeConfig(extended_resources=True)
"""Products model with extended-resource devices: many devices per GPU."""


def inventory(spec: str = "simulated:H200x8") -> Inventory:
    return SimulatedGpuSource(spec, seed=NODE).discover()


def by_gpu(slices: list[dict[str, Any]]) -> dict[int, list[Any]]:
    """GPU index -> the ``taints`` of each of its devices (None: no field)."""
    out: dict[int, list[Any]] = {}
    for d in slice_devices(slices):
        out.setdefault(d["attributes"]["index"]["int"], []).append(d.get("taints"))
    return out


@pytest.mark.parametrize(
    "config", [NodeConfig(), PRODUCTS_ER, NodeConfig(defaults=GpuConfig(fraction_model="capacity"))]
)
def test_devices_of_unhealthy_gpus_carry_the_taint(config: NodeConfig) -> None:
    inv = inventory()
    taints = {inv.gpus[1].uuid: LOST, inv.gpus[6].uuid: FAILED}
    slices = build_slices(inv, config, DRIVER, NODE, taints=taints)
    for s in slices:
        k8sschema.validate(s)
    got = by_gpu(slices)
    assert set(got) == set(range(8))
    assert all(t == [LOST.body()] for t in got[1])
    assert all(t == [FAILED.body()] for t in got[6])
    assert all(t is None for i in set(range(8)) - {1, 6} for t in got[i])
    assert got[1][0] == [
        {
            "key": "gpu-fraction.dra.dev/gpu-unhealthy",
            "value": "gpu-lost",
            "effect": "NoSchedule",
            "timeAdded": "2026-03-01T12:00:00Z",
        }
    ]


def test_no_taints_renders_the_same_slices_as_before() -> None:
    inv = inventory()
    plain = build_slices(inv, PRODUCTS_ER, DRIVER, NODE)
    assert build_slices(inv, PRODUCTS_ER, DRIVER, NODE, taints={}) == plain
    unknown = {"GPU-not-on-this-node": LOST}
    assert build_slices(inv, PRODUCTS_ER, DRIVER, NODE, taints=unknown) == plain
    assert all("taints" not in d for d in slice_devices(plain))


def test_taints_do_not_change_the_layout() -> None:
    inv = inventory("simulated:H200x8,L4x8")
    plain = build_slices(inv, PRODUCTS_ER, DRIVER, NODE)
    tainted = build_slices(inv, PRODUCTS_ER, DRIVER, NODE, taints={g.uuid: LOST for g in inv.gpus})
    assert [s["metadata"]["name"] for s in tainted] == [s["metadata"]["name"] for s in plain]
    for s in tainted:
        assert len(s["spec"].get("devices", [])) <= MAX_DEVICES_PER_SLICE_ADVANCED
        k8sschema.validate(s)
    assert all(d["taints"] == [LOST.body()] for d in slice_devices(tainted))


def test_the_schema_check_sees_a_broken_taint() -> None:
    """The validator used above does check taints: an unknown effect field is refused."""
    inv = inventory("simulated:H200x1")
    good = build_slices(inv, NodeConfig(), DRIVER, NODE, taints={inv.gpus[0].uuid: LOST})
    device_slice = next(s for s in good if "devices" in s["spec"])
    broken = copy.deepcopy(device_slice)
    broken["spec"]["devices"][0]["taints"][0]["since"] = "yesterday"
    with pytest.raises(kubernetes_validate.ValidationError):
        k8sschema.validate(broken)
    missing_key = copy.deepcopy(device_slice)
    del missing_key["spec"]["devices"][0]["taints"][0]["key"]
    with pytest.raises(kubernetes_validate.ValidationError):
        k8sschema.validate(missing_key)
