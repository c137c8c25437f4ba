"""ResourceSlice planning and bodies: layout, limits, attributes, memory safety of products."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.config import (
    CapacityPolicy,
    GpuConfig,
    GpuOverride,
    GpuSelector,
    NodeConfig,
    Product,
)
from dra_driver.configload import parse_node_config
from dra_driver.gpus import MIB, Inventory, SimulatedGpuSource, SkippedGpu
from dra_driver.gpus.simulated import PROFILES
from dra_driver.quantities import quantity_value
from dra_driver.slices import (
    PCI_BUS_ID_ATTRIBUTE,
    build_slices,
    capacity_request_policy,
    devices_by_name,
    offered_devices,
    render_slices_json,
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
        assert len(devices) <= 64
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
            assert len(d.get("consumesCounters", [])) <= 2
            if d.get("allowMultipleAllocations"):
                policy = d["capacity"]["memory"]["requestPolicy"]
                value = qty(d["capacity"]["memory"]["value"])
                lo, step = qty(policy["validRange"]["min"]), qty(policy["validRange"]["step"])
                hi, default = qty(policy["validRange"]["max"]), qty(policy["default"])
                assert lo + step <= value and lo <= default <= hi <= value
                assert (default - lo) % step == 0 and (hi - lo) % step == 0
                assert hi + step > value  # max is the largest on-grid amount
    # every consumption refers to a counter set of the pool and to its counters
    for d in slice_devices(slices):
        for c in d.get("consumesCounters", []):
            assert c["counterSet"] in counter_sets
            assert set(c["counters"]) <= set(counter_sets[c["counterSet"]])


def check_memory_safety(slices: Sequence[Mapping[str, Any]]) -> None:
    """No set of devices the scheduler may co-allocate on one GPU exceeds the card.

    For each counter set, the heaviest (by memory) subset of its devices that fits the ``slots``
    counter (exact 0/1 knapsack) must fit the card; so must the memory counter itself, and each
    device's consumption must equal its published memory capacity.
    """
    counters = {
        cs["name"]: {k: qty(v["value"]) for k, v in cs["counters"].items()}
        for s in slices
        for cs in s["spec"].get("sharedCounters", [])
    }
    by_set: dict[str, list[tuple[int, int]]] = {name: [] for name in counters}
    card: dict[str, int] = {}
    for d in slice_devices(slices):
        for c in d.get("consumesCounters", []):
            mem, slots = qty(c["counters"]["memory"]["value"]), qty(c["counters"]["slots"]["value"])
            assert mem == qty(d["capacity"]["memory"]["value"]) > 0 and slots > 0
            by_set[c["counterSet"]].append((slots, mem))
            card[c["counterSet"]] = d["attributes"]["gpuMemory"]["int"]
            portion = Fraction(d["attributes"]["portion"]["string"])
            assert Fraction(slots, counters[c["counterSet"]]["slots"]) == portion
    for name, items in by_set.items():
        assert items, f"counter set {name} without devices"
        total_slots, total_mem = counters[name]["slots"], counters[name]["memory"]
        assert total_mem <= card[name]
        best = [0] + [-1] * total_slots  # best[s]: max memory using exactly s slots
        for slots, mem in items:
            for s in range(total_slots, slots - 1, -1):
                if best[s - slots] >= 0:
                    best[s] = max(best[s], best[s - slots] + mem)
        assert max(best) <= card[name]
        # a device taking all slots excludes everything else
        for slots, _ in items:
            if slots == total_slots:
                assert all(other > 0 for other, _ in items)


def check_all(slices: Sequence[Mapping[str, Any]], node: str = NODE, driver: str = DRIVER) -> None:
    check_limits(slices, node, driver)
    check_memory_safety(slices)
    for s in slices:
        validate(s)


# --- fixed scenarios -----------------------------------------------------------------------


def test_default_h200x8_layout() -> None:
    slices = build_slices(inventory("simulated:H200x8"), NodeConfig(), DRIVER, NODE)
    check_all(slices)
    assert [s["metadata"]["name"] for s in slices] == [
        "node-a-gpu-fraction-dra-dev-0",
        "node-a-gpu-fraction-dra-dev-1",
        "node-a-gpu-fraction-dra-dev-2",
    ]
    assert [len(s["spec"].get("sharedCounters", [])) for s in slices] == [8, 0, 0]
    assert [len(s["spec"].get("devices", [])) for s in slices] == [0, 60, 60]
    assert all(s["spec"]["pool"]["resourceSliceCount"] == 3 for s in slices)
    assert all(s["metadata"]["labels"] == {"app.kubernetes.io/managed-by": DRIVER} for s in slices)
    counters = slices[0]["spec"]["sharedCounters"][0]
    assert counters == {
        "name": "gpu-0",
        "counters": {"memory": {"value": f"{H200_MIB}Mi"}, "slots": {"value": "8"}},
    }
    names = [d["name"] for d in slice_devices(slices)]
    assert names[:15] == (
        [f"gpu-0-eighth-{n}" for n in range(8)]
        + [f"gpu-0-quarter-{n}" for n in range(4)]
        + ["gpu-0-half-0", "gpu-0-half-1", "gpu-0-full-0"]
    )


def test_sixteen_gpus_need_two_counter_slices() -> None:
    slices = build_slices(inventory("simulated:L4x16"), NodeConfig(), DRIVER, NODE)
    check_all(slices)
    assert [len(s["spec"].get("sharedCounters", [])) for s in slices] == [8, 8, 0, 0, 0, 0]
    assert [len(s["spec"].get("devices", [])) for s in slices] == [0, 0, 60, 60, 60, 60]


def test_heavy_node_one_gpu_per_device_slice() -> None:
    products = tuple(
        Product(name, Fraction(1, d))
        for name, d in [("p32", 32), ("p16", 16), ("p8", 8), ("p4", 4), ("p2", 2), ("p1", 1)]
    )
    config = NodeConfig(defaults=GpuConfig(products=products))
    slices = build_slices(inventory("simulated:H200x4,A100-80GBx4"), config, DRIVER, NODE)
    check_all(slices)
    assert [len(s["spec"].get("devices", [])) for s in slices] == [0] + [63] * 8
    assert all(s["spec"]["pool"]["resourceSliceCount"] == 9 for s in slices)
    for s in slices[1:]:
        assert len({d["consumesCounters"][0]["counterSet"] for d in s["spec"]["devices"]}) == 1


def test_product_device_body() -> None:
    gpu = inventory("simulated:H200x1").gpus[0]
    slices = build_slices(
        inventory("simulated:H200x1"), NodeConfig(), DRIVER, NODE, enforcement={gpu.uuid: "hard"}
    )
    quarter = next(d for d in slice_devices(slices) if d["name"] == "gpu-0-quarter-1")
    memory = H200_MIB * MIB // 4 // MIB * MIB  # rounded down to a whole MiB
    assert quarter == {
        "name": "gpu-0-quarter-1",
        "attributes": {
            "uuid": {"string": gpu.uuid},
            "index": {"int": 0},
            "minor": {"int": 0},
            "productName": {"string": "NVIDIA H200"},
            "architecture": {"string": "hopper"},
            "computeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "615.71.9"},
            "driverVersionString": {"string": "615.71.09"},
            "cudaDriverVersion": {"version": "13.4.0"},
            "gpuMemory": {"int": H200_MIB * MIB},
            "smCount": {"int": 132},
            "computeMode": {"string": "time-slicing"},
            "fractionModel": {"string": "products"},
            "memoryEnforcement": {"string": "hard"},
            "product": {"string": "quarter"},
            "portion": {"string": "1/4"},
            PCI_BUS_ID_ATTRIBUTE: {"string": "0000:18:00.0"},
        },
        "capacity": {"memory": {"value": f"{memory // MIB}Mi"}},
        "consumesCounters": [
            {
                "counterSet": "gpu-0",
                "counters": {
                    "memory": {"value": f"{memory // MIB}Mi"},
                    "slots": {"value": "2"},
                },
            }
        ],
    }
    full = next(d for d in slice_devices(slices) if d["name"] == "gpu-0-full-0")
    assert full["consumesCounters"][0]["counters"] == {
        "memory": {"value": f"{H200_MIB}Mi"},
        "slots": {"value": "8"},
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
    capacity = devices["gpu-0"]
    assert capacity["allowMultipleAllocations"] is True
    assert "consumesCounters" not in capacity
    top = 1024 + (H200_MIB - 1024) // 256 * 256  # 1Gi + n * 256Mi within the card (MiB)
    assert capacity["capacity"] == {
        "memory": {
            "value": f"{H200_MIB}Mi",
            "requestPolicy": {
                "default": f"{top}Mi",  # default: the whole card, on the grid
                "validRange": {"min": "1Gi", "step": "256Mi", "max": f"{top}Mi"},
            },
        }
    }
    assert capacity["attributes"]["fractionModel"] == {"string": "capacity"}
    assert capacity["attributes"]["computeMode"] == {"string": "sm-sharing"}
    assert "product" not in capacity["attributes"] and "portion" not in capacity["attributes"]
    # the L4 (index 1) stays on products: one counter set, gpu-1
    assert [cs["name"] for s in slices for cs in s["spec"].get("sharedCounters", [])] == ["gpu-1"]


@pytest.mark.parametrize(
    ("default", "expected"),
    [(None, 7936), (GIB, 1024), (1500 * MIB, 1536), (100 * GIB, 7936), (1025 * MIB, 1280)],
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
    config = NodeConfig(gpus=(GpuOverride(GpuSelector(index=2), fraction_model="capacity"),))
    devices = offered_devices(inv, config)
    slices = build_slices(inv, config, DRIVER, NODE)
    assert [d.name for d in devices] == [d["name"] for d in slice_devices(slices)]
    table = devices_by_name(inv, config)
    quarter = table["gpu-1-quarter-3"]
    assert quarter.gpu == inv.gpus[1]
    assert quarter.product == "quarter" and quarter.portion == Fraction(1, 4)
    assert quarter.memory_bytes == H200_MIB * MIB // 4 // MIB * MIB
    assert quarter.compute_mode == "time-slicing"
    assert table["gpu-1-full-0"].memory_bytes == inv.gpus[1].memory_bytes
    cap = table["gpu-2"]
    assert cap.fraction_model == "capacity" and cap.product is None and cap.portion is None
    assert cap.memory_bytes == inv.gpus[2].memory_bytes


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
    from dataclasses import replace

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


@st.composite
def product_lists(draw: st.DrawFn, names: Sequence[str]) -> tuple[Product, ...]:
    chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=5, unique=True))
    products: list[Product] = []
    for name in chosen:
        portion = PORTIONS[names.index(name) * 7 % len(PORTIONS)]  # one name, one portion
        if sum(p.count for p in products) + int(1 / portion) <= 64:
            products.append(Product(name, portion))
    return tuple(products)


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
                compute_mode=draw(st.sampled_from([None, "time-slicing", "sm-sharing"])),
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
        compute_mode=draw(st.sampled_from(["time-slicing", "sm-sharing"])),
        products=draw(product_lists(names)),
    )
    return spec, NodeConfig(defaults=defaults, gpus=tuple(overrides))


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
    for device, body in zip(planned, published, strict=True):
        assert not device.gpu.mig_enabled
        assert (
            qty(body["capacity"]["memory"]["value"])
            == device.memory_bytes
            <= device.gpu.memory_bytes
        )
        attrs = body["attributes"]
        assert attrs["uuid"]["string"] == device.gpu.uuid
        assert attrs["computeMode"]["string"] == config.for_gpu(device.gpu).compute_mode
        assert attrs["memoryEnforcement"]["string"] == enforcement[device.gpu.uuid]
        if device.fraction_model == "products":
            assert device.portion is not None
            assert device.memory_bytes == (
                device.gpu.memory_bytes
                if device.portion == 1
                else int(device.portion * device.gpu.memory_bytes) // MIB * MIB
            )


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
