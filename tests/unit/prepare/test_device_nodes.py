"""A claim is prepared only when the device nodes its CDI spec names exist on the node.

containerd stats every ``deviceNodes`` host path when it creates a container; a spec naming a
missing node fails the pod long after Prepare answered success (NVIDIA's DRA driver had this
bug: kubernetes-sigs/dra-driver-nvidia-gpu #1380, fresh nodes without /dev/nvidia*).
"""

from __future__ import annotations

from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.model.plans import ClaimRef
from dra_driver.prepare.preparation import PrepareOutcome
from tests.support import claimfactory as cf
from tests.support.node import Node


def _prepare(node: Node, *claims: dict[str, Any]) -> dict[str, PrepareOutcome]:
    for c in claims:
        node.claims.add(c)
    preparation = node.preparation()
    try:
        return preparation.prepare(
            ClaimRef(c["metadata"]["namespace"], c["metadata"]["name"], c["metadata"]["uid"])
            for c in claims
        )
    finally:
        preparation.close()


def _specs(node: Node) -> list[str]:
    return sorted(p.name for p in node.cdi_root.iterdir()) if node.cdi_root.is_dir() else []


def test_missing_gpu_node_fails_that_gpus_claim_and_leaves_nothing(node: Node) -> None:
    (node.device_root / "dev/nvidia1").unlink()
    bad = cf.claim([node.share(1, "quarter")])
    good = cf.claim([node.share(0, "quarter")])
    gpu1 = node.devices[node.device(1, "quarter")].gpu
    out = _prepare(node, bad, good)
    error = out[bad["metadata"]["uid"]].error
    assert error == (
        f"device node /dev/nvidia1 of GPU 1 ({gpu1.uuid}) does not exist under "
        f"{node.device_root}: is the NVIDIA driver loaded? (its device nodes are made by "
        "nvidia-modprobe or the driver's installation)"
    )
    good_uid = good["metadata"]["uid"]
    assert out[good_uid].error == ""
    assert _specs(node) == [f"{DEFAULT_DRIVER_NAME}-claim_{good_uid}.json"]
    assert list(node.enforcer.applied) == [good_uid]


def test_missing_control_node_fails_the_claim(node: Node) -> None:
    (node.device_root / "dev/nvidia-uvm").unlink()
    claim = cf.claim([node.share(1, "quarter")])
    gpu1 = node.devices[node.device(1, "quarter")].gpu
    error = _prepare(node, claim)[claim["metadata"]["uid"]].error
    assert error.startswith(
        f"device node /dev/nvidia-uvm (needed with GPU 1 ({gpu1.uuid})) does not exist under "
        f"{node.device_root}: is the NVIDIA driver loaded?"
    )
    assert _specs(node) == [] and node.enforcer.applied == {}
