"""Claims of one pod that share a GPU: made visible, since the runtime silently keeps one.

Two fraction claims on one GPU used by one container both mount ``/tmp/nvidia-mps`` and set
``NVIDIA_GPU_MEMORY_*`` and ``GPU_FRACTION_*``; the runtime keeps one mount and one value of
each, so the container gets one of the two fractions without an error (the rule: one fraction
per GPU per container, ``docs/user-guide.md``). Prepare does not see containers, and the
kubelet's reply has no place for a warning; what it sees is each claim's
``status.reservedFor``, the pods the claim is reserved for. So when a second claim of one pod
lands on a GPU that an earlier prepared claim of that pod uses, a structured warning naming
both claims is logged. Pods are remembered in memory only: after a plugin restart claims
prepared before it are not compared (the kubelet prepares a pod's claims in one call, so this
is rare).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from dra_driver.model.plans import ClaimPlan

log = structlog.get_logger(__name__)


def reserved_pods(claim: Mapping[str, Any]) -> dict[str, str]:
    """Pure: pod UID -> pod name of the claim's ``status.reservedFor`` entries for pods
    (``resource: pods`` in the core API group); anything malformed is ignored."""
    status = claim.get("status")
    entries = status.get("reservedFor") if isinstance(status, Mapping) else None
    if not isinstance(entries, list):
        return {}
    pods = {}
    for e in entries:
        if not isinstance(e, Mapping) or e.get("resource") != "pods" or e.get("apiGroup"):
            continue
        uid, name = e.get("uid"), e.get("name")
        if isinstance(uid, str) and uid:
            pods[uid] = name if isinstance(name, str) else ""
    return pods


@dataclass(frozen=True)
class SharedGpu:
    """An earlier prepared claim of the same pod on the same GPU."""

    other: ClaimPlan
    pod_uid: str
    pod_name: str
    gpu_uuid: str
    gpu_index: int


def shared_gpus(
    plan: ClaimPlan,
    pods: Mapping[str, str],
    others: Mapping[str, tuple[Mapping[str, str], ClaimPlan]],
) -> list[SharedGpu]:
    """Pure: every (other claim, pod, GPU) where ``plan`` and a claim in ``others`` (claim UID
    -> (its pods, its plan)) are reserved for one pod and use one GPU."""
    gpus = {d.gpu.uuid: d.gpu for d in plan.devices}
    out: list[SharedGpu] = []
    for uid, (other_pods, other) in others.items():
        if uid == plan.claim.uid:
            continue
        common = [p for p in pods if p in other_pods]
        on = sorted({d.gpu.uuid for d in other.devices} & gpus.keys())
        out.extend(SharedGpu(other, p, pods[p], u, gpus[u].index) for p in common for u in on)
    return out


class PodClaims:
    """The pods of each prepared claim; used under the driver's prepare lock."""

    def __init__(self) -> None:
        self._claims: dict[str, tuple[Mapping[str, str], ClaimPlan]] = {}

    def add(self, claim: Mapping[str, Any], plan: ClaimPlan) -> list[SharedGpu]:
        """Remember the prepared claim (API JSON and plan); warn about, and return, the GPUs
        it shares with an earlier claim of one of its pods."""
        pods = reserved_pods(claim)
        found = shared_gpus(plan, pods, self._claims)
        ref = plan.claim
        for s in found:
            log.warning(
                "two claims of one pod on one GPU: a container that uses both gets only one "
                "fraction's MPS pipe and memory limits (one fraction per GPU per container)",
                claim_uid=ref.uid,
                namespace=ref.namespace,
                name=ref.name,
                other_claim_uid=s.other.claim.uid,
                other_namespace=s.other.claim.namespace,
                other_name=s.other.claim.name,
                pod_uid=s.pod_uid,
                pod=s.pod_name,
                gpu=s.gpu_uuid,
                gpu_index=s.gpu_index,
            )
        self._claims[ref.uid] = (pods, plan)
        return found

    def forget(self, claim_uid: str) -> None:
        """Drop an unprepared claim (idempotent)."""
        self._claims.pop(claim_uid, None)
