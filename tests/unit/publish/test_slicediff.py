"""The pure slice diff: desired vs stored ResourceSlices (API JSON) -> ordered writes.

No API, no fake: stored slices are desired bodies stamped the way an API server stores them.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.config.node import GpuConfig, NodeConfig
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.publish.devicetaints import GPU_LOST, DeviceTaint, taint_key
from dra_driver.publish.slicediff import (
    SliceWrite,
    check_desired,
    diff_slices,
    normalize_spec,
    owned_slices,
    stored_form,
)
from dra_driver.publish.slices import build_slices

DRIVER = DEFAULT_DRIVER_NAME
NODE = "node-a"
DEFAULTS = NodeConfig()
CAPACITY = NodeConfig(defaults=GpuConfig(fraction_model="capacity"))
"""Every GPU on the capacity model: devices with ``memory`` quantities in bytes."""
BIG = "simulated:H200x8,L4x8"
"""16 GPUs: two counter slices and one device slice, one slice more than an H200x8 node."""


def desired(
    spec: str = "simulated:H200x8",
    node: str = NODE,
    config: NodeConfig = DEFAULTS,
    **kw: Any,
) -> list[dict[str, Any]]:
    """The node's slices; H200x8 with the default configuration: a counter slice and a device
    slice."""
    inventory = SimulatedGpuSource(spec, seed=node).discover()
    return build_slices(inventory, config, DRIVER, node, **kw)


def stored(bodies: list[dict[str, Any]], generation: int = 1) -> list[dict[str, Any]]:
    """``bodies`` as the server returns them after a write at ``generation``."""
    out = copy.deepcopy(bodies)
    for rv, obj in enumerate(out, start=1):
        obj["metadata"]["resourceVersion"] = str(rv)
        obj["metadata"]["uid"] = f"uid-{obj['metadata']['name']}"
        obj["spec"]["pool"]["generation"] = generation
    return out


def ops(writes: tuple[SliceWrite, ...]) -> list[tuple[str, str]]:
    return [(w.op, w.name) for w in writes]


def names(bodies: list[dict[str, Any]]) -> list[str]:
    return [b["metadata"]["name"] for b in bodies]


def gpu_uuid(index: int, spec: str = "simulated:H200x8") -> str:
    return SimulatedGpuSource(spec, seed=NODE).discover().gpus[index].uuid


def test_nothing_stored_creates_every_slice_in_order() -> None:
    want = desired()
    diff = diff_slices(want, [])
    assert ops(diff.writes) == [("create", n) for n in names(want)]
    assert diff.generations == {NODE: 1}
    assert all(w.body["spec"]["pool"]["generation"] == 1 for w in diff.writes)


def test_equal_content_writes_nothing_and_keeps_the_generation() -> None:
    diff = diff_slices(desired(), stored(desired(), generation=7))
    assert diff.writes == () and diff.generations == {NODE: 7}


def test_changed_content_updates_every_slice_of_the_pool() -> None:
    have = stored(desired(), generation=3)
    diff = diff_slices(desired(enforcement={gpu_uuid(3): "hard"}), have)
    assert ops(diff.writes) == [("update", n) for n in names(have)]
    assert diff.generations == {NODE: 4}
    for write, old in zip(diff.writes, have, strict=True):
        assert write.body["spec"]["pool"]["generation"] == 4
        assert write.body["metadata"]["resourceVersion"] == old["metadata"]["resourceVersion"]


def test_desired_generation_above_the_stored_one_wins() -> None:
    diff = diff_slices(desired(enforcement={gpu_uuid(0): "hard"}, generation=9), stored(desired()))
    assert diff.generations == {NODE: 9}


def test_quantities_compare_by_value_and_empty_fields_are_ignored() -> None:
    want = desired("simulated:H200x1", config=CAPACITY)
    have = stored(want)
    memory = SimulatedGpuSource("simulated:H200x1", seed=NODE).discover().gpus[0].memory_bytes
    for obj in have:
        for device in obj["spec"].get("devices", []):  # byte counts instead of 141Gi, 1Gi
            device["capacity"]["memory"]["value"] = str(memory)
            device["capacity"]["memory"]["requestPolicy"]["validRange"]["min"] = str(1024**3)
        obj["spec"]["devices"] = obj["spec"].get("devices") or []  # the server's empty list
    assert have[1]["spec"] != want[1]["spec"]
    assert diff_slices(want, have).writes == ()
    assert normalize_spec(have[0]["spec"]) == normalize_spec(want[0]["spec"] | {"devices": []})


def test_update_keeps_foreign_metadata_and_restores_our_labels() -> None:
    have = stored(desired("simulated:L4x1"))
    meta = have[1]["metadata"]
    meta["labels"]["team"] = "ml"
    del meta["labels"]["app.kubernetes.io/managed-by"]
    meta["annotations"] = {"note": "x"}
    meta["finalizers"] = ["example.com/keep"]
    meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u"}]
    diff = diff_slices(desired("simulated:L4x1"), have)
    assert [w.op for w in diff.writes] == ["update", "update"]
    body = diff.writes[1].body
    assert body["metadata"]["labels"]["team"] == "ml"
    assert body["metadata"]["labels"]["app.kubernetes.io/managed-by"] == DRIVER
    assert body["metadata"]["annotations"] == {"note": "x"}
    assert body["metadata"]["finalizers"] == ["example.com/keep"]
    assert body["metadata"]["ownerReferences"] == meta["ownerReferences"]


def test_extra_foreign_labels_are_not_a_change() -> None:
    have = stored(desired("simulated:L4x1"))
    have[0]["metadata"]["labels"]["team"] = "ml"
    assert diff_slices(desired("simulated:L4x1"), have).writes == ()


def test_changed_owner_reference_is_a_change() -> None:
    have = stored(desired("simulated:L4x1", node_uid="old"))
    diff = diff_slices(desired("simulated:L4x1", node_uid="new"), have)
    assert [w.op for w in diff.writes] == ["update", "update"]


def test_fewer_slices_updates_then_deletes_sorted_last() -> None:
    have = stored(desired(BIG))
    diff = diff_slices(desired("simulated:H200x8"), list(reversed(have)))
    assert ops(diff.writes) == [
        ("update", f"{NODE}-gpu-fraction-dra-dev-0"),
        ("update", f"{NODE}-gpu-fraction-dra-dev-1"),
        ("delete", f"{NODE}-gpu-fraction-dra-dev-2"),
    ]
    assert diff.generations == {NODE: 2}
    assert ops(diff_slices([], have).writes) == [("delete", n) for n in sorted(names(have))]


def test_older_stale_slice_is_deleted_without_a_bump() -> None:
    have = stored(desired(), generation=2) + stored(desired(BIG)[2:], 1)
    diff = diff_slices(desired(), have)
    assert ops(diff.writes) == [("delete", f"{NODE}-gpu-fraction-dra-dev-2")]
    assert diff.generations == {NODE: 2}


def test_stale_slice_of_the_same_generation_forces_a_bump() -> None:
    have = stored(desired(), generation=2) + stored(desired(BIG)[2:], 2)
    diff = diff_slices(desired(), have)
    assert [w.op for w in diff.writes] == ["update", "update", "delete"]
    assert diff.generations == {NODE: 3}


def test_renamed_pool_is_deleted_then_created() -> None:
    have = stored(desired("simulated:L4x1"))
    moved = copy.deepcopy(desired("simulated:L4x1"))
    for body in moved:
        body["spec"]["pool"]["name"] = "node-a-pool"
    diff = diff_slices(moved, have)
    first, second = names(moved)
    assert ops(diff.writes) == [
        ("delete", first),
        ("create", first),
        ("delete", second),
        ("create", second),
    ]
    assert diff.generations == {"node-a-pool": 1}


def test_known_server_form_is_accepted() -> None:
    want = desired("simulated:L4x2")
    have = stored(want)
    for obj in have:  # the server dropped a field it does not know
        for device in obj["spec"].get("devices", []):
            device.pop("consumesCounters", None)
    assert [w.op for w in diff_slices(want, have).writes] == ["update", "update"]
    forms = {}
    for sent, got in zip(want, have, strict=True):
        form = stored_form(sent, got)
        if form is not None:
            forms[sent["metadata"]["name"]] = form
    assert list(forms) == [names(want)[1]]  # only the device slice lost a field
    assert diff_slices(want, have, forms).writes == ()


def test_stored_form_is_none_for_an_equal_spec() -> None:
    want = desired("simulated:L4x1")
    assert stored_form(want[0], stored(want, generation=5)[0]) is None


def test_inputs_are_not_modified() -> None:
    want = desired(enforcement={gpu_uuid(0): "hard"})
    have = stored(desired(), generation=2)
    before = copy.deepcopy((want, have))
    diff = diff_slices(want, have)
    assert diff.writes and (want, have) == before


def test_owned_slices_drop_other_nodes_and_drivers() -> None:
    other_driver = desired("simulated:L4x1")
    for body in other_driver:
        body["spec"]["driver"] = "other.example.com"
    mine = desired("simulated:L4x1")
    everything = mine + desired("simulated:L4x1", node="node-b") + other_driver
    assert owned_slices(everything, DRIVER, NODE) == mine


def test_check_desired_rejects_foreign_or_duplicate_slices() -> None:
    check_desired(desired(), DRIVER, NODE)
    with pytest.raises(ValueError, match="not for node"):
        check_desired(desired(node="node-b"), DRIVER, NODE)
    twice = desired("simulated:L4x1")
    with pytest.raises(ValueError, match="duplicate"):
        check_desired(twice + twice[:1], DRIVER, NODE)


def tainted(time_added: str) -> list[dict[str, Any]]:
    """H200x8 slices with GPU 0's devices tainted since ``time_added``."""
    taint = DeviceTaint(taint_key(DRIVER), GPU_LOST, time_added)
    return desired(taints={gpu_uuid(0): taint})


def test_taint_times_compare_by_instant() -> None:
    """The client renders a stored ``timeAdded`` as ``+00:00``; the same instant is no change,
    another instant is."""
    have = stored(tainted("2026-03-01T12:00:00Z"))
    for obj in have:
        for device in obj["spec"].get("devices", []):
            for taint in device.get("taints", []):
                taint["timeAdded"] = "2026-03-01T12:00:00+00:00"
    assert diff_slices(tainted("2026-03-01T12:00:00Z"), have).writes == ()
    assert diff_slices(tainted("2026-03-01T13:00:00+01:00"), have).writes == ()
    later = diff_slices(tainted("2026-03-01T12:00:01Z"), have)
    assert [w.op for w in later.writes] == ["update", "update"]


def test_unparsable_taint_times_compare_as_text() -> None:
    spec = tainted("yesterday")[1]["spec"]
    assert normalize_spec(spec)["devices"][0]["taints"][0]["timeAdded"] == "yesterday"
    naive = tainted("2026-03-01T12:00:00")[1]["spec"]
    assert normalize_spec(naive)["devices"][0]["taints"][0]["timeAdded"] == "2026-03-01T12:00:00"
