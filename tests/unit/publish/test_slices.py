"""ResourceSlice planning and bodies: layout, limits, attributes, and the safety of the published
model (a GPU serves one device at a time; no device holds more than its GPU)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.app.readcmds import render_slices_json
from dra_driver.config.load import parse_node_config
from dra_driver.config.node import (
    CapacityPolicy,
    GpuConfig,
    GpuOverride,
    GpuSelector,
    NodeConfig,
    Product,
    slots_for,
)
from dra_driver.gpus import MIB, Gpu, Inventory, SimulatedGpuSource, SkippedGpu
from dra_driver.gpus.simulated import PROFILES
from dra_driver.model.devices import PublishedDevice
from dra_driver.model.quantities import quantity_value
from dra_driver.publish.offer import capacity_request_policy, devices_by_name, offered_devices
from dra_driver.publish.slices import (
    PCI_BUS_ID_ATTRIBUTE,
    build_slices,
    semver,
    slice_devices,
    slice_name,
)
from tests.support import k8sschema

DRIVER = DEFAULT_DRIVER_NAME
NODE = "node-a"
GIB = 1024 * MIB
H200_MIB = PROFILES["H200"].memory_mib - PROFILES["H200"].reserved_mib
"""What a simulated H200 offers: the card minus driver-reserved memory
(tests/unit/gpus/test_gpu_memory.py)."""
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SEMVER = re.compile(
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$"
)


def inventory(spec: str, node: str = NODE) -> Inventory:
    return SimulatedGpuSource(spec, seed=node).discover()


def validate(obj: Mapping[str, Any]) -> None:
    k8sschema.validate(obj)


def qty(text: str) -> int:
    value = quantity_value(text)
    assert value.denominator == 1
    return int(value)


# --- invariants checked on every generated node ------------------------------------------


def check_attribute_names(device: Mapping[str, Any]) -> None:
    for name in list(device.get("attributes", {})) + list(device.get("capacity", {})):
        domain, _, ident = name.rpartition("/")
        assert C_IDENTIFIER.match(ident) and len(ident) <= 32, name
        assert not domain or (DNS_SUBDOMAIN.match(domain) and len(domain) <= 63), name


def check_memory_policy(capacity: Mapping[str, Any]) -> None:
    """A capacity-model ``memory`` capacity: an on-grid default and max within the card."""
    policy = capacity["requestPolicy"]
    value = qty(capacity["value"])
    lo, step = qty(policy["validRange"]["min"]), qty(policy["validRange"]["step"])
    hi, default = qty(policy["validRange"]["max"]), qty(policy["default"])
    assert lo + step <= value and lo <= default <= hi <= value
    assert (default - lo) % step == 0 and (hi - lo) % step == 0
    assert hi + step > value  # max is the largest on-grid amount


def check_slots_policy(capacity: Mapping[str, Any]) -> None:
    """A products-model ``slots`` capacity: whole sizes, ascending, at most 10 (the API's
    ``CapacityRequestPolicy.validValues`` limit), the default among them, none above the GPU."""
    policy = capacity["requestPolicy"]
    assert set(policy) == {"default", "validValues"}
    sizes = [qty(v) for v in policy["validValues"]]  # qty: whole slots only
    assert 1 <= len(sizes) <= 10
    assert sizes == sorted(set(sizes))  # strictly ascending
    assert qty(policy["default"]) in sizes
    assert sizes[0] > 0 and sizes[-1] <= qty(capacity["value"])


def check_limits(slices: Sequence[Mapping[str, Any]], node: str, driver: str) -> None:
    """Structural rules of resource.k8s.io/v1 that the OpenAPI schema does not check."""
    if not slices:
        return
    pools = {(s["spec"]["pool"]["name"], s["spec"]["pool"]["generation"]) for s in slices}
    assert pools == {(node, 1)}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    names = [s["metadata"]["name"] for s in slices]
    assert len(set(names)) == len(names)
    counter_sets: dict[str, dict[str, int]] = {}
    device_names: set[str] = set()
    for s in slices:
        spec = s["spec"]
        assert len(s["metadata"]["name"]) <= 253 and DNS_SUBDOMAIN.match(s["metadata"]["name"])
        assert spec["nodeName"] == node and spec["driver"] == driver
        assert ("devices" in spec) != ("sharedCounters" in spec)  # never both (k8s >= 1.35)
        assert len(spec.get("sharedCounters", [])) <= 8
        for cs in spec.get("sharedCounters", []):
            assert DNS_LABEL.match(cs["name"]) and cs["name"] not in counter_sets
            assert 0 < len(cs["counters"]) <= 32
            assert all(DNS_LABEL.match(c) for c in cs["counters"])
            counter_sets[cs["name"]] = {k: qty(v["value"]) for k, v in cs["counters"].items()}
        devices = spec.get("devices", [])
        assert len(devices) <= 64  # they consume counters and allow multiple allocations
        for d in devices:
            assert DNS_LABEL.match(d["name"]) and len(d["name"]) <= 63
            assert d["name"] not in device_names
            device_names.add(d["name"])
            assert len(d.get("attributes", {})) + len(d.get("capacity", {})) <= 32
            check_attribute_names(d)
            for value in d["attributes"].values():
                assert len(value) == 1
                if "string" in value:
                    assert len(value["string"]) <= 64
                if "version" in value:
                    assert SEMVER.match(value["version"]) and len(value["version"]) <= 64
            assert 1 <= len(d["consumesCounters"]) <= 2
            assert d["allowMultipleAllocations"] is True
            [(name, capacity)] = d["capacity"].items()
            assert name in ("memory", "slots"), name
            (check_memory_policy if name == "memory" else check_slots_policy)(capacity)
    # every consumption refers to a counter set of the pool and to its counters
    for d in slice_devices(slices):
        for c in d["consumesCounters"]:
            assert c["counterSet"] in counter_sets
            assert set(c["counters"]) <= set(counter_sets[c["counterSet"]])


def check_one_device_per_gpu_at_a_time(slices: Sequence[Mapping[str, Any]]) -> None:
    """No GPU serves two devices at once, and no device holds more than its GPU.

    Every counter set is ``{gpu: 1}``, belongs to one GPU (``gpu-<index>``) and every device of
    that GPU consumes all of it, once: the scheduler charges a device that allows multiple
    allocations at its first share (``allocator_incubating.go``), so while one device of a GPU
    has shares no other device of the GPU can be allocated. Within one device the scheduler
    keeps the shares' sum within the capacity, which is the whole GPU (``memory``: the card's
    bytes; ``slots``: ``slotsPerGpu``, the same on every products device of the pool).
    """
    counters = {
        cs["name"]: cs["counters"] for s in slices for cs in s["spec"].get("sharedCounters", [])
    }
    assert all(c == {"gpu": {"value": "1"}} for c in counters.values())
    gpu_of_set: dict[str, str] = {}
    set_of_gpu: dict[str, str] = {}
    slots: set[int] = set()
    for d in slice_devices(slices):
        attrs = d["attributes"]
        [consumption] = d["consumesCounters"]
        assert consumption == {
            "counterSet": f"gpu-{attrs['index']['int']}",
            "counters": {"gpu": {"value": "1"}},
        }
        uuid = attrs["uuid"]["string"]
        assert gpu_of_set.setdefault(consumption["counterSet"], uuid) == uuid
        assert set_of_gpu.setdefault(uuid, consumption["counterSet"]) == consumption["counterSet"]
        if "memory" in d["capacity"]:
            assert qty(d["capacity"]["memory"]["value"]) == attrs["gpuMemory"]["int"]
        else:
            slots.add(qty(d["capacity"]["slots"]["value"]))
    assert set(gpu_of_set) == set(counters)  # no counter set without devices
    assert len(slots) <= 1


def check_device_shapes(slices: Sequence[Mapping[str, Any]]) -> None:
    """Names and attributes of the three kinds of device, and their order on a GPU.

    Per GPU and compute mode there is one shared device ``gpu-<i>-<mode>`` (capacity model:
    ``memory``; products model: ``slots`` with ``product: "*"`` and no ``portion``), and,
    products model only, extended-resource devices ``gpu-<i>-<mode>-<product>`` listed before
    it, each offering just its product's size (``portion`` x slots) as default and only value.
    """
    shared: dict[tuple[int, str], int] = {}
    extended: dict[tuple[int, str], list[int]] = {}
    for n, d in enumerate(slice_devices(slices)):
        attrs = d["attributes"]
        key = (attrs["index"]["int"], attrs["computeMode"]["string"])
        assert key[1] in ("time-slicing", "sm-sharing")
        base = f"gpu-{key[0]}-{key[1]}"
        model = attrs["fractionModel"]["string"]
        if model == "capacity":
            assert "product" not in attrs and "portion" not in attrs
        elif attrs["product"]["string"] != "*":
            product, portion = attrs["product"]["string"], Fraction(attrs["portion"]["string"])
            assert d["name"] == f"{base}-{product}"
            policy = d["capacity"]["slots"]["requestPolicy"]
            size = portion * qty(d["capacity"]["slots"]["value"])
            assert policy == {"default": str(size), "validValues": [str(size)]}
            extended.setdefault(key, []).append(n)
            continue
        else:  # the shared device of every product; a claim without slots takes the least,
            # or with extended-resource devices (listed before it) the most, which a shared
            # device holding shares never fits (offer.shared_default_size)
            assert model == "products" and "portion" not in attrs
            policy = d["capacity"]["slots"]["requestPolicy"]
            end = -1 if key in extended else 0
            assert policy["default"] == policy["validValues"][end]
        assert d["name"] == base and key not in shared
        shared[key] = n
    for key, positions in extended.items():
        assert max(positions) < shared[key]  # an ER device comes before its mode's device


def check_all(slices: Sequence[Mapping[str, Any]], node: str = NODE, driver: str = DRIVER) -> None:
    check_limits(slices, node, driver)
    check_one_device_per_gpu_at_a_time(slices)
    check_device_shapes(slices)
    for s in slices:
        validate(s)


def device_slices(slices: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    return [s["spec"]["devices"] for s in slices if "devices" in s["spec"]]


def attributes(gpu: Gpu, enforcement: str, mode: str) -> dict[str, Any]:
    """Every attribute a device of a simulated H200 ``gpu`` carries, product ones aside."""
    return {
        "uuid": {"string": gpu.uuid},
        "index": {"int": gpu.index},
        "minor": {"int": gpu.minor},
        "productName": {"string": "NVIDIA H200"},
        "architecture": {"string": "hopper"},
        "computeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "615.71.9"},
        "driverVersionString": {"string": "615.71.09"},
        "cudaDriverVersion": {"version": "13.4.0"},
        "gpuMemory": {"int": H200_MIB * MIB},
        "smCount": {"int": 132},
        "computeMode": {"string": mode},
        "fractionModel": {"string": "products"},
        "memoryEnforcement": {"string": enforcement},
    }


GPU_COUNTER = [{"counterSet": "gpu-0", "counters": {"gpu": {"value": "1"}}}]
"""What every device of GPU 0 consumes: its GPU's one counter, in full."""

DEFAULT_SLOTS = {
    "slots": {"value": "8", "requestPolicy": {"default": "1", "validValues": ["1", "2", "4", "8"]}}
}
"""The shared device's capacity for the default products: eighth, quarter, half, full of 8; a
claim that names no size (one that escaped the sizing policy) gets the least: an eighth."""

MODES = ("time-slicing", "sm-sharing")

TEN_PRODUCTS = tuple(Product(f"p{n}", Fraction(n, 16)) for n in (1, 2, 3, 4, 5, 6, 8, 10, 12, 16))
"""The most products one list may hold (``MAX_PRODUCTS``): 10 sizes of 16 slots."""


# --- fixed scenarios -----------------------------------------------------------------------


def test_default_h200x8_layout() -> None:
    slices = build_slices(inventory("simulated:H200x8"), NodeConfig(), DRIVER, NODE)
    check_all(slices)
    assert [s["metadata"]["name"] for s in slices] == [
        "node-a-gpu-fraction-dra-dev-0",
        "node-a-gpu-fraction-dra-dev-1",
    ]
    assert [len(s["spec"].get("sharedCounters", [])) for s in slices] == [8, 0]
    assert [len(s["spec"].get("devices", [])) for s in slices] == [0, 16]
    assert all(s["spec"]["pool"]["resourceSliceCount"] == 2 for s in slices)
    assert all(s["metadata"]["labels"] == {"app.kubernetes.io/managed-by": DRIVER} for s in slices)
    assert slices[0]["spec"]["sharedCounters"] == [
        {"name": f"gpu-{i}", "counters": {"gpu": {"value": "1"}}} for i in range(8)
    ]
    devices = slice_devices(slices)
    # compute mode auto: one shared device per mode and GPU, nothing per product
    assert [d["name"] for d in devices] == [f"gpu-{i}-{m}" for i in range(8) for m in MODES]
    for d in devices:
        assert d["capacity"] == DEFAULT_SLOTS
        assert d["attributes"]["product"] == {"string": "*"}
        assert d["consumesCounters"] == [
            {
                "counterSet": f"gpu-{d['attributes']['index']['int']}",
                "counters": {"gpu": {"value": "1"}},
            }
        ]


def test_sixteen_gpus_need_two_counter_slices() -> None:
    slices = build_slices(inventory("simulated:L4x16"), NodeConfig(), DRIVER, NODE)
    check_all(slices)
    assert [len(s["spec"].get("sharedCounters", [])) for s in slices] == [8, 8, 0]
    assert [len(s["spec"].get("devices", [])) for s in slices] == [0, 0, 32]


@pytest.mark.parametrize(
    ("spec", "products", "counters", "devices"),
    [
        # 10 products: 2 modes x (10 + 1) = 22 devices per GPU; a third GPU would make 66
        ("simulated:H200x8", TEN_PRODUCTS, [8, 0, 0, 0, 0], [0, 44, 44, 44, 44]),
        # 7 products: 2 x 8 = 16 per GPU, four GPUs fill a slice exactly
        ("simulated:H200x8", TEN_PRODUCTS[:7], [8, 0, 0], [0, 64, 64]),
        ("simulated:L4x16", TEN_PRODUCTS, [8, 8] + [0] * 8, [0, 0] + [44] * 8),
    ],
)
def test_extended_resource_devices_keep_within_64_per_slice_and_gpus_whole(
    spec: str, products: tuple[Product, ...], counters: list[int], devices: list[int]
) -> None:
    config = NodeConfig(defaults=GpuConfig(products=products), extended_resources=True)
    slices = build_slices(inventory(spec), config, DRIVER, NODE)
    check_all(slices)
    assert [len(s["spec"].get("sharedCounters", [])) for s in slices] == counters
    assert [len(s["spec"].get("devices", [])) for s in slices] == devices
    assert all(s["spec"]["pool"]["resourceSliceCount"] == len(devices) for s in slices)
    gpus_per_slice = [{d["attributes"]["index"]["int"] for d in ds} for ds in device_slices(slices)]
    every = [i for gpus in gpus_per_slice for i in gpus]
    assert len(every) == len(set(every)) == len(inventory(spec).gpus)  # no GPU split


def test_product_device_body() -> None:
    [gpu] = inventory("simulated:H200x1").gpus
    slices = build_slices(
        inventory("simulated:H200x1"), NodeConfig(), DRIVER, NODE, enforcement={gpu.uuid: "hard"}
    )
    devices = {d["name"]: d for d in slice_devices(slices)}
    assert list(devices) == ["gpu-0-time-slicing", "gpu-0-sm-sharing"]
    for mode in MODES:
        assert devices[f"gpu-0-{mode}"] == {
            "name": f"gpu-0-{mode}",
            "attributes": {
                **attributes(gpu, "hard", mode),
                "product": {"string": "*"},  # every product: the claim's slots say which
                PCI_BUS_ID_ATTRIBUTE: {"string": "0000:18:00.0"},
            },
            "allowMultipleAllocations": True,
            "capacity": DEFAULT_SLOTS,
            "consumesCounters": GPU_COUNTER,
        }


def test_extended_resource_devices_come_before_the_shared_device() -> None:
    [gpu] = inventory("simulated:H200x1").gpus
    config = NodeConfig(extended_resources=True)
    slices = build_slices(inventory("simulated:H200x1"), config, DRIVER, NODE)
    check_all(slices)
    devices = {d["name"]: d for d in slice_devices(slices)}
    products = ["eighth", "quarter", "half", "full"]
    assert list(devices) == [
        name for m in MODES for name in [f"gpu-0-{m}-{p}" for p in products] + [f"gpu-0-{m}"]
    ]
    assert devices["gpu-0-sm-sharing-quarter"] == {
        "name": "gpu-0-sm-sharing-quarter",
        "attributes": {
            **attributes(gpu, "none", "sm-sharing"),
            "product": {"string": "quarter"},
            "portion": {"string": "1/4"},
            PCI_BUS_ID_ATTRIBUTE: {"string": "0000:18:00.0"},
        },
        "allowMultipleAllocations": True,
        # an extended-resource claim takes the default: the product's 2 of 8 slots
        "capacity": {
            "slots": {"value": "8", "requestPolicy": {"default": "2", "validValues": ["2"]}}
        },
        "consumesCounters": GPU_COUNTER,
    }
    # with extended-resource devices the shared device's default is the largest size: the
    # scheduler's extended-resource claims take the first device that fits, and a shared
    # device holding shares never fits the whole card
    largest = {"default": "8", "validValues": ["1", "2", "4", "8"]}
    assert devices["gpu-0-sm-sharing"]["capacity"] == {
        "slots": {"value": "8", "requestPolicy": largest}
    }
    assert devices["gpu-0-sm-sharing"]["attributes"]["product"] == {"string": "*"}


@pytest.mark.parametrize("mode", MODES)
def test_pinned_compute_mode_gives_one_device_per_gpu(mode: str) -> None:
    config = NodeConfig(defaults=GpuConfig(compute_mode=mode))
    slices = build_slices(inventory("simulated:H200x2"), config, DRIVER, NODE)
    check_all(slices)
    devices = slice_devices(slices)
    assert [d["name"] for d in devices] == [f"gpu-0-{mode}", f"gpu-1-{mode}"]
    assert {d["attributes"]["computeMode"]["string"] for d in devices} == {mode}


def test_auto_and_pinned_gpus_on_one_node() -> None:
    config = NodeConfig(gpus=(GpuOverride(GpuSelector(index=1), compute_mode="sm-sharing"),))
    assert config.defaults.compute_mode == "auto"
    slices = build_slices(inventory("simulated:H200x2"), config, DRIVER, NODE)
    check_all(slices)
    assert [d["name"] for d in slice_devices(slices)] == [
        "gpu-0-time-slicing",
        "gpu-0-sm-sharing",
        "gpu-1-sm-sharing",
    ]


def test_slots_per_gpu_sizes_every_product() -> None:
    config = NodeConfig(slots_per_gpu=24, extended_resources=True)
    slices = build_slices(inventory("simulated:H200x1"), config, DRIVER, NODE)
    check_all(slices)
    devices = {d["name"]: d for d in slice_devices(slices)}
    assert devices["gpu-0-time-slicing"]["capacity"] == {
        "slots": {
            "value": "24",
            "requestPolicy": {"default": "24", "validValues": ["3", "6", "12", "24"]},
        }
    }
    assert devices["gpu-0-time-slicing-half"]["capacity"] == {
        "slots": {"value": "24", "requestPolicy": {"default": "12", "validValues": ["12"]}}
    }


def test_capacity_device_body() -> None:
    config = NodeConfig(
        gpus=(
            GpuOverride(GpuSelector(index=0), fraction_model="capacity", compute_mode="sm-sharing"),
        )
    )
    slices = build_slices(inventory("simulated:H200x1,L4x1"), config, DRIVER, NODE)
    check_all(slices)
    devices = {d["name"]: d for d in slice_devices(slices)}
    # GPU 0 pinned to sm-sharing: one device; the L4 (index 1) stays on products, mode auto
    assert list(devices) == ["gpu-0-sm-sharing", "gpu-1-time-slicing", "gpu-1-sm-sharing"]
    capacity = devices["gpu-0-sm-sharing"]
    assert capacity["allowMultipleAllocations"] is True
    assert capacity["consumesCounters"] == GPU_COUNTER
    top = 1024 + (H200_MIB - 1024) // 256 * 256  # 1Gi + n * 256Mi within the card (MiB)
    assert capacity["capacity"] == {
        "memory": {
            "value": f"{H200_MIB}Mi",
            "requestPolicy": {
                "default": "1Gi",  # default: the minimum, never the card
                "validRange": {"min": "1Gi", "step": "256Mi", "max": f"{top}Mi"},
            },
        }
    }
    assert capacity["attributes"]["fractionModel"] == {"string": "capacity"}
    assert capacity["attributes"]["computeMode"] == {"string": "sm-sharing"}
    assert "product" not in capacity["attributes"] and "portion" not in capacity["attributes"]
    assert [cs["name"] for s in slices for cs in s["spec"].get("sharedCounters", [])] == [
        "gpu-0",
        "gpu-1",
    ]


def test_capacity_model_in_auto_mode_has_a_memory_device_per_mode() -> None:
    config = NodeConfig(defaults=GpuConfig(fraction_model="capacity"), extended_resources=True)
    slices = build_slices(inventory("simulated:H200x1"), config, DRIVER, NODE)
    check_all(slices)
    devices = {d["name"]: d for d in slice_devices(slices)}
    assert list(devices) == ["gpu-0-time-slicing", "gpu-0-sm-sharing"]  # no ER devices
    ts, sm = devices["gpu-0-time-slicing"], devices["gpu-0-sm-sharing"]
    assert ts["capacity"] == sm["capacity"] and list(ts["capacity"]) == ["memory"]
    assert ts["consumesCounters"] == sm["consumesCounters"] == GPU_COUNTER


@pytest.mark.parametrize(
    ("default", "expected"),
    [(None, 1024), (GIB, 1024), (1500 * MIB, 1536), (100 * GIB, 7936), (1025 * MIB, 1280)],
)
def test_capacity_default_rounds_up_to_grid(default: int | None, expected: int) -> None:
    policy = capacity_request_policy(8000 * MIB, CapacityPolicy(GIB, 256 * MIB, default))
    assert policy is not None
    assert qty(policy["default"]) == expected * MIB


def test_capacity_gpu_too_small_is_excluded() -> None:
    config = NodeConfig(
        gpus=(
            GpuOverride(
                GpuSelector(index=0),
                fraction_model="capacity",
                capacity={"minimum": 20 * GIB, "step": 4 * GIB},
            ),
        )
    )
    with capture_logs() as logs:
        slices = build_slices(inventory("simulated:L4x1", node="tiny"), config, DRIVER, "tiny")
    assert slices == []
    assert any("capacity.minimum" in str(e.get("reason")) for e in logs)


def test_mig_gpu_not_offered_and_warned() -> None:
    inv = inventory("simulated:A100-80GB-MIGx1,A100-80GBx1", node="mig-node")
    with capture_logs() as logs:
        slices = build_slices(inv, NodeConfig(), DRIVER, "mig-node")
    check_all(slices, node="mig-node")
    assert {d["attributes"]["index"]["int"] for d in slice_devices(slices)} == {1}
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1
    assert warnings[0]["gpu"] == 0 and warnings[0]["uuid"] == inv.gpus[0].uuid
    assert "MIG" in warnings[0]["reason"]
    # the same exclusions again: not repeated
    with capture_logs() as logs:
        build_slices(inv, NodeConfig(), DRIVER, "mig-node")
    assert [e for e in logs if e["log_level"] == "warning"] == []


def test_skipped_gpu_warns_without_crash() -> None:
    inv = inventory("simulated:H200x2", node="lossy")
    inv = Inventory(gpus=inv.gpus[1:], skipped=(SkippedGpu(0, "NVML_ERROR_GPU_IS_LOST"),))
    with capture_logs() as logs:
        slices = build_slices(inv, NodeConfig(), DRIVER, "lossy")
    check_all(slices, node="lossy")
    assert {d["attributes"]["index"]["int"] for d in slice_devices(slices)} == {1}
    assert any(e.get("reason") == "NVML_ERROR_GPU_IS_LOST" for e in logs)


def test_disabled_gpu_and_empty_node() -> None:
    config = NodeConfig(gpus=(GpuOverride(GpuSelector(product="NVIDIA L4"), enabled=False),))
    assert build_slices(inventory("simulated:L4x2", node="n2"), config, DRIVER, "n2") == []
    assert build_slices(Inventory(gpus=()), NodeConfig(), DRIVER, NODE) == []


def test_enforcement_levels() -> None:
    inv = inventory("simulated:L4x2")
    slices = build_slices(
        inv, NodeConfig(), DRIVER, NODE, enforcement={inv.gpus[1].uuid: "cooperative"}
    )
    levels = {
        d["attributes"]["index"]["int"]: d["attributes"]["memoryEnforcement"]["string"]
        for d in slice_devices(slices)
    }
    assert levels == {0: "none", 1: "cooperative"}
    with pytest.raises(ValueError, match="enforcement"):
        build_slices(inv, NodeConfig(), DRIVER, NODE, enforcement={inv.gpus[0].uuid: "strict"})


def test_generation_and_owner() -> None:
    slices = build_slices(
        inventory("simulated:L4x1"), NodeConfig(), DRIVER, NODE, generation=7, node_uid="u-1"
    )
    check_limits(
        [
            {**s, "spec": {**s["spec"], "pool": {**s["spec"]["pool"], "generation": 1}}}
            for s in slices
        ],
        NODE,
        DRIVER,
    )
    for s in slices:
        validate(s)
        assert s["spec"]["pool"]["generation"] == 7
        assert s["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u-1", "controller": True}
        ]


@pytest.mark.parametrize(
    ("node", "driver"), [("Node_A", DRIVER), (NODE, "Bad_Driver"), ("", DRIVER)]
)
def test_invalid_names_rejected(node: str, driver: str) -> None:
    with pytest.raises(ValueError):
        build_slices(inventory("simulated:L4x1"), NodeConfig(), driver, node)


def test_long_node_name_gives_valid_deterministic_slice_names() -> None:
    node = ".".join(["a" * 63] * 3) + "." + "b" * 61  # 253 characters
    assert len(node) == 253
    names = [slice_name(node, DRIVER, n) for n in range(3)]
    assert names == [slice_name(node, DRIVER, n) for n in range(3)]
    assert len(set(names)) == 3
    for name in names:
        assert len(name) <= 253 and DNS_SUBDOMAIN.match(name)
    slices = build_slices(inventory("simulated:L4x1", node=node), NodeConfig(), DRIVER, node)
    check_all(slices, node=node)


def test_plan_devices_is_what_is_published() -> None:
    inv = inventory("simulated:H200x2,A100-80GBx1")
    config = NodeConfig(
        gpus=(GpuOverride(GpuSelector(index=2), fraction_model="capacity"),),
        extended_resources=True,
    )
    devices = offered_devices(inv, config)
    slices = build_slices(inv, config, DRIVER, NODE)
    assert [d.name for d in devices] == [d["name"] for d in slice_devices(slices)]
    table = devices_by_name(inv, config)
    shared = table["gpu-1-sm-sharing"]
    assert shared == PublishedDevice(
        name="gpu-1-sm-sharing",
        gpu=inv.gpus[1],
        fraction_model="products",
        product=None,
        portion=None,
        memory_bytes=inv.gpus[1].memory_bytes,
        compute_mode="sm-sharing",
        counter_set="gpu-1",
        slots=8,
        sizes=(1, 2, 4, 8),
        default_size=8,
    )
    quarter = table["gpu-1-time-slicing-quarter"]
    assert quarter.product == "quarter" and quarter.portion == Fraction(1, 4)
    assert quarter.memory_bytes == inv.gpus[1].memory_bytes  # a share's memory is its slots
    assert (quarter.slots, quarter.sizes, quarter.counter_set) == (8, (2,), "gpu-1")
    assert quarter.compute_mode == "time-slicing"
    cap = table["gpu-2-time-slicing"]
    assert cap.fraction_model == "capacity" and cap.product is None and cap.portion is None
    assert cap.memory_bytes == inv.gpus[2].memory_bytes
    assert (cap.slots, cap.sizes, cap.counter_set) == (0, (), "gpu-2")
    assert [n for n in table if n.startswith("gpu-2")] == ["gpu-2-time-slicing", "gpu-2-sm-sharing"]


def test_render_slices_json_matches_build(tmp_path: Any) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(
        "apiVersion: gpu-fraction.dra.dev/v1alpha1\nkind: NodeConfig\n"
        "defaults: {computeMode: sm-sharing}\n"
    )
    text = render_slices_json("node-b", "simulated:H200x8", str(path), DRIVER)
    config = parse_node_config(
        {
            "apiVersion": "gpu-fraction.dra.dev/v1alpha1",
            "kind": "NodeConfig",
            "defaults": {"computeMode": "sm-sharing"},
        }
    )
    assert json.loads(text) == build_slices(
        inventory("simulated:H200x8", "node-b"), config, DRIVER, "node-b"
    )
    assert not text.endswith("\n")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("9.0", "9.0.0"),
        ("615.71.09", "615.71.9"),
        ("13.4", "13.4.0"),
        ("580", "580.0.0"),
        ("1.2.3-rc.1", "1.2.3-rc.1"),
        ("1.2.3.4", None),
        ("r615", None),
    ],
)
def test_semver(text: str, expected: str | None) -> None:
    assert semver(text) == expected


def test_unparseable_driver_version_is_a_string() -> None:
    gpu = replace(inventory("simulated:L4x1").gpus[0], driver_version="r615-beta_1 build 7")
    slices = build_slices(Inventory(gpus=(gpu,)), NodeConfig(), DRIVER, NODE)
    attrs = slice_devices(slices)[0]["attributes"]
    assert attrs["driverVersion"] == {"string": "r615-beta_1 build 7"}


def test_driver_version_as_semver_and_as_the_driver_prints_it() -> None:
    """``driverVersion`` compares (semver drops the leading zero of ``05``);
    ``driverVersionString`` is the driver's own string, as ``nvidia-smi`` shows it."""
    slices = build_slices(inventory("simulated:L4x1@580.95.05"), NodeConfig(), DRIVER, NODE)
    attrs = slice_devices(slices)[0]["attributes"]
    assert attrs["driverVersion"] == {"version": "580.95.5"}
    assert attrs["driverVersionString"] == {"string": "580.95.05"}


# --- property: many simulated nodes --------------------------------------------------------

MODELS = ["H200", "A100-80GB", "V100-32GB", "L4", "A100-80GB-MIG", "H100-80GB"]
PORTIONS = [Fraction(n, d) for d in (1, 2, 3, 4, 5, 6, 8, 16) for n in range(1, d + 1)]
COMPUTE_MODE_SETTINGS = ["auto", "time-slicing", "sm-sharing"]


@st.composite
def product_lists(draw: st.DrawFn, names: Sequence[str]) -> tuple[Product, ...]:
    chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=10, unique=True))
    # one name, one portion (the loader's rule: a product's DeviceClass is cluster-wide)
    return tuple(Product(n, PORTIONS[names.index(n) * 7 % len(PORTIONS)]) for n in chosen)


@st.composite
def nodes(draw: st.DrawFn) -> tuple[str, NodeConfig]:
    wanted = draw(
        st.lists(st.tuples(st.sampled_from(MODELS), st.integers(1, 8)), min_size=1, max_size=3)
    )
    parts: list[tuple[str, int]] = []
    total = 0
    for model, count in wanted:  # at most 8 GPUs per node
        count = min(count, 8 - total)
        if count:
            parts.append((model, count))
            total += count
    spec = "simulated:" + ",".join(f"{m}x{c}" for m, c in parts)
    names = [f"p{i}" for i in range(12)] + ["eighth", "quarter", "half", "full"]
    overrides = []
    for _ in range(draw(st.integers(0, 3))):
        selector = draw(
            st.one_of(
                st.builds(GpuSelector, index=st.integers(0, total - 1)),
                st.builds(GpuSelector, product=st.sampled_from(["NVIDIA H200", "NVIDIA L4"])),
            )
        )
        overrides.append(
            GpuOverride(
                selector,
                fraction_model=draw(st.sampled_from([None, "products", "capacity"])),
                compute_mode=draw(st.sampled_from([None, *COMPUTE_MODE_SETTINGS])),
                products=draw(st.one_of(st.none(), product_lists(names))),
                capacity=draw(
                    st.sampled_from(
                        [{}, {"minimum": 512 * MIB, "step": 128 * MIB}, {"default": 10 * GIB}]
                    )
                ),
                enabled=draw(st.sampled_from([None, None, None, False])),
            )
        )
    defaults = GpuConfig(
        fraction_model=draw(st.sampled_from(["products", "products", "capacity"])),
        compute_mode=draw(st.sampled_from(COMPUTE_MODE_SETTINGS)),
        products=draw(product_lists(names)),
    )
    config = NodeConfig(defaults=defaults, gpus=tuple(overrides))
    # slotsPerGpu: unset (the products' common denominator) or a multiple of it (loader rule)
    multiple = draw(st.sampled_from([None, 1, 3]))
    return spec, replace(
        config,
        slots_per_gpu=multiple and multiple * slots_for(config.all_products()),
        extended_resources=draw(st.booleans()),
    )


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes(), st.sampled_from(["node-a", "gpu-node-17.example.com"]), st.data())
def test_any_node_publishes_valid_safe_slices(
    node_config: tuple[str, NodeConfig], node: str, data: st.DataObject
) -> None:
    spec, config = node_config
    inv = inventory(spec, node=node)
    enforcement = {
        g.uuid: data.draw(st.sampled_from(["hard", "cooperative", "none"])) for g in inv.gpus
    }
    slices = build_slices(inv, config, DRIVER, node, enforcement=enforcement)
    check_all(slices, node=node)
    published = slice_devices(slices)
    planned = offered_devices(inv, config)
    assert [d.name for d in planned] == [d["name"] for d in published]
    for gpu in inv.gpus:
        cfg = config.for_gpu(gpu)
        mine = [d for d in planned if d.gpu == gpu]
        if gpu.mig_enabled or not cfg.enabled:
            assert mine == []
            continue
        # one shared device per mode the GPU is offered in (both for auto), in that order
        assert [d.compute_mode for d in mine if d.product is None] == list(cfg.modes)
        per_mode = 1
        if cfg.fraction_model == "products" and config.extended_resources:
            per_mode += len(cfg.products)
        assert len(mine) == per_mode * len(cfg.modes)
    for device, body in zip(planned, published, strict=True):
        cfg = config.for_gpu(device.gpu)
        assert device.fraction_model == cfg.fraction_model
        assert device.memory_bytes == device.gpu.memory_bytes
        assert device.counter_set == f"gpu-{device.gpu.index}"
        attrs = body["attributes"]
        assert attrs["uuid"]["string"] == device.gpu.uuid
        assert attrs["computeMode"]["string"] == device.compute_mode
        assert attrs["memoryEnforcement"]["string"] == enforcement[device.gpu.uuid]
        if device.fraction_model == "capacity":
            assert qty(body["capacity"]["memory"]["value"]) == device.gpu.memory_bytes
            continue
        # whole slots of slotsPerGpu, one size per product, none above the GPU
        assert device.slots == config.slots == qty(body["capacity"]["slots"]["value"])
        offered = {p.portion * config.slots for p in cfg.products}
        if device.product is None:
            assert set(device.sizes) == offered
        else:
            assert device.portion is not None
            assert device.sizes == (device.portion * config.slots,)
        assert all(int(s) == s and 0 < s <= device.slots for s in device.sizes)
        policy = body["capacity"]["slots"]["requestPolicy"]
        assert [qty(v) for v in policy["validValues"]] == list(device.sizes)


def test_pre_volta_gpu_not_offered_and_warned() -> None:
    """MPS before Volta has no per-client memory limit (dra-driver-nvidia-gpu #974)."""
    inv = inventory("simulated:P100-16GBx1,L4x1", node="old-node")
    with capture_logs() as logs:
        slices = build_slices(inv, NodeConfig(), DRIVER, "old-node")
    check_all(slices, node="old-node")
    assert {d["attributes"]["index"]["int"] for d in slice_devices(slices)} == {1}
    [warning] = [e for e in logs if e["log_level"] == "warning"]
    assert warning["gpu"] == 0
    assert "compute capability 6.0 < 7.0" in warning["reason"]
