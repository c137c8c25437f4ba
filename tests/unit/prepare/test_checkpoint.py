"""Checkpoint durability: versioned, checksummed, boot-scoped, corruption kept aside."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.model.plans import ClaimRef, PreparedDevice
from dra_driver.prepare import checkpoint
from dra_driver.prepare.checkpoint import (
    VERSION,
    Checkpoint,
    CheckpointCorrupt,
    ClaimRecord,
    _checksum,
)
from tests.support import claimfactory as cf
from tests.support.fakes.plans import GIB, device, gpu, plan
from tests.support.node import Node
from tests.support.paths import TEST_DATA

UID = "0c000000-0000-4000-8000-00000000000c"


def record(uid: str = UID) -> ClaimRecord:
    p = plan(
        device(gpu(0), 20 * GIB, 30 * GIB),
        device(gpu(1), 8 * GIB, mode="sm-sharing", threads=30, name="gpu-1", share_id="s1"),
        uid=uid,
    )
    devices = tuple(
        PreparedDevice(d.request_names, d.pool, d.device, d.share_id, (f"v/claim=c-{d.key}",))
        for d in p.devices
    )
    return ClaimRecord(p.claim.namespace, p.claim.name, devices, p)


def test_round_trip(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path, "boot-1")
    cp.claims[UID] = record()
    cp.save()
    again = Checkpoint(tmp_path, "boot-1")
    assert again.load()
    assert again.claims == {UID: record()}
    assert not list(tmp_path.glob(".*tmp"))


def test_new_boot_resets(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path, "boot-1")
    cp.claims[UID] = record()
    cp.save()
    after_reboot = Checkpoint(tmp_path, "boot-2")
    assert after_reboot.load() is False
    assert after_reboot.claims == {}
    assert json.loads(cp.path.read_text())["bootId"] == "boot-2"


@pytest.mark.parametrize(
    "damage",
    [
        lambda doc: "{not json",
        lambda doc: json.dumps({**doc, "version": 99}),
        lambda doc: json.dumps({**doc, "version": True}),
        lambda doc: json.dumps({**doc, "version": [1]}),
        lambda doc: json.dumps({**doc, "claims": {UID: {"tampered": True}}}),
        lambda doc: json.dumps({k: v for k, v in doc.items() if k != "claims"}),
    ],
)
def test_corruption_is_reported_and_kept(tmp_path: Path, damage: object) -> None:
    cp = Checkpoint(tmp_path, "b")
    cp.claims[UID] = record()
    cp.save()
    doc = json.loads(cp.path.read_text())
    cp.path.write_text(damage(doc))  # type: ignore[operator]
    broken = cp.path.read_text()
    fresh = Checkpoint(tmp_path, "b")
    with pytest.raises(CheckpointCorrupt) as info:
        fresh.load()
    assert info.value.kept_at.read_text() == broken
    assert not cp.path.exists()
    assert fresh.claims == {}


def _write(tmp_path: Path, claims: dict[str, Any]) -> Checkpoint:
    """A checkpoint file with these raw records and a valid checksum (boot ``b``)."""
    doc = {"version": 1, "bootId": "b", "checksum": _checksum(claims), "claims": claims}
    (tmp_path / "checkpoint.json").write_text(json.dumps(doc))
    return Checkpoint(tmp_path, "b")


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]  # type: ignore[index]
    doc[last] = value


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("plan", None, f"record {UID}.plan is NoneType, not dict"),
        ("devices", {}, f"record {UID}.devices is dict, not list"),
        ("devices.0.cdi_device_ids", [1], f"record {UID}.devices[0].cdi_device_ids is not a list"),
        ("plan.devices.0.gpu.uuid", 7, f"record {UID}.plan.devices[0].gpu.uuid is int, not str"),
        ("plan.devices.0.memory_limit_bytes", True, "memory_limit_bytes is bool, not int"),
        ("plan.devices.0.compute_mode", None, "compute_mode is NoneType, not str"),
        ("plan.devices.1.active_thread_percentage", "30", "active_thread_percentage is str"),
        ("plan.claim.uid", "0d000000-0000-4000-8000-00000000000d", "holds the plan of claim 0d"),
    ],
)
def test_a_record_of_the_wrong_shape_is_corrupt_and_named(
    tmp_path: Path, path: str, value: Any, message: str
) -> None:
    doc = json.loads(json.dumps(record().to_json()))
    _set(doc, path, value)
    with pytest.raises(CheckpointCorrupt, match=re.escape(message)):
        _write(tmp_path, {UID: doc}).load()


def test_a_required_field_missing_is_corrupt_and_named(tmp_path: Path) -> None:
    doc = json.loads(json.dumps(record().to_json()))
    del doc["plan"]["devices"][0]["gpu"]["minor"]
    with pytest.raises(CheckpointCorrupt, match=r"plan\.devices\[0\]\.gpu\.minor is missing"):
        _write(tmp_path, {UID: doc}).load()


def test_optional_fields_take_their_defaults(tmp_path: Path) -> None:
    doc = json.loads(json.dumps(record().to_json()))
    for d in doc["plan"]["devices"]:
        for key in ("share_id", "active_thread_percentage"):
            del d[key]
        for key in ("name", "sm_count", "compute_capability", "architecture", "pci_bus_id"):
            del d["gpu"][key]
        for key in ("mig_enabled", "driver_version", "cuda_driver_version"):
            del d["gpu"][key]
    for d in doc["devices"]:
        del d["share_id"]
    cp = _write(tmp_path, {UID: doc})
    assert cp.load()
    [read] = cp.claims.values()
    d0 = read.plan.devices[1]
    assert (d0.share_id, d0.active_thread_percentage, read.devices[1].share_id) == (None,) * 3
    assert (d0.gpu.uuid, d0.gpu.memory_bytes) == (gpu(1).uuid, gpu(1).memory_bytes)
    assert (d0.gpu.name, d0.gpu.sm_count, d0.gpu.mig_enabled, d0.gpu.cuda_driver_version) == (
        "",
        0,
        False,
        "",
    )
    cp.save()
    assert (
        json.loads(cp.path.read_text())["claims"][UID]["plan"]["devices"][1]["gpu"][
            "cuda_driver_version"
        ]
        == ""
    )


FIXTURES = TEST_DATA / "checkpoints"
"""One checkpoint per released format, as that version's code wrote it (boot ID ``boot-1``):
``v1.json`` by the current code, ``v1-without-optional-fields.json`` by a v1 writer that
predates a device's ``active_thread_percentage``, a GPU's ``cuda_driver_version`` and null
``share_id`` entries."""
FIXTURE_UIDS = {"0a000000-0000-4000-8000-00000000000a", "0b000000-0000-4000-8000-00000000000b"}
"""Their claims, prepared under the old layout (device names no longer published): ``0a..``
holds ``gpu-0-full-0`` (a whole GPU 0, time-slicing, exclusive), ``0b..`` a 40Gi sm-sharing
share of the capacity device ``gpu-1``. On ``MIXED_CONFIG`` GPU 0 now offers
``gpu-0-time-slicing`` and ``gpu-0-sm-sharing`` (products), GPU 1 ``gpu-1-sm-sharing``."""


def _install(node: Node, doc: dict[str, Any]) -> None:
    node.state_dir.mkdir(parents=True, exist_ok=True)
    (node.state_dir / "checkpoint.json").write_text(json.dumps(doc))


def _ref(claim: dict[str, Any]) -> ClaimRef:
    m = claim["metadata"]
    return ClaimRef(m["namespace"], m["name"], m["uid"])


def _recorded(node: Node, uid: str) -> dict[str, Any]:
    return json.loads((node.state_dir / "checkpoint.json").read_text())["claims"].get(uid)


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.name)
def test_released_formats_load_and_their_claims_are_honoured(
    mixed_node: Node, fixture: Path
) -> None:
    """The upgrade to the new layout: old-layout records are restored, answered from the
    record, count against their GPU's memory and mode, and Unprepare removes them."""
    node = mixed_node
    _install(node, json.loads(fixture.read_text()))
    preparation = node.preparation("boot-1")
    assert set(preparation.checkpoint.claims) == FIXTURE_UIDS
    assert not list(node.state_dir.glob("checkpoint.json.corrupt-*"))
    assert {p.claim.uid for p in preparation.prepared_plans()} == FIXTURE_UIDS
    assert set(node.enforcer.applied) == FIXTURE_UIDS  # restored at start
    specs = {u: node.cdi_root / f"{DEFAULT_DRIVER_NAME}-claim_{u}.json" for u in FIXTURE_UIDS}
    assert all(p.exists() for p in specs.values())  # rewritten at start

    refs = {u: ClaimRef(r.namespace, r.name, u) for u, r in preparation.checkpoint.claims.items()}
    recorded = {u: r.devices for u, r in preparation.checkpoint.claims.items()}
    gets = node.claims.requests
    out = preparation.prepare(
        refs.values()
    )  # the claims are not in the API server: from the record
    assert {u: (o.error, o.devices) for u, o in out.items()} == {
        u: ("", recorded[u]) for u in FIXTURE_UIDS
    }
    assert node.claims.requests == gets
    assert recorded["0a000000-0000-4000-8000-00000000000a"][0].device == "gpu-0-full-0"

    eighth = cf.claim([node.share(0, "eighth", mode="time-slicing")])
    other_mode = cf.claim([node.share(0, "eighth", mode="sm-sharing")])
    big_share = cf.claim([node.share(1, None, memory="120Gi")])
    small_share = cf.claim([node.share(1, None, memory="8Gi")])
    for c in (eighth, other_mode, big_share, small_share):
        node.claims.add(c)
    out = preparation.prepare([_ref(c) for c in (eighth, other_mode, big_share, small_share)])
    assert "more than the card's" in out[eighth["metadata"]["uid"]].error
    assert "never carries both modes" in out[other_mode["metadata"]["uid"]].error
    assert "more than the card's" in out[big_share["metadata"]["uid"]].error
    assert out[small_share["metadata"]["uid"]].error == ""

    assert preparation.unprepare(refs.values()) == {u: "" for u in FIXTURE_UIDS}
    assert set(preparation.checkpoint.claims) == {small_share["metadata"]["uid"]}
    assert all(_recorded(node, u) is None for u in FIXTURE_UIDS)
    assert not set(node.enforcer.applied) & FIXTURE_UIDS
    assert not any(p.exists() for p in specs.values())
    out = preparation.prepare([_ref(eighth), _ref(other_mode)])  # GPU 0 is free for either mode
    assert out[eighth["metadata"]["uid"]].error == ""
    assert "never carries both modes" in out[other_mode["metadata"]["uid"]].error
    preparation.close()


def _add_unknown_fields(doc: dict[str, Any]) -> None:
    doc["futureTopLevel"] = {"x": 1}
    for record in doc["claims"].values():
        record["futureRecordField"] = [1, 2]
        record["plan"]["futurePlanField"] = True
        record["plan"]["claim"]["futureClaimField"] = "x"
        for d in record["devices"]:
            d["futureDeviceField"] = None
        for d in record["plan"]["devices"]:
            d["futureDevicePlanField"] = 3
            d["gpu"]["futureGpuField"] = "y"
    doc["checksum"] = _checksum(doc["claims"])


def test_fields_of_a_newer_writer_are_ignored(mixed_node: Node) -> None:
    node = mixed_node
    doc = json.loads((FIXTURES / "v1.json").read_text())
    _add_unknown_fields(doc)
    _install(node, doc)
    preparation = node.preparation("boot-1")
    assert set(preparation.checkpoint.claims) == FIXTURE_UIDS
    assert not list(node.state_dir.glob("checkpoint.json.corrupt-*"))
    preparation.close()


OPTIONAL = {"share_id": "str", "active_thread_percentage": "int"}
"""Fields a v1 record may hold as null (the old layout's exclusive devices had no share ID)."""


def _shape(value: Any, key: str = "") -> Any:
    """The keys (recursively) and JSON types of a document, without its values; an
    :data:`OPTIONAL` field is ``optional <type>`` whether null or of its type."""
    if key in OPTIONAL and (value is None or type(value).__name__ == OPTIONAL[key]):
        return f"optional {OPTIONAL[key]}"
    if isinstance(value, dict):
        return {k: _shape(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value[:1]]
    return type(value).__name__


def test_the_current_writer_writes_the_v1_fixture_format(mixed_node: Node) -> None:
    """If this fails the format changed: bump ``checkpoint.VERSION``, migrate the old version
    and add a fixture written by the new code. The fixture's claims, prepared again on the
    new layout: a whole GPU 0 (a share of ``gpu-0-time-slicing``) and a 40Gi sm-sharing share
    of GPU 1."""
    node = mixed_node
    fixture = json.loads((FIXTURES / "v1.json").read_text())
    made = [
        cf.claim(
            [node.share(0, "full", mode="time-slicing")],
            namespace="team-a",
            name="train",
            uid="0a000000-0000-4000-8000-00000000000a",
        ),
        cf.claim(
            [node.share(1, None, memory="40Gi")],
            [cf.opaque(activeThreadPercentage=30)],
            namespace="team-b",
            name="infer",
            uid="0b000000-0000-4000-8000-00000000000b",
        ),
    ]
    for c in made:
        node.claims.add(c)
    preparation = node.preparation("boot-1")
    assert all(not o.error for o in preparation.prepare([_ref(c) for c in made]).values())
    preparation.close()
    written = json.loads((node.state_dir / "checkpoint.json").read_text())
    assert written["version"] == fixture["version"] == VERSION
    assert _shape(written) == _shape(fixture)


GARBAGE = {
    "deeply-nested": b"[" * 100_000 + b"]" * 100_000,  # RecursionError in json.loads
    "5000-digit-int": b'{"version": ' + b"1" * 5000 + b"}",  # ValueError: int digit limit
}


@pytest.mark.parametrize("raw", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_that_json_refuses_otherwise_is_corrupt_and_kept_aside(
    tmp_path: Path, raw: bytes
) -> None:
    """json.loads raises RecursionError or a plain ValueError for these, not JSONDecodeError:
    they escaped load() and crashed the plugin's start-up."""
    (tmp_path / "checkpoint.json").write_bytes(raw)
    with pytest.raises(CheckpointCorrupt):
        Checkpoint(tmp_path, "boot-1").load()
    assert [p.read_bytes() for p in tmp_path.glob("checkpoint.json.corrupt-*")] == [raw]


def test_plugin_start_survives_a_garbage_checkpoint(node: Node) -> None:
    node.state_dir.mkdir(parents=True, exist_ok=True)
    (node.state_dir / "checkpoint.json").write_bytes(GARBAGE["deeply-nested"])
    node.preparation().close()
    assert list(node.state_dir.glob("checkpoint.json.corrupt-*"))


def test_two_corrupt_files_in_one_second_are_both_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept-aside name was the unix second alone; the second file replaced the first."""
    monkeypatch.setattr(checkpoint.time, "time", lambda: 1_800_000_000.5)
    for raw in (b"first{", b"second{"):
        (tmp_path / "checkpoint.json").write_bytes(raw)
        with pytest.raises(CheckpointCorrupt):
            Checkpoint(tmp_path, "boot-1").load()
    kept = sorted(p.read_bytes() for p in tmp_path.glob("checkpoint.json.corrupt-*"))
    assert kept == [b"first{", b"second{"]
