"""One claim, two drivers (kubernetes-sigs/dra-driver-nvidia-gpu#1327, #435): the kubelet
passes the whole claim to every driver whose results it holds. A claim with a ``gpu-eighth``
share of ours and a result of another driver for a device named like ours, in a pool named like
ours, with that driver's opaque config: Prepare, the CDI spec, the checkpoint, the claim status
and the orphan sweep see only our result; the other one is neither refused nor recorded."""

from __future__ import annotations

import json
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.model.plans import ClaimRef
from dra_driver.prepare.orphans import Verdict, verdict
from tests.support import claimfactory as cf
from tests.support.node import NODE, Node

OTHER = "other.example.com"


def two_driver_claim(node: Node) -> dict[str, Any]:
    ours = node.share(0, "eighth", request="gpu")
    theirs = cf.result(ours["device"], NODE, request="nic", driver=OTHER)
    other_config = {
        "source": "FromClaim",
        "requests": ["nic"],
        "opaque": {"driver": OTHER, "parameters": {"kind": "Unknown to us", "mtu": 9000}},
    }
    return cf.on_node(cf.claim([ours, theirs], [other_config]), NODE)


def ref(claim: dict[str, Any]) -> ClaimRef:
    m = claim["metadata"]
    return ClaimRef(m["namespace"], m["name"], m["uid"])


def test_only_our_result_is_prepared_recorded_and_in_the_spec(node: Node) -> None:
    claim = two_driver_claim(node)
    node.claims.add(claim)
    preparation = node.preparation()
    uid = claim["metadata"]["uid"]
    outcome = preparation.prepare([ref(claim)])[uid]
    assert outcome.error == ""
    assert [(d.request_names, d.pool, d.device) for d in outcome.devices] == [
        (("gpu",), NODE, claim["status"]["allocation"]["devices"]["results"][0]["device"])
    ]
    record = preparation.checkpoint.claims[uid]
    assert [d.request_names for d in record.devices] == [("gpu",)]
    assert [d.device for d in record.plan.devices] == [outcome.devices[0].device]
    spec = json.loads(preparation.cdi.path(uid).read_text())
    assert len(spec["devices"]) == 1  # ours only
    assert OTHER not in json.dumps(spec)
    assert [d.device for d in node.enforcer.applied[uid].devices] == [outcome.devices[0].device]
    # the orphan sweep judges the claim by our result alone
    assert verdict(claim, uid, DEFAULT_DRIVER_NAME, NODE) == Verdict.LIVE
    assert preparation.unprepare([ref(claim)]) == {uid: ""}
    assert not preparation.cdi.path(uid).exists() and uid not in preparation.checkpoint.claims
    preparation.close()


def test_a_failed_prepare_rolls_back_only_ours(node: Node) -> None:
    """Our config is refused (a memory limit no card has): the claim fails with our message
    only, nothing of it is recorded, and the other driver's result is not named."""
    claim = two_driver_claim(node)
    claim["status"]["allocation"]["devices"]["config"].append(
        cf.opaque(requests=["gpu"], memoryLimit="1e5000")
    )
    node.claims.add(claim)
    preparation = node.preparation()
    uid = claim["metadata"]["uid"]
    outcome = preparation.prepare([ref(claim)])[uid]
    assert outcome.error and OTHER not in outcome.error and "nic" not in outcome.error
    assert uid not in preparation.checkpoint.claims
    assert not preparation.cdi.path(uid).exists()
    assert uid not in node.enforcer.applied
    preparation.close()
