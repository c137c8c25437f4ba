"""What Prepare enforces for a claim: the claim's identity and, per allocated device, the GPU,
memory request and ceiling (bytes), compute mode and SM percentage. Records only; they are
decided by :mod:`dra_driver.prepare.plan` and kept in the checkpoint
(:mod:`dra_driver.prepare.checkpoint`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from dra_driver.model.gpu import Gpu
from dra_driver.model.vocabulary import ComputeMode


@dataclass(frozen=True)
class ClaimRef:
    """The claim identity the kubelet sends: namespace, name, UID."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class DevicePlan:
    """What to enforce for one allocated device (one fraction of one GPU).

    Attributes:
        request_names: the claim's request names this device satisfies.
        pool: ResourceSlice pool (the node name).
        device: device name in the ResourceSlice, e.g. ``gpu-0-time-slicing``.
        share_id: allocation ``shareID`` (consumable capacity) or None.
        gpu: the physical GPU.
        compute_mode: ``time-slicing`` | ``sm-sharing`` (the GPU's mode).
        memory_request_bytes: guaranteed memory (soft limit), bytes; 0 with admin access.
        memory_limit_bytes: ceiling (hard limit), bytes; request <= limit <= card memory; 0
            with admin access.
        active_thread_percentage: SM ceiling 1..100 (sm-sharing) or None (the node's
            default).
        admin_access: the request has ``adminAccess: true`` (monitoring access to the GPU:
            no MPS namespace, no memory; the scheduler does not count it either).
        max_consumers: how many containers may use the claim at once (``maxConsumers``,
            1..32); the ceiling and the request are divided among them (see
            ``docs/user-guide.md``, "Sharing a claim").
    """

    request_names: tuple[str, ...]
    pool: str
    device: str
    share_id: str | None
    gpu: Gpu
    compute_mode: ComputeMode
    memory_request_bytes: int
    memory_limit_bytes: int
    active_thread_percentage: int | None
    admin_access: bool = False
    max_consumers: int = 1

    @property
    def key(self) -> str:
        """A name unique within the claim: the device name plus the share ID if any."""
        return f"{self.device}-{self.share_id}" if self.share_id else self.device


@dataclass(frozen=True)
class ClaimPlan:
    """Everything Prepare enforces for one claim: its identity and its device plans."""

    claim: ClaimRef
    devices: tuple[DevicePlan, ...]


def with_current_gpus(plan: ClaimPlan, current: Mapping[str, Gpu]) -> ClaimPlan:
    """``plan`` with each device's GPU replaced by ``current[uuid]`` (the GPUs a discovery
    found, by UUID) where its device minor differs: after a driver reload renumbered the GPUs,
    the claim's CDI spec must name their new ``/dev/nvidia<minor>``. Returns ``plan`` itself
    when nothing differs (GPUs not found stay as recorded)."""
    devices = tuple(
        replace(d, gpu=current[d.gpu.uuid])
        if d.gpu.uuid in current and current[d.gpu.uuid].minor != d.gpu.minor
        else d
        for d in plan.devices
    )
    return plan if devices == plan.devices else replace(plan, devices=devices)


def plan_to_json(plan: ClaimPlan) -> dict[str, Any]:
    """Serialize a plan for the checkpoint (plain JSON types). ``admin_access`` is written only
    when true and ``max_consumers`` only above 1: records of ordinary claims keep the released
    v1 shape."""
    doc = asdict(plan)
    for device in doc["devices"]:
        if not device["admin_access"]:
            del device["admin_access"]
        if device["max_consumers"] == 1:
            del device["max_consumers"]
    return doc


@dataclass(frozen=True)
class PreparedDevice:
    """One entry of the NodePrepareResources reply: a device of the claim and the CDI device IDs
    (fully qualified) its containers get."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    share_id: str | None
    cdi_device_ids: tuple[str, ...]


def prepared_devices(plan: ClaimPlan, cdi_ids: Mapping[str, str]) -> tuple[PreparedDevice, ...]:
    """The reply rows of a prepared claim: one per device plan, with its CDI device ID from
    ``cdi_ids`` (device plan key -> ID, as :meth:`~dra_driver.prepare.cdispecs.CdiSpecs.write`
    returns them)."""
    return tuple(
        PreparedDevice(d.request_names, d.pool, d.device, d.share_id, (cdi_ids[d.key],))
        for d in plan.devices
    )
