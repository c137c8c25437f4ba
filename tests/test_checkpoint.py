"""Checkpoint durability: versioned, checksummed, boot-scoped, corruption kept aside."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.checkpoint import VERSION, Checkpoint, CheckpointCorrupt, _checksum
from dra_driver.prepare import ClaimRef
from tests import claimfactory as cf
from tests.conftest import NODE, Node


def test_round_trip(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path, "boot-1")
    cp.claims["u1"] = {"namespace": "ns", "name": "c"}
    cp.save()
    again = Checkpoint(tmp_path, "boot-1")
    assert again.load()
    assert again.claims == {"u1": {"namespace": "ns", "name": "c"}}
    assert not list(tmp_path.glob(".*tmp"))


def test_new_boot_resets(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path, "boot-1")
    cp.claims["u1"] = {}
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
        lambda doc: json.dumps({**doc, "claims": {"u1": {"tampered": True}}}),
        lambda doc: json.dumps({k: v for k, v in doc.items() if k != "claims"}),
    ],
)
def test_corruption_is_reported_and_kept(tmp_path: Path, damage: object) -> None:
    cp = Checkpoint(tmp_path, "b")
    cp.claims["u1"] = {"x": 1}
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


FIXTURES = Path(__file__).parent / "data" / "checkpoints"
"""One checkpoint per released format, as that version's code wrote it (boot ID ``boot-1``):
``v1.json`` by the current code, ``v1-without-optional-fields.json`` by a v1 writer that
predates a device's ``active_thread_percentage``, a GPU's ``cuda_driver_version`` and null
``share_id`` entries."""
FIXTURE_UIDS = {"0a000000-0000-4000-8000-00000000000a", "0b000000-0000-4000-8000-00000000000b"}
"""Their claims: ``0a..`` holds ``gpu-0-full-0`` (exclusive), ``0b..`` a 40Gi share of the
capacity device ``gpu-1`` (``MIXED_CONFIG``)."""


def _install(node: Node, doc: dict[str, Any]) -> None:
    node.state_dir.mkdir(parents=True, exist_ok=True)
    (node.state_dir / "checkpoint.json").write_text(json.dumps(doc))


def _ref(claim: dict[str, Any]) -> ClaimRef:
    m = claim["metadata"]
    return ClaimRef(m["namespace"], m["name"], m["uid"])


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.name)
def test_released_formats_load_and_their_claims_are_honoured(
    mixed_node: Node, fixture: Path
) -> None:
    node = mixed_node
    _install(node, json.loads(fixture.read_text()))
    driver = node.driver("boot-1")
    assert set(driver.checkpoint.claims) == FIXTURE_UIDS
    assert not list(node.state_dir.glob("checkpoint.json.corrupt-*"))
    assert {p.claim.uid for p in driver.prepared_plans()} == FIXTURE_UIDS
    exclusive = cf.claim([cf.result("gpu-0-full-0", NODE)])
    big_share = cf.claim([cf.result("gpu-1", NODE, share_id="c0ffee00", memory="120Gi")])
    for c in (exclusive, big_share):
        node.claims.add(c)
    out = driver.prepare([_ref(exclusive), _ref(big_share)])
    assert "already prepared for claim 0a000000" in out[exclusive["metadata"]["uid"]].error
    assert "more than the card's" in out[big_share["metadata"]["uid"]].error
    driver.close()


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
    driver = node.driver("boot-1")
    assert set(driver.checkpoint.claims) == FIXTURE_UIDS
    assert not list(node.state_dir.glob("checkpoint.json.corrupt-*"))
    driver.close()


def _shape(value: Any) -> Any:
    """The keys (recursively) and JSON types of a document, without its values."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value[:1]]
    return type(value).__name__


def test_the_current_writer_writes_the_v1_fixture_format(mixed_node: Node) -> None:
    """If this fails the format changed: bump ``checkpoint.VERSION``, migrate the old version
    and add a fixture written by the new code."""
    node = mixed_node
    fixture = json.loads((FIXTURES / "v1.json").read_text())
    made = [
        cf.claim(
            [cf.result("gpu-0-full-0", NODE)],
            namespace="team-a",
            name="train",
            uid="0a000000-0000-4000-8000-00000000000a",
        ),
        cf.claim(
            [
                cf.result(
                    "gpu-1", NODE, share_id="7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0d", memory="40Gi"
                )
            ],
            [cf.opaque(activeThreadPercentage=30)],
            namespace="team-b",
            name="infer",
            uid="0b000000-0000-4000-8000-00000000000b",
        ),
    ]
    for c in made:
        node.claims.add(c)
    driver = node.driver("boot-1")
    assert all(not o.error for o in driver.prepare([_ref(c) for c in made]).values())
    driver.close()
    written = json.loads((node.state_dir / "checkpoint.json").read_text())
    assert written["version"] == fixture["version"] == VERSION
    assert _shape(written) == _shape(fixture)
