"""Claims that never get their Unprepare (kubernetes-sigs/dra-driver-nvidia-gpu#1278, #840):
the orphan sweep releases a prepared claim whose claim is gone or no longer allocated here
once two sweeps agree, and leaves live claims, claims it cannot read and claims whose
containers still run alone."""

from __future__ import annotations

import copy
import uuid
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.infra.metrics import Metrics
from dra_driver.model.plans import ClaimRef
from dra_driver.prepare.claims import ClaimReadTimeout
from dra_driver.prepare.orphans import OrphanSweep, Verdict, due, verdict
from dra_driver.prepare.preparation import ClaimPreparation
from tests.support import claimfactory as cf
from tests.support.node import NODE, Node

DRIVER = DEFAULT_DRIVER_NAME


def ref(claim: dict[str, Any]) -> ClaimRef:
    m = claim["metadata"]
    return ClaimRef(m["namespace"], m["name"], m["uid"])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sweep_of(
    node: Node, preparation: ClaimPreparation, clock: Clock, running: set[str] | None = None
) -> OrphanSweep:
    return OrphanSweep(
        preparation,
        preparation.prepared_refs,
        preparation.reader,
        lambda uid: uid in (running or set()),
        DRIVER,
        NODE,
        Metrics(),
        confirm=30.0,
        clock=clock,
    )


def prepared(node: Node, preparation: ClaimPreparation, gpu: int = 0) -> dict[str, Any]:
    claim = cf.claim([node.share(gpu, "eighth")])
    node.claims.add(claim)
    assert preparation.prepare([ref(claim)])[claim["metadata"]["uid"]].error == ""
    return claim


def released(sweep: OrphanSweep) -> int:
    return sum(
        s.value
        for m in sweep.metrics.registry.collect()
        if m.name == "dra_gpu_fraction_orphaned_claims_released"
        for s in m.samples
        if s.name.endswith("_total")
    )


def test_verdict_of_a_claim_read() -> None:
    uid = str(uuid.uuid4())
    ours = cf.claim([cf.result("gpu-0-time-slicing", NODE)], uid=uid)
    assert verdict(ours, uid, DRIVER, NODE) == Verdict.LIVE
    assert verdict(None, uid, DRIVER, NODE) == Verdict.GONE
    assert verdict(ours, str(uuid.uuid4()), DRIVER, NODE) == Verdict.GONE  # same name, new claim
    elsewhere = cf.claim([cf.result("gpu-0-time-slicing", "node-b")], uid=uid)
    assert verdict(elsewhere, uid, DRIVER, NODE) == Verdict.NOT_ALLOCATED_HERE
    other_driver = cf.claim([cf.result("gpu-0-time-slicing", NODE, driver="x.example")], uid=uid)
    assert verdict(other_driver, uid, DRIVER, NODE) == Verdict.NOT_ALLOCATED_HERE
    deallocated = copy.deepcopy(ours)
    deallocated["status"] = {}
    assert verdict(deallocated, uid, DRIVER, NODE) == Verdict.NOT_ALLOCATED_HERE


def test_due_needs_two_sightings_confirm_apart() -> None:
    release, seen = due({}, ["a", "b"], 100.0, 30.0)
    assert release == [] and seen == {"a": 100.0, "b": 100.0}
    release, seen = due(seen, ["a"], 120.0, 30.0)  # b is live again: forgotten
    assert release == [] and seen == {"a": 100.0}
    release, seen = due(seen, ["a", "b"], 130.0, 30.0)
    assert release == ["a"] and seen == {"a": 100.0, "b": 130.0}


def test_a_deleted_claim_is_released_completely_after_two_sweeps(node: Node) -> None:
    preparation = node.preparation()
    clock = Clock()
    live = prepared(node, preparation, gpu=0)
    gone = prepared(node, preparation, gpu=1)
    uid = gone["metadata"]["uid"]
    del node.claims.claims[(gone["metadata"]["namespace"], gone["metadata"]["name"])]
    sweep = sweep_of(node, preparation, clock)
    assert sweep.sweep() == ([], True)  # first sighting: not yet
    assert uid in preparation.checkpoint.claims
    clock.now += 30
    assert sweep.sweep() == ([uid], False)
    assert uid not in preparation.checkpoint.claims
    assert not (node.cdi_root / f"{DRIVER}-claim_{uid}.json").exists()
    assert ("release", uid) in node.enforcer.calls and uid not in node.enforcer.applied
    assert live["metadata"]["uid"] in preparation.checkpoint.claims
    assert released(sweep) == 1
    preparation.close()
    restarted = node.preparation()  # released on disk too
    assert set(restarted.checkpoint.claims) == {live["metadata"]["uid"]}
    restarted.close()


def test_a_claim_that_never_existed_is_released(node: Node) -> None:
    """A checkpoint entry for a claim the API server never had (planted, or a record of an
    earlier cluster): the read is 404 from the start."""
    preparation = node.preparation()
    clock = Clock()
    claim = prepared(node, preparation)
    node.claims.claims.clear()
    sweep = sweep_of(node, preparation, clock)
    sweep.sweep()
    clock.now += 31
    assert sweep.sweep()[0] == [claim["metadata"]["uid"]]
    assert preparation.checkpoint.claims == {}
    preparation.close()


def test_a_claim_allocated_elsewhere_is_released_and_a_live_one_kept(node: Node) -> None:
    preparation = node.preparation()
    clock = Clock()
    moved = prepared(node, preparation, gpu=0)
    pending = prepared(node, preparation, gpu=1)  # its pod is still Pending: allocated, live
    moved_now = copy.deepcopy(moved)
    moved_now["status"]["allocation"]["devices"]["results"][0]["pool"] = "node-b"
    node.claims.add(moved_now)
    sweep = sweep_of(node, preparation, clock)
    sweep.sweep()
    clock.now += 30
    assert sweep.sweep()[0] == [moved["metadata"]["uid"]]
    assert set(preparation.checkpoint.claims) == {pending["metadata"]["uid"]}
    preparation.close()


def test_a_claim_whose_container_still_runs_is_kept(node: Node) -> None:
    preparation = node.preparation()
    clock = Clock()
    claim = prepared(node, preparation)
    uid = claim["metadata"]["uid"]
    node.claims.claims.clear()
    running = {uid}
    sweep = sweep_of(node, preparation, clock, running)
    for _ in range(3):
        assert sweep.sweep() == ([], False)
        clock.now += 60
    assert uid in preparation.checkpoint.claims
    running.clear()  # the container ended (the kubelet lost its pod)
    sweep.sweep()
    clock.now += 30
    assert sweep.sweep()[0] == [uid]
    preparation.close()


def test_an_unreadable_claim_is_kept(node: Node) -> None:
    preparation = node.preparation()
    clock = Clock()
    claim = prepared(node, preparation)
    sweep = sweep_of(node, preparation, clock)
    sweep.reader = Unanswered()
    for _ in range(3):
        assert sweep.sweep() == ([], False)
        clock.now += 60
    assert claim["metadata"]["uid"] in preparation.checkpoint.claims
    preparation.close()


class Unanswered:
    """A claim reader whose API server does not answer."""

    def read(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        raise ClaimReadTimeout(f"reading claim {namespace}/{name} timed out after 5 s")


def test_a_claim_allocated_here_again_before_release_is_kept(node: Node) -> None:
    """A claim shared by pods is deallocated (both sweeps see it not allocated here), then
    allocated to this node again with the same UID and prepared (answered from its record):
    the last read under the prepare lock sees it live, and nothing is released."""
    preparation = node.preparation()
    clock = Clock()
    claim = prepared(node, preparation)
    uid = claim["metadata"]["uid"]
    deallocated = copy.deepcopy(claim)
    deallocated["status"] = {}
    node.claims.add(deallocated)
    sweep = sweep_of(node, preparation, clock)
    first = sweep.orphaned

    reads = []

    def orphaned_until_release(r: ClaimRef) -> Verdict | None:
        reads.append(r.uid)
        if len(reads) == 2:  # the second sweep's read; before the last one, it comes back
            node.claims.add(claim)
            return Verdict.NOT_ALLOCATED_HERE
        return first(r)

    sweep.orphaned = orphaned_until_release  # type: ignore[method-assign]
    sweep.sweep()
    clock.now += 30
    assert sweep.sweep() == ([], False)
    assert len(reads) == 3  # two sweeps and the last read under the lock
    assert uid in preparation.checkpoint.claims
    assert released(sweep) == 0
    preparation.close()
