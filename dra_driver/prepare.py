"""Pure planning for NodePrepareResources: claim + allocation + node facts -> what to enforce.

No I/O here. :func:`plan_claim` turns the ResourceClaim (API JSON, as read from the API
server) into a :class:`ClaimPlan`: for each device allocated to this driver on this node,
the GPU, the memory request and ceiling (bytes), the compute mode and the SM percentage.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from decimal import InvalidOperation
from typing import Any

from kubernetes.utils import parse_quantity

from dra_driver.config import canonical_quantity
from dra_driver.gpus import Gpu
from dra_driver.ids import PrepareError, validate_uid
from dra_driver.params import MAX_BYTES, ClaimParameters, ParameterError, parse_parameters
from dra_driver.slices import FractionDevice

__all__ = [
    "ClaimPlan",
    "ClaimRef",
    "DevicePlan",
    "PrepareError",
    "overcommit_error",
    "plan_claim",
    "plan_from_json",
    "plan_to_json",
    "validate_uid",
]

_SHARE_ID = re.compile(r"^[0-9a-z]([0-9a-z-]{0,61}[0-9a-z])?$")


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
        device: device name in the ResourceSlice, e.g. ``gpu-0-quarter-2``.
        share_id: allocation ``shareID`` (consumable capacity) or None.
        gpu: the physical GPU.
        compute_mode: ``time-slicing`` | ``sm-sharing`` (the GPU's mode).
        memory_request_bytes: guaranteed memory (soft limit), bytes.
        memory_limit_bytes: ceiling (hard limit), bytes; request <= limit <= card memory.
        active_thread_percentage: SM ceiling 1..100 (sm-sharing) or None.
    """

    request_names: tuple[str, ...]
    pool: str
    device: str
    share_id: str | None
    gpu: Gpu
    compute_mode: str
    memory_request_bytes: int
    memory_limit_bytes: int
    active_thread_percentage: int | None

    @property
    def key(self) -> str:
        """A name unique within the claim: the device name plus the share ID if any."""
        return f"{self.device}-{self.share_id}" if self.share_id else self.device


@dataclass(frozen=True)
class ClaimPlan:
    """Everything Prepare enforces for one claim: its identity and its device plans."""

    claim: ClaimRef
    devices: tuple[DevicePlan, ...]


def _applies(config: Mapping[str, Any], request: str) -> bool:
    requests = config.get("requests") or []
    parent = request.split("/", 1)[0]
    return not requests or request in requests or parent in requests


def _parameters_for(configs: list[Mapping[str, Any]], request: str, driver: str) -> ClaimParameters:
    ordered = sorted(
        enumerate(configs), key=lambda item: (item[1].get("source") != "FromClass", item[0])
    )
    params = ClaimParameters()
    for index, config in ordered:
        opaque = config.get("opaque") or {}
        if opaque.get("driver") != driver or not _applies(config, request):
            continue
        source = "class" if config.get("source") == "FromClass" else "claim"
        where = f"{source} config #{index} for request {request!r}"
        params = params.merged(parse_parameters(opaque.get("parameters"), where))
    return params


def _consumed_memory(result: Mapping[str, Any]) -> int | None:
    raw = (result.get("consumedCapacity") or {}).get("memory")
    if raw is None:
        return None
    try:
        q = parse_quantity(raw)
    except (ValueError, TypeError, InvalidOperation) as exc:
        raise PrepareError(f"consumedCapacity.memory {raw!r} is not a quantity") from exc
    if not 0 <= q <= MAX_BYTES:
        raise PrepareError(f"consumedCapacity.memory {raw!r} is out of range")
    return int(q)


def _plan_device(
    result: Mapping[str, Any],
    fraction: FractionDevice,
    params: ClaimParameters,
) -> DevicePlan:
    gpu = fraction.gpu
    where = f"device {fraction.name} (GPU {gpu.index}, {gpu.uuid})"
    if params.compute_mode and params.compute_mode != fraction.compute_mode:
        raise PrepareError(
            f"{where} runs compute mode {fraction.compute_mode}; the claim asks for "
            f"{params.compute_mode}. Use a DeviceClass or selector for {params.compute_mode} GPUs"
        )
    if params.active_thread_percentage is not None and fraction.compute_mode != "sm-sharing":
        raise PrepareError(
            f"{where}: activeThreadPercentage needs compute mode sm-sharing; "
            f"this GPU runs {fraction.compute_mode}"
        )
    request = fraction.memory_bytes
    if fraction.fraction_model == "capacity":
        consumed = _consumed_memory(result)
        request = consumed if consumed is not None else fraction.memory_bytes
    card = gpu.memory_bytes
    if params.memory_limit_bytes is not None:
        limit = params.memory_limit_bytes
    elif params.memory_limit_portion is not None:
        limit = int(card * params.memory_limit_portion)
    else:
        limit = request
    if limit < request:
        raise PrepareError(
            f"{where}: memory limit {canonical_quantity(limit)} is below the request "
            f"{canonical_quantity(request)}; raise memoryLimit/memoryLimitPortion or pick a "
            "smaller product"
        )
    if limit > card:
        raise PrepareError(
            f"{where}: memory limit {canonical_quantity(limit)} exceeds the card's "
            f"{canonical_quantity(card)}"
        )
    return DevicePlan(
        request_names=(str(result["request"]),),
        pool=str(result["pool"]),
        device=fraction.name,
        share_id=result.get("shareID"),
        gpu=gpu,
        compute_mode=fraction.compute_mode,
        memory_request_bytes=request,
        memory_limit_bytes=limit,
        active_thread_percentage=params.active_thread_percentage,
    )


def _checked_allocation(allocation: Any, where: str) -> Mapping[str, Any]:
    """``allocation.devices`` after checking the shapes Prepare relies on.

    Raises:
        PrepareError: a result without string request/driver/pool/device, or a config entry
            whose ``opaque`` or ``requests`` has the wrong type.
    """
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    if devices is None:
        return {}
    bad = PrepareError(f"{where}: status.allocation.devices is malformed")
    if not isinstance(devices, Mapping):
        raise bad
    results = devices.get("results") or []
    configs = devices.get("config") or []
    if not isinstance(results, list) or not isinstance(configs, list):
        raise bad
    for r in results:
        keys = ("request", "driver", "pool", "device")
        if not isinstance(r, Mapping) or not all(isinstance(r.get(k), str) for k in keys):
            raise bad
    for c in configs:
        if not isinstance(c, Mapping):
            raise bad
        if not isinstance(c.get("opaque") or {}, Mapping):
            raise bad
        if not isinstance(c.get("requests") or [], list):
            raise bad
    return {"results": results, "config": configs}


def overcommit_error(plan: ClaimPlan, prepared: Iterable[ClaimPlan]) -> str | None:
    """Node-side defence against an allocation that over-commits a device.

    The scheduler never does this; a bug or a hand-written allocation could. A device
    without a share ID belongs to one claim at a time; the shares of one consumable-capacity
    device may not request more memory together than the card has. Returns the problem or
    None. ``prepared`` excludes ``plan``'s own claim.
    """
    exclusive: dict[str, str] = {}
    shared: dict[str, int] = {}
    for other in prepared:
        for d in other.devices:
            if d.share_id is None:
                exclusive[d.device] = other.claim.uid
            else:
                shared[d.device] = shared.get(d.device, 0) + d.memory_request_bytes
    for d in plan.devices:
        if d.share_id is None and d.device in exclusive:
            return f"device {d.device} is already prepared for claim {exclusive[d.device]}"
        if d.share_id is not None:
            shared[d.device] = shared.get(d.device, 0) + d.memory_request_bytes
            if shared[d.device] > d.gpu.memory_bytes:
                return (
                    f"device {d.device}: shares prepared on this node would request "
                    f"{canonical_quantity(shared[d.device])}, more than the card's "
                    f"{canonical_quantity(d.gpu.memory_bytes)}"
                )
    return None


def plan_claim(
    ref: ClaimRef,
    claim: Mapping[str, Any],
    driver: str,
    pool: str,
    devices: Mapping[str, FractionDevice],
) -> ClaimPlan:
    """Decide what to enforce for one claim.

    Args:
        ref: namespace/name/UID the kubelet asked for.
        claim: the ResourceClaim as API JSON (``metadata``, ``status.allocation``).
        driver: our driver name; results of other drivers are ignored.
        pool: our pool name (the node name).
        devices: this node's fraction devices by name (from ``slices.plan_devices``).

    Raises:
        PrepareError: UID mismatch or malformed, not allocated, no results for this driver,
            a result for another pool or an unknown device, a bad share ID, malformed or
            contradictory parameters (limit below request or above the card, a mode other
            than the GPU's, an SM percentage on a time-slicing GPU).
    """
    validate_uid(ref.uid)
    meta = claim.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        raise PrepareError(
            f"claim {ref.namespace}/{ref.name} has UID {meta.get('uid')!r}, kubelet asked for "
            f"{ref.uid!r} (the claim was deleted and recreated); the pod must be recreated"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise PrepareError(f"claim {ref.namespace}/{ref.name} is not allocated")
    alloc_devices = _checked_allocation(allocation, f"claim {ref.namespace}/{ref.name}")
    results = [r for r in alloc_devices.get("results", []) if r.get("driver") == driver]
    if not results:
        raise PrepareError(
            f"claim {ref.namespace}/{ref.name} has no allocation results for driver {driver}"
        )
    configs = list(alloc_devices.get("config", []))
    plans: dict[tuple[str, str | None], DevicePlan] = {}
    for result in results:
        name = str(result.get("device", ""))
        if result.get("pool") != pool:
            raise PrepareError(
                f"device {result.get('pool')}/{name} is not on this node (pool {pool})"
            )
        fraction = devices.get(name)
        if fraction is None:
            raise PrepareError(
                f"device {name} is not on this node any more (GPU removed or reconfigured)"
            )
        share_id = result.get("shareID")
        if share_id is not None and not _SHARE_ID.match(str(share_id)):
            raise PrepareError(f"device {name}: shareID {share_id!r} is malformed")
        try:
            params = _parameters_for(configs, str(result["request"]), driver)
        except ParameterError as exc:
            raise PrepareError(str(exc)) from exc
        plan = _plan_device(result, fraction, params)
        key = (plan.device, plan.share_id)
        if key in plans:
            previous = plans[key]
            plan = DevicePlan(
                **{
                    **previous.__dict__,
                    "request_names": previous.request_names + plan.request_names,
                }
            )
        plans[key] = plan
    return ClaimPlan(claim=ref, devices=tuple(plans.values()))


def plan_to_json(plan: ClaimPlan) -> dict[str, Any]:
    """Serialize a plan for the checkpoint (plain JSON types)."""
    return asdict(plan)


def _known(cls: type, doc: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``doc`` that are fields of dataclass ``cls`` (fields added by a newer
    version are ignored, so a checkpoint survives a downgrade)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in doc.items() if k in names}


def plan_from_json(doc: Mapping[str, Any]) -> ClaimPlan:
    """Inverse of :func:`plan_to_json`.

    Raises:
        KeyError, TypeError, AttributeError: when ``doc`` is not a serialized plan.
    """
    devices = tuple(
        DevicePlan(
            **{
                **_known(DevicePlan, d),
                "request_names": tuple(d["request_names"]),
                "gpu": Gpu(**_known(Gpu, d["gpu"])),
            }
        )
        for d in doc["devices"]
    )
    return ClaimPlan(claim=ClaimRef(**_known(ClaimRef, doc["claim"])), devices=devices)
