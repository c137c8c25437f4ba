"""Checkpoint durability: versioned, checksummed, boot-scoped, corruption kept aside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_driver.checkpoint import Checkpoint, CheckpointCorrupt


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
