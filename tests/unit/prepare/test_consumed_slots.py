"""Consumed slots outside the device's offered sizes are refused, not planned."""

from __future__ import annotations

import uuid

import pytest

from dra_driver import DEFAULT_DRIVER_NAME as DRIVER
from dra_driver.config.load import parse_node_config
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.model.errors import PrepareError
from dra_driver.model.plans import ClaimRef
from dra_driver.prepare.plan import plan_claim
from dra_driver.publish.offer import devices_by_name
from tests.support import claimfactory as cf

CONFIG = {
    "apiVersion": "gpu-fraction.dra.dev/v1alpha1",
    "kind": "NodeConfig",
    "extendedResources": True,
}


@pytest.mark.parametrize(
    ("device", "slots"),
    [("gpu-0-time-slicing-eighth", "8"), ("gpu-0-time-slicing", "3")],
)
def test_slots_that_are_no_offered_size_are_refused(device: str, slots: str) -> None:
    inventory = SimulatedGpuSource("simulated:H200x1", seed="node-a").discover()
    devices = devices_by_name(inventory, parse_node_config(CONFIG))
    assert slots not in {str(s) for s in devices[device].sizes}  # (1,) and (1, 2, 4, 8)
    claim = cf.claim([cf.result(device, "node-a", share_id=str(uuid.uuid4()), slots=slots)])
    ref = ClaimRef("default", claim["metadata"]["name"], claim["metadata"]["uid"])
    with pytest.raises(PrepareError):
        plan_claim(ref, claim, DRIVER, "node-a", devices)


@pytest.mark.parametrize("slots", ["0.5", "-2", "0", "2Gi ", "1e100000"])
def test_slots_that_are_no_whole_positive_amount_are_refused_as_slots(slots: str) -> None:
    """The message speaks of slots (it said 'a whole number of bytes' for "0.5")."""
    inventory = SimulatedGpuSource("simulated:H200x1", seed="node-a").discover()
    devices = devices_by_name(inventory, parse_node_config(CONFIG))
    claim = cf.claim(
        [cf.result("gpu-0-time-slicing", "node-a", share_id=str(uuid.uuid4()), slots=slots)]
    )
    ref = ClaimRef("default", claim["metadata"]["name"], claim["metadata"]["uid"])
    with pytest.raises(PrepareError, match="slots") as caught:
        plan_claim(ref, claim, DRIVER, "node-a", devices)
    assert "bytes" not in str(caught.value)
