"""A fraction is a boundary at Prepare: what an allocation or a claim's parameters may not get.

- caps: a ceiling above the request only where an admin allows it (class ``maxMemoryLimit*``,
  else the node's ``claimLimits``), a claim's own caps only lower them, the SM percentage
  within ``maxActiveThreadPercentage`` (a default above the cap is lowered to it);
- malformed allocations: a capacity the device does not publish, none of the one it does, one
  share ID twice in one claim;
- admin access: monitoring access, no memory, no MPS target, not counted on the GPU.
"""

from __future__ import annotations

import uuid
from fractions import Fraction
from typing import Any

import pytest

from dra_driver import DEFAULT_DRIVER_NAME as DRIVER
from dra_driver.config.caps import CapPolicy, memory_ceiling_cap
from dra_driver.config.load import parse_node_config
from dra_driver.config.params import ClaimLimits
from dra_driver.enforce.rules.targets import targets_for_claim
from dra_driver.gpus import MIB, SimulatedGpuSource
from dra_driver.model.devices import PublishedDevice, product_memory_bytes
from dra_driver.model.errors import PrepareError
from dra_driver.model.plans import ClaimPlan, ClaimRef
from dra_driver.prepare.overcommit import overcommit_error
from dra_driver.prepare.plan import NO_NODE_CAPS, plan_claim
from dra_driver.publish.offer import devices_by_name
from tests.support import claimfactory as cf

NODE = "node-a"
GIB = 1024 * MIB
CONFIG = {"apiVersion": "gpu-fraction.dra.dev/v1alpha1", "kind": "NodeConfig"}


@pytest.fixture(scope="module")
def devices() -> dict[str, PublishedDevice]:
    inventory = SimulatedGpuSource("simulated:H200x2", seed=NODE).discover()
    config = dict(CONFIG, gpus=[{"selector": {"index": 1}, "fractionModel": "capacity"}])
    return devices_by_name(inventory, parse_node_config(config))


def share(device: str, **capacity: str) -> dict[str, Any]:
    r = cf.result(device, NODE, share_id=str(uuid.uuid4()))
    r["consumedCapacity"] = capacity
    return r


def plan(
    devices: dict[str, PublishedDevice],
    results: list[dict[str, Any]],
    configs: list[dict[str, Any]] | None = None,
    policy: CapPolicy = NO_NODE_CAPS,
) -> ClaimPlan:
    claim = cf.claim(results, configs)
    ref = ClaimRef("team-a", claim["metadata"]["name"], claim["metadata"]["uid"])
    return plan_claim(ref, claim, DRIVER, NODE, devices, policy)


def eighth(devices: dict[str, PublishedDevice]) -> int:
    return product_memory_bytes(devices["gpu-0-time-slicing"].gpu, Fraction(1, 8))


# --- caps ---------------------------------------------------------------------------------------


def test_without_a_cap_the_ceiling_is_the_request(devices: dict[str, PublishedDevice]) -> None:
    """The review's attack: an eighth with memoryLimitPortion "1" got the whole card."""
    with pytest.raises(PrepareError, match="no burst without a cap set by an admin"):
        plan(devices, [share("gpu-0-time-slicing", slots="1")], [cf.opaque(memoryLimitPortion="1")])
    ok = plan(devices, [share("gpu-0-time-slicing", slots="1")])
    (d,) = ok.devices
    assert d.memory_limit_bytes == d.memory_request_bytes == eighth(devices)


def test_a_class_cap_allows_burst_up_to_it(devices: dict[str, PublishedDevice]) -> None:
    cls = cf.opaque("FromClass", maxMemoryLimitPortion="0.25")
    card = devices["gpu-0-time-slicing"].gpu.memory_bytes
    (d,) = plan(
        devices,
        [share("gpu-0-time-slicing", slots="1")],
        [cls, cf.opaque(memoryLimitPortion="0.25")],
    ).devices
    assert d.memory_limit_bytes == int(card / 4)
    with pytest.raises(PrepareError, match=r"maxMemoryLimitPortion 1/4 \(its DeviceClass\)"):
        plan(
            devices,
            [share("gpu-0-time-slicing", slots="1")],
            [cls, cf.opaque(memoryLimitPortion="0.5")],
        )


def test_a_claim_cannot_raise_its_class_cap(devices: dict[str, PublishedDevice]) -> None:
    configs = [
        cf.opaque("FromClass", maxMemoryLimit="20Gi"),
        cf.opaque(maxMemoryLimit="140Gi", memoryLimit="30Gi"),
    ]
    with pytest.raises(PrepareError, match="exceeds the cap 20Gi"):
        plan(devices, [share("gpu-0-time-slicing", slots="1")], configs)


def test_the_node_default_applies_where_the_class_sets_none(
    devices: dict[str, PublishedDevice],
) -> None:
    node = CapPolicy(ClaimLimits(max_memory_limit_bytes=40 * GIB))
    results = [share("gpu-1-time-slicing", memory="10Gi")]
    (d,) = plan(devices, results, [cf.opaque(memoryLimit="40Gi")], node).devices
    assert (d.memory_request_bytes, d.memory_limit_bytes) == (10 * GIB, 40 * GIB)
    with pytest.raises(PrepareError, match=r"maxMemoryLimit 40Gi \(node\)"):
        plan(devices, results, [cf.opaque(memoryLimit="41Gi")], node)
    # a class cap wins over the node's, also upwards
    cls = cf.opaque("FromClass", maxMemoryLimit="60Gi")
    (d,) = plan(devices, results, [cls, cf.opaque(memoryLimit="60Gi")], node).devices
    assert d.memory_limit_bytes == 60 * GIB


def test_a_cap_below_the_request_leaves_the_request() -> None:
    caps = ClaimLimits(max_memory_limit_bytes=GIB)
    assert memory_ceiling_cap(80 * GIB, 10 * GIB, caps, ClaimLimits(), ClaimLimits())[0] == (
        10 * GIB
    )


def test_thread_percentage_caps(devices: dict[str, PublishedDevice]) -> None:
    sm = [share("gpu-0-sm-sharing", slots="1")]
    cls = cf.opaque("FromClass", maxActiveThreadPercentage=25)
    with pytest.raises(PrepareError, match="activeThreadPercentage 100 exceeds the cap 25"):
        plan(devices, sm, [cls, cf.opaque(activeThreadPercentage=100)])
    # no value: the node's default (100) is lowered to the cap
    (d,) = plan(devices, [share("gpu-0-sm-sharing", slots="1")], [cls]).devices
    assert d.active_thread_percentage == 25
    # a default below the cap stays the default (None: the enforcer applies it)
    policy = CapPolicy(default_threads=20)
    (d,) = plan(devices, [share("gpu-0-sm-sharing", slots="1")], [cls], policy).devices
    assert d.active_thread_percentage is None
    # the node's cap where the class sets none
    policy = CapPolicy(ClaimLimits(max_active_thread_percentage=50))
    with pytest.raises(PrepareError, match="exceeds the cap 50"):
        plan(devices, sm, [cf.opaque(activeThreadPercentage=60)], policy)
    # time-slicing GPUs take no SM ceiling, capped or not
    (d,) = plan(devices, [share("gpu-0-time-slicing", slots="1")], [cls]).devices
    assert d.active_thread_percentage is None


# --- malformed allocations ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "consumed", "message"),
    [
        (
            "gpu-0-time-slicing",
            {"memory": "4Gi"},
            "no capacity 'memory'; its only capacity is 'slots'",
        ),
        (
            "gpu-1-time-slicing",
            {"slots": "2"},
            "no capacity 'slots'; its only capacity is 'memory'",
        ),
        ("gpu-0-time-slicing", {}, "missing 'slots'"),
        ("gpu-1-sm-sharing", {}, "missing 'memory'"),
    ],
)
def test_a_capacity_the_device_does_not_publish_is_refused(
    devices: dict[str, PublishedDevice], device: str, consumed: dict[str, str], message: str
) -> None:
    """Both were prepared as the whole card."""
    with pytest.raises(PrepareError, match=message):
        plan(devices, [share(device, **consumed)])


def test_one_share_id_twice_in_a_claim_is_refused(devices: dict[str, PublishedDevice]) -> None:
    """It was prepared as one 1-slot share, the 8-slot result silently dropped."""
    a = share("gpu-0-time-slicing", slots="1")
    b = dict(share("gpu-0-time-slicing", slots="8"), shareID=a["shareID"], request="other")
    with pytest.raises(PrepareError, match="both share .* of device gpu-0-time-slicing"):
        plan(devices, [a, b])


# --- admin access -------------------------------------------------------------------------------


def test_admin_access_is_monitoring_access(devices: dict[str, PublishedDevice]) -> None:
    admin = dict(share("gpu-0-time-slicing", slots="1"), adminAccess=True)
    got = plan(devices, [admin])
    (d,) = got.devices
    assert d.admin_access and d.memory_request_bytes == d.memory_limit_bytes == 0
    assert targets_for_claim(got, {d.gpu.uuid: "hard"}) == ()
    # a whole card of ordinary shares still fits next to it: it is not counted
    full = plan(devices, [share("gpu-0-time-slicing", slots="8")])
    assert overcommit_error(full, [got]) is None
    assert overcommit_error(got, [full]) is None


def test_admin_access_must_be_a_boolean(devices: dict[str, PublishedDevice]) -> None:
    bad = dict(share("gpu-0-time-slicing", slots="1"), adminAccess="yes")
    with pytest.raises(PrepareError, match="adminAccess: expected a boolean"):
        plan(devices, [bad])
