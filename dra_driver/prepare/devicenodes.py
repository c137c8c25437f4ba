"""The device nodes a claim's containers get, checked before a CDI spec names them.

containerd stats every ``deviceNodes`` host path of a CDI spec when it creates a container, so
a missing node fails the pod after Prepare answered success. NVIDIA's DRA driver had that bug
(kubernetes-sigs/dra-driver-nvidia-gpu #1380: on a fresh node ``/dev/nvidia*`` did not exist
yet; the nodes appear when nvidia-modprobe or the driver's installation makes them). So
Prepare refuses a claim whose GPU node (``/dev/nvidia<minor>``) or control nodes
(:data:`~dra_driver.model.cdi.CONTROL_DEVICE_NODES`) are missing. Only existence is checked (a
character device at the path is what a runtime needs; tests stand in plain files).
"""

from __future__ import annotations

from pathlib import Path

from dra_driver.gpus import Gpu
from dra_driver.model.cdi import CONTROL_DEVICE_NODES
from dra_driver.model.errors import PrepareError
from dra_driver.model.plans import ClaimPlan


def required_nodes(plan: ClaimPlan) -> list[tuple[str, Gpu, bool]]:
    """Pure: ``(container path, GPU, is the GPU's own node)`` for every node the claim's CDI
    devices list, each GPU once, its own node first."""
    out: list[tuple[str, Gpu, bool]] = []
    seen: set[str] = set()
    for d in plan.devices:
        if d.gpu.uuid in seen:
            continue
        seen.add(d.gpu.uuid)
        out.append((d.gpu.device_node, d.gpu, True))
        out.extend((path, d.gpu, False) for path in CONTROL_DEVICE_NODES)
    return out


def missing_node_message(path: str, gpu: Gpu, own: bool, root: Path) -> str:
    """Pure: the claim's error for a missing device node ``path`` (under ``root``)."""
    whose = f"of GPU {gpu.index}" if own else f"(needed with GPU {gpu.index}"
    close = f" ({gpu.uuid})" if own else f" ({gpu.uuid}))"
    return (
        f"device node {path} {whose}{close} does not exist under {root}: is the NVIDIA driver "
        "loaded? (its device nodes are made by nvidia-modprobe or the driver's installation)"
    )


def check_device_nodes(root: Path, plan: ClaimPlan) -> None:
    """Refuse ``plan`` when a device node it needs is missing under ``root``.

    Args:
        root: where the plugin sees the directory holding the host's ``dev/nvidia*`` nodes.
        plan: the claim's plan.

    Raises:
        PrepareError: naming the first missing node, its GPU (index and UUID) and ``root``.
    """
    for path, gpu, own in required_nodes(plan):
        if not (root / path.lstrip("/")).exists():
            raise PrepareError(missing_node_message(path, gpu, own, root))
