"""The node-side over-commit guard (pure): what the claims prepared on this node may hold
together, checked before a new claim is prepared (defence in depth: the scheduler never
allocates beyond it)."""

from __future__ import annotations

from collections.abc import Iterable

from dra_driver.model.plans import ClaimPlan
from dra_driver.model.quantities import canonical_quantity


def overcommit_error(plan: ClaimPlan, prepared: Iterable[ClaimPlan]) -> str | None:
    """Node-side defence against an allocation the scheduler should never make.

    The rules, per GPU: a device allocated without a share ID belongs to one claim at a time
    (no other claim gets it, with or without a share ID); the claims prepared on one GPU ask
    together for at most the card's memory; and they all run one compute mode (a GPU never
    carries both). Admin-access devices (monitoring) count for nothing. Returns the problem
    or None. ``prepared`` excludes ``plan``'s own claim.
    """
    exclusive: dict[str, str] = {}
    sharers: dict[str, str] = {}
    shares: dict[tuple[str, str], str] = {}
    memory: dict[str, int] = {}
    modes: dict[str, tuple[str, str]] = {}
    for other in prepared:
        for d in other.devices:
            if d.admin_access:  # monitoring access: the scheduler does not count it either
                continue
            if d.share_id is None:
                exclusive[d.device] = other.claim.uid
            else:
                sharers.setdefault(d.device, other.claim.uid)
                shares[(d.device, d.share_id)] = other.claim.uid
            memory[d.gpu.uuid] = memory.get(d.gpu.uuid, 0) + d.memory_request_bytes
            modes.setdefault(d.gpu.uuid, (d.compute_mode, other.claim.uid))
    for d in (d for d in plan.devices if not d.admin_access):
        holder = exclusive.get(d.device) or (sharers.get(d.device) if d.share_id is None else None)
        if holder is not None:
            return f"device {d.device} is already prepared for claim {holder}"
        if d.share_id is not None and (d.device, d.share_id) in shares:
            holder = shares[(d.device, d.share_id)]
            return f"share {d.share_id} of device {d.device} is already prepared for claim {holder}"
        mode, holder = modes.setdefault(d.gpu.uuid, (d.compute_mode, plan.claim.uid))
        if mode != d.compute_mode and holder == plan.claim.uid:
            return (
                f"this claim asks for both {mode} and {d.compute_mode} on GPU {d.gpu.index} "
                f"({d.gpu.uuid}; device {d.device} is {d.compute_mode}), and one GPU never "
                "carries both modes: ask for one mode per GPU (one device class, or a "
                "distinctAttribute constraint on the GPU's uuid)"
            )
        if mode != d.compute_mode:
            return (
                f"GPU {d.gpu.index} ({d.gpu.uuid}) runs {mode} claims (e.g. {holder}); device "
                f"{d.device} asks for {d.compute_mode}, and one GPU never carries both modes "
                f"until its {mode} claims end"
            )
        memory[d.gpu.uuid] = memory.get(d.gpu.uuid, 0) + d.memory_request_bytes
        if memory[d.gpu.uuid] > d.gpu.memory_bytes:
            return (
                f"GPU {d.gpu.index} ({d.gpu.uuid}): claims prepared on this node would request "
                f"{canonical_quantity(memory[d.gpu.uuid])}, more than the card's "
                f"{canonical_quantity(d.gpu.memory_bytes)}"
            )
    return None
