"""Bad input and failures: each claim fails alone, nothing leaks, the plugin keeps going.

Each test reproduces a defect found by trying to break the plugin.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from urllib3.exceptions import MaxRetryError

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.enforce import MpsOptions, RecordingEnforcer
from dra_driver.model.plans import ClaimRef, plan_to_json
from dra_driver.prepare.checkpoint import Checkpoint, CheckpointCorrupt, _checksum
from tests.support import claimfactory as cf
from tests.support.node import NODE, Node


def ref(claim: dict[str, Any]) -> ClaimRef:
    m = claim["metadata"]
    return ClaimRef(m["namespace"], m["name"], m["uid"])


def spec_file(node: Node, claim: dict[str, Any]) -> Path:
    return node.cdi_root / f"{DEFAULT_DRIVER_NAME}-claim_{claim['metadata']['uid']}.json"


def on_disk(node: Node) -> set[str]:
    return set(json.loads((node.state_dir / "checkpoint.json").read_text())["claims"])


def test_failed_checkpoint_write_on_unprepare_keeps_the_claim_for_the_retry(node: Node) -> None:
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    preparation = node.preparation()
    uid = claim["metadata"]["uid"]
    assert preparation.prepare([ref(claim)])[uid].error == ""
    with mock.patch("dra_driver.infra.atomicfile.os.fsync", side_effect=OSError(28, "No space")):
        assert "checkpoint write" in preparation.unprepare([ref(claim)])[uid]
    assert uid in preparation.checkpoint.claims and uid in on_disk(node)
    assert preparation.unprepare([ref(claim)]) == {uid: ""}
    assert uid not in on_disk(node)
    preparation.close()
    restarted = node.preparation()
    assert restarted.checkpoint.claims == {}
    restarted.close()


def test_one_bad_claim_does_not_abort_the_batch(node: Node) -> None:
    good = cf.claim([node.share(0, "quarter")])
    huge = cf.claim([node.share(1, "quarter")], [cf.opaque(memoryLimit="1e5000")])
    no_request = cf.claim([node.share(1, "half")])
    del no_request["status"]["allocation"]["devices"]["results"][0]["request"]
    bad_opaque = cf.claim([node.share(1, "eighth")])
    bad_opaque["status"]["allocation"]["devices"]["config"] = [{"source": "FromClaim", "opaque": 7}]
    for c in (good, huge, no_request, bad_opaque):
        node.claims.add(c)
    preparation = node.preparation()
    out = preparation.prepare([ref(c) for c in (good, huge, no_request, bad_opaque)])
    assert out[good["metadata"]["uid"]].error == ""
    assert "larger than any GPU" in out[huge["metadata"]["uid"]].error
    assert "results[0].request: missing" in out[no_request["metadata"]["uid"]].error
    assert "config[0].opaque: expected an object" in out[bad_opaque["metadata"]["uid"]].error
    assert on_disk(node) == {good["metadata"]["uid"]}
    assert [p.name for p in node.cdi_root.iterdir()] == [spec_file(node, good).name]
    preparation.close()


def test_huge_exponent_is_refused_quickly(node: Node) -> None:
    claim = cf.claim([node.share(0, "quarter")], [cf.opaque(memoryLimit="1e1000000")])
    node.claims.add(claim)
    preparation = node.preparation()
    started = time.monotonic()
    assert (
        "larger than any GPU" in preparation.prepare([ref(claim)])[claim["metadata"]["uid"]].error
    )
    assert time.monotonic() - started < 2
    preparation.close()


class Unreachable:
    def read(self, namespace: str, name: str, timeout: float) -> Any:
        raise MaxRetryError(None, "/apis", "connection refused")  # type: ignore[arg-type]


def test_api_server_down_fails_new_claims_alone_and_serves_prepared_ones(node: Node) -> None:
    prepared = cf.claim([node.share(0, "quarter")])
    node.claims.add(prepared)
    preparation = node.preparation()
    assert preparation.prepare([ref(prepared)])[prepared["metadata"]["uid"]].error == ""
    preparation.reader = Unreachable()
    new = cf.claim([node.share(1, "quarter")])
    out = preparation.prepare([ref(prepared), ref(new)])
    assert out[prepared["metadata"]["uid"]].devices
    assert "connection refused" in out[new["metadata"]["uid"]].error
    preparation.close()


@pytest.mark.parametrize("content", ["null", "[]", "1", '"x"'])
def test_checkpoint_of_the_wrong_json_type_is_corrupt_not_a_crash(node: Node, content: str) -> None:
    node.state_dir.mkdir(parents=True)
    (node.state_dir / "checkpoint.json").write_text(content)
    preparation = node.preparation()
    assert preparation.checkpoint.claims == {}
    assert [p.read_text() for p in node.state_dir.glob("checkpoint.json.corrupt-*")] == [content]
    preparation.close()


def test_checksummed_record_without_a_plan_is_corrupt(tmp_path: Path) -> None:
    claims = {"u": {"namespace": "n", "name": "c", "devices": []}}
    doc = {"version": 1, "bootId": "b", "checksum": _checksum(claims), "claims": claims}
    (tmp_path / "checkpoint.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointCorrupt, match="record u.plan is missing"):
        Checkpoint(tmp_path, "b").load()


def test_plans_from_a_newer_version_still_load(node: Node) -> None:
    """A checkpoint written by a newer version (fields this one does not know, in the GPU and
    the device plan) is read by the checkpoint's own reader as the plan it holds."""
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    preparation = node.preparation()
    preparation.prepare([ref(claim)])
    [plan] = preparation.prepared_plans()
    preparation.close()
    path = node.state_dir / "checkpoint.json"
    doc = json.loads(path.read_text())
    [record] = doc["claims"].values()
    assert record["plan"] == json.loads(json.dumps(plan_to_json(plan)))
    record["plan"]["devices"][0]["gpu"]["futureField"] = 1
    record["plan"]["devices"][0]["futureField"] = 2
    doc["checksum"] = _checksum(doc["claims"])
    path.write_text(json.dumps(doc))
    reread = Checkpoint(node.state_dir, doc["bootId"])
    reread.load()
    assert [r.plan for r in reread.claims.values()] == [plan]


def test_corrupt_checkpoint_leaves_enforcement_alone(node: Node) -> None:
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    preparation = node.preparation()
    preparation.prepare([ref(claim)])
    preparation.close()
    (node.state_dir / "checkpoint.json").write_text("{broken")
    node.enforcer.calls.clear()
    again = node.preparation()
    assert [c for c in node.enforcer.calls if c[0] == "restore"] == []
    assert claim["metadata"]["uid"] in node.enforcer.applied
    assert spec_file(node, claim).exists()
    again.close()


def test_temp_files_of_killed_writes_are_swept(node: Node) -> None:
    node.cdi_root.mkdir(parents=True)
    node.state_dir.mkdir(parents=True)
    leftovers = [
        node.cdi_root / f".{DEFAULT_DRIVER_NAME}-claim_x.json.123.tmp",
        node.state_dir / ".checkpoint.json.456.tmp",
    ]
    for p in leftovers:
        p.write_text("{")
    node.preparation().close()
    assert not any(p.exists() for p in leftovers)


def test_duplicate_claim_in_one_request_is_applied_once(node: Node) -> None:
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    preparation = node.preparation()
    out = preparation.prepare([ref(claim), ref(claim)])
    assert out[claim["metadata"]["uid"]].error == ""
    assert [c for c in node.enforcer.calls if c[0] == "apply"] == [
        ("apply", claim["metadata"]["uid"])
    ]
    preparation.close()


def test_cdi_write_failure_names_the_cdi_root(node: Node) -> None:
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    preparation = node.preparation()
    with mock.patch(
        "dra_driver.prepare.cdispecs.write_atomic", side_effect=OSError(28, "No space left")
    ):
        error = preparation.prepare([ref(claim)])[claim["metadata"]["uid"]].error
    assert f"writing the CDI spec under {node.cdi_root} failed" in error
    assert claim["metadata"]["uid"] not in node.enforcer.applied
    preparation.close()


def prepare_both(node: Node, first: dict[str, Any], second: dict[str, Any]) -> str:
    """Prepare ``first`` then ``second`` in one call; ``first`` must succeed. Returns the
    second's error and checks that only the first is recorded."""
    for c in (first, second):
        node.claims.add(c)
    preparation = node.preparation()
    out = preparation.prepare([ref(first), ref(second)])
    preparation.close()
    assert out[first["metadata"]["uid"]].error == ""
    assert on_disk(node) == {first["metadata"]["uid"]}
    return out[second["metadata"]["uid"]].error


def test_one_share_in_two_claims_is_refused(node: Node) -> None:
    share = node.share(0, "full")
    error = prepare_both(node, cf.claim([share]), cf.claim([dict(share)]))
    assert f"share {share['shareID']} of device {share['device']} is already prepared" in error


@pytest.mark.parametrize(("first", "second"), [("full", "eighth"), ("half", "full")])
def test_product_shares_beyond_the_card_are_refused(node: Node, first: str, second: str) -> None:
    error = prepare_both(node, cf.claim([node.share(0, first)]), cf.claim([node.share(0, second)]))
    assert "more than the card's" in error


@pytest.mark.parametrize(
    ("first", "second"), [("time-slicing", "sm-sharing"), ("sm-sharing", "time-slicing")]
)
def test_a_gpu_never_carries_both_compute_modes(node: Node, first: str, second: str) -> None:
    error = prepare_both(
        node,
        cf.claim([node.share(0, "eighth", mode=first)]),
        cf.claim([node.share(0, "eighth", mode=second)]),
    )
    assert f"runs {first} claims" in error
    assert f"asks for {second}, and one GPU never carries both modes until its {first}" in error


def test_a_claim_asking_both_modes_on_one_gpu_is_told_so_not_named_as_its_own_holder(
    node: Node,
) -> None:
    """A mode mix inside one claim named the claim itself as the GPU's holder ("runs
    time-slicing claims (e.g. <its own uid>)") and ended "refusing to over-commit the GPU"."""
    good = cf.claim([node.share(1, "eighth")])
    both = cf.claim(
        [node.share(0, "eighth", mode="time-slicing"), node.share(0, "eighth", mode="sm-sharing")]
    )
    error = prepare_both(node, good, both)
    uid = both["metadata"]["uid"]
    assert error.startswith("not prepared: this claim asks for both time-slicing and sm-sharing")
    assert "on GPU 0" in error and "ask for one mode per GPU" in error
    assert uid not in error and "over-commit" not in error


def test_both_compute_modes_on_different_gpus_are_prepared(node: Node) -> None:
    claims = [
        cf.claim([node.share(0, "half", mode="time-slicing")]),
        cf.claim([node.share(1, "half", mode="sm-sharing")]),
    ]
    for c in claims:
        node.claims.add(c)
    preparation = node.preparation()
    out = preparation.prepare([ref(c) for c in claims])
    preparation.close()
    assert [o.error for o in out.values()] == ["", ""]
    assert on_disk(node) == {c["metadata"]["uid"] for c in claims}


def test_capacity_shares_beyond_the_card_are_refused(mixed_node: Node) -> None:
    node = mixed_node
    device = node.device(1, None)
    a = cf.claim(
        [cf.result(device, NODE, share_id="3f1c2b9a-0d4e-4c7b-9a51-5e2f8d6c7b10", memory="100Gi")]
    )
    b = cf.claim(
        [cf.result(device, NODE, share_id="7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0d", memory="100Gi")]
    )
    for c in (a, b):
        node.claims.add(c)
    preparation = node.preparation()
    out = preparation.prepare([ref(a), ref(b)])
    assert out[a["metadata"]["uid"]].error == ""
    assert "more than the card's" in out[b["metadata"]["uid"]].error
    preparation.close()


class _UnprepareFirst:
    """A prepare lock whose holder first lets a NodeUnprepareResources call of the same plugin
    run (it takes the real lock, then hands it on): the order two concurrent calls get when
    the Unprepare wins the lock."""

    def __init__(self, preparation: Any, claim: dict[str, Any]) -> None:
        self.preparation, self.claim, self.real = preparation, claim, preparation.lock
        self.path = self.real.path

    @contextmanager
    def held(self, timeout: float | None = None) -> Iterator[None]:
        self.preparation.lock = self.real
        assert self.preparation.unprepare([ref(self.claim)]) == {self.claim["metadata"]["uid"]: ""}
        with self.real.held(timeout):
            yield


def test_a_prepare_that_loses_the_lock_to_an_unprepare_of_this_plugin_says_so(
    node: Node,
) -> None:
    """A concurrent Prepare and Unprepare of one claim in one plugin reported "unprepared by
    another plugin instance"."""
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    preparation = node.preparation()
    assert preparation.prepare([ref(claim)])[claim["metadata"]["uid"]].error == ""
    preparation.lock = _UnprepareFirst(preparation, claim)
    error = preparation.prepare([ref(claim)])[claim["metadata"]["uid"]].error
    preparation.close()
    assert "unprepared by a NodeUnprepareResources call for it" in error
    assert "another" not in error and "not prepared now" in error
    assert on_disk(node) == set()


def test_a_pipe_directory_that_cannot_be_made_fails_the_claim_in_a_users_terms(
    node: Node,
) -> None:
    """The simulated enforcer's pipe directories under an unusable --mps-root: raw errno text."""
    root = node.root / "mps-root-file"
    root.write_text("a file where the MPS root goes\n")
    enforcer = RecordingEnforcer(options=MpsOptions(root=str(root)), make_dirs=True)
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    preparation = node.preparation(enforcer=enforcer)
    error = preparation.prepare([ref(claim)])[claim["metadata"]["uid"]].error
    preparation.close()
    assert "Errno" not in error and "(not a directory)" in error, error
    assert "the node's MPS directory" in error and "--mps-root" in error
    assert not (node.state_dir / "checkpoint.json").exists()  # nothing recorded
    assert list(node.cdi_root.glob("*.json")) == []
