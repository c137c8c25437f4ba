"""A simulated enforcer for GPU-free nodes: records calls, returns realistic CDI edits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dra_driver.cdi import ContainerEdits, Mount
from dra_driver.gpus import MIB
from dra_driver.mps.base import MpsError
from dra_driver.prepare import ClaimPlan, DevicePlan

PIPE_ROOT = "/run/gpu-fraction/mps"
"""Host directory under which each claim gets its MPS pipe directory."""
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
"""Where the claim's pipe directory appears inside the container."""


def claim_edits(plan: ClaimPlan, device: DevicePlan, pipe_root: str = PIPE_ROOT) -> ContainerEdits:
    """Env and mounts that bind a container to its claim's MPS namespace and limits.

    Memory values are whole MiB (``NVIDIA_GPU_MEMORY_REQUEST``/``_LIMIT`` are read by the
    NVIDIA container toolkit's apply-cuda-memory-limits hook; see mps-notes 6.1).
    """
    env = [
        f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}",
        f"NVIDIA_GPU_MEMORY_REQUEST={device.memory_request_bytes // MIB}",
        f"NVIDIA_GPU_MEMORY_LIMIT={device.memory_limit_bytes // MIB}",
        f"GPU_FRACTION_COMPUTE_MODE={device.compute_mode}",
    ]
    if device.active_thread_percentage is not None:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={device.active_thread_percentage}")
    host_dir = f"{pipe_root}/{plan.claim.uid}"
    return ContainerEdits(env=tuple(env), mounts=(Mount(host_dir, CONTAINER_PIPE_DIR),))


@dataclass
class RecordingEnforcer:
    """Records ``apply``/``release``/``restore`` calls; ``applied`` maps claim UID -> plan."""

    applied: dict[str, ClaimPlan] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    fail_for: set[str] = field(default_factory=set)
    """Claim UIDs whose ``apply`` raises (to test failure isolation)."""

    def apply(self, plan: ClaimPlan) -> Mapping[str, ContainerEdits]:
        """Record the plan and return per-device edits; raise MpsError for ``fail_for``."""
        self.calls.append(("apply", plan.claim.uid))
        if plan.claim.uid in self.fail_for:
            raise MpsError(f"simulated MPS failure for claim {plan.claim.uid}")
        self.applied[plan.claim.uid] = plan
        return {d.key: claim_edits(plan, d) for d in plan.devices}

    def release(self, claim_uid: str) -> None:
        """Forget the claim (idempotent)."""
        self.calls.append(("release", claim_uid))
        self.applied.pop(claim_uid, None)

    def restore(self, plans: Sequence[ClaimPlan]) -> None:
        """Re-record every plan."""
        self.calls.append(("restore", str(len(plans))))
        for plan in plans:
            self.applied[plan.claim.uid] = plan
