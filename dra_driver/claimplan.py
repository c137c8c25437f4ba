"""Pure planning for NodePrepareResources: claim + allocation + node facts -> what to enforce.

No I/O here. :func:`plan_claim` turns the ResourceClaim (API JSON, as read from the API
server) into a :class:`ClaimPlan`: for each device allocated to this driver on this node,
the GPU, the memory request and ceiling (bytes), the compute mode and the SM percentage.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from fractions import Fraction
from typing import Any

from dra_driver.apijson import Field
from dra_driver.devices import FractionDevice, product_memory_bytes
from dra_driver.gpus.model import Gpu
from dra_driver.ids import DNS_LABEL, DNS_LABEL_RULE, PrepareError, is_dns_label, validate_uid
from dra_driver.params import ClaimParameters, parse_parameters, quantity_bytes
from dra_driver.quantities import QuantityError, canonical_quantity, quantity_decimal
from dra_driver.textlimits import shown
from dra_driver.vocabulary import ComputeMode, FractionModel

__all__ = [
    "ClaimPlan",
    "ClaimRef",
    "DevicePlan",
    "PrepareError",
    "plan_claim",
    "plan_from_json",
    "plan_to_json",
    "validate_uid",
]

_REQUEST_NAME = re.compile(f"{DNS_LABEL.pattern}(/{DNS_LABEL.pattern})?")
"""A request name, or ``<request>/<subrequest>`` (each an RFC 1123 label)."""
CONFIG_SOURCES = ("FromClass", "FromClaim")


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


@dataclass(frozen=True)
class AllocationResult:
    """One entry of ``status.allocation.devices.results`` for our driver, type-checked.

    Attributes:
        path: where it is in the claim, for messages.
        request: request name (``<request>`` or ``<request>/<subrequest>``).
        pool: pool name as allocated.
        device: device name as allocated.
        share_id: ``shareID`` (which share of a device that allows multiple allocations).
        consumed_memory: ``consumedCapacity.memory`` (a quantity string) or None.
        consumed_slots: ``consumedCapacity.slots`` (a quantity string) or None.
    """

    path: str
    request: str
    pool: str
    device: str
    share_id: str | None
    consumed_memory: str | None
    consumed_slots: str | None = None


@dataclass(frozen=True)
class DeviceConfig:
    """One entry of ``status.allocation.devices.config`` for our driver, type-checked.

    Attributes:
        index: position in the list (messages name it).
        from_class: ``source`` is ``FromClass`` (else ``FromClaim``).
        requests: the requests it applies to (empty: all).
        parameters: the raw ``opaque.parameters`` (checked by :func:`parse_parameters`).
    """

    index: int
    from_class: bool
    requests: tuple[str, ...]
    parameters: Any


def _applies(config: DeviceConfig, request: str) -> bool:
    parent = request.split("/", 1)[0]
    return not config.requests or request in config.requests or parent in config.requests


def _parameters_for(configs: list[DeviceConfig], request: str) -> ClaimParameters:
    params = ClaimParameters()
    for config in sorted(configs, key=lambda c: (not c.from_class, c.index)):
        if not _applies(config, request):
            continue
        source = "class" if config.from_class else "claim"
        where = f"{source} config #{config.index} for request {request!r}"
        params = params.merged(parse_parameters(config.parameters, where))
    return params


def _result(field: Field) -> AllocationResult:
    """Type-check one allocation result of our driver."""
    request = field["request"].string()
    if not _REQUEST_NAME.fullmatch(request):
        raise field["request"].error(
            f"{shown(request)} is not a request name (a DNS label, or <request>/<subrequest>)"
        )
    share = field["shareID"]
    share_id = share.optional_string()
    if share_id is not None and not is_dns_label(share_id):
        raise share.error(f"{shown(share_id)} is not a DNS label ({DNS_LABEL_RULE})")
    return AllocationResult(
        path=field.path,
        request=request,
        pool=field["pool"].string(),
        device=field["device"].string(),
        share_id=share_id,
        consumed_memory=field["consumedCapacity"]["memory"].optional_string(),
        consumed_slots=field["consumedCapacity"]["slots"].optional_string(),
    )


def _config(field: Field, index: int, driver: str) -> DeviceConfig | None:
    """Type-check one config entry; None when it is not for ``driver``."""
    source = field["source"].string()
    if source not in CONFIG_SOURCES:
        raise field["source"].error(f"{shown(source)} must be FromClass or FromClaim")
    requests = tuple(r.string() for r in field["requests"].items())
    opaque = field["opaque"]
    if opaque.absent or opaque["driver"].string() != driver:
        return None
    return DeviceConfig(index, source == "FromClass", requests, opaque["parameters"].raw)


def _allocation(
    claim: Field, driver: str
) -> tuple[list[AllocationResult], list[DeviceConfig]] | None:
    """Our driver's results and configs; None when the claim is not allocated.

    Raises:
        PrepareError: a field on the way has the wrong JSON type or is malformed.
    """
    allocation = claim["status"]["allocation"]
    if allocation.absent or not allocation.object():
        return None
    devices = allocation["devices"]
    results = [_result(r) for r in devices["results"].items() if r["driver"].string() == driver]
    configs = [_config(c, i, driver) for i, c in enumerate(devices["config"].items())]
    return results, [c for c in configs if c is not None]


def _consumed_memory(result: AllocationResult) -> int | None:
    if result.consumed_memory is None:
        return None
    return quantity_bytes(result.consumed_memory, f"{result.path}.consumedCapacity.memory")


def _requested_memory(result: AllocationResult, fraction: FractionDevice) -> int:
    """Bytes the allocation gives the claim on ``fraction``: its consumed ``slots`` as a share
    of the card (products; rounded down to a whole MiB, like a product), its consumed
    ``memory`` (capacity), or the device's own memory when nothing was consumed (a device of
    an older version without capacity).

    Raises:
        ParameterError: a consumed memory amount that is not a positive quantity.
        PrepareError: consumed slots that are not whole or no size of the device.
    """
    if fraction.fraction_model == FractionModel.CAPACITY:
        consumed = _consumed_memory(result)
        return consumed if consumed is not None else fraction.memory_bytes
    if result.consumed_slots is None or not fraction.slots:
        return fraction.memory_bytes
    where = f"{result.path}.consumedCapacity.slots"
    slots = _consumed_slots(result.consumed_slots, where, fraction)
    return product_memory_bytes(fraction.gpu, Fraction(slots, fraction.slots))


def _consumed_slots(value: str, where: str, fraction: FractionDevice) -> int:
    """A consumed ``slots`` amount: whole, and one of the sizes the device offers (its
    ``validValues``; any of 1..its slots when it lists none).

    Raises:
        PrepareError: not a whole, positive quantity, or no size of the device.
    """
    try:
        amount = quantity_decimal(value)
    except QuantityError:
        amount = None
    if amount is None or amount <= 0 or amount != amount.to_integral_value():
        raise PrepareError(f"{where}: {shown(value)} is not a whole, positive number of slots")
    sizes = fraction.sizes or range(1, fraction.slots + 1)
    if amount > fraction.slots or int(amount) not in sizes:  # int() only of a small amount
        offered = ", ".join(str(n) for n in fraction.sizes) or f"1..{fraction.slots}"
        raise PrepareError(
            f"{where}: {shown(value)} is no size device {fraction.name} offers ({offered} of "
            f"{fraction.slots} slots); the scheduler allocates only those"
        )
    return int(amount)


def _plan_device(
    result: AllocationResult,
    fraction: FractionDevice,
    params: ClaimParameters,
) -> DevicePlan:
    gpu = fraction.gpu
    where = f"device {fraction.name} (GPU {gpu.index}, {gpu.uuid})"
    if result.share_id is None:
        raise PrepareError(
            f"{where} allows multiple allocations, yet {result.path} has no shareID (the "
            "scheduler gives every share one). Re-create the claim so that the scheduler "
            "allocates it again"
        )
    if params.compute_mode and params.compute_mode != fraction.compute_mode:
        raise PrepareError(
            f"{where} runs compute mode {fraction.compute_mode}; the claim asks for "
            f"{params.compute_mode}. Use a DeviceClass or selector for {params.compute_mode} GPUs"
        )
    if (
        params.active_thread_percentage is not None
        and fraction.compute_mode != ComputeMode.SM_SHARING
    ):
        raise PrepareError(
            f"{where}: activeThreadPercentage needs compute mode sm-sharing; "
            f"this GPU runs {fraction.compute_mode}"
        )
    request = _requested_memory(result, fraction)
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
        request_names=(result.request,),
        pool=result.pool,
        device=fraction.name,
        share_id=result.share_id,
        gpu=gpu,
        compute_mode=fraction.compute_mode,
        memory_request_bytes=request,
        memory_limit_bytes=limit,
        active_thread_percentage=params.active_thread_percentage,
    )


def plan_claim(
    ref: ClaimRef,
    claim: Any,
    driver: str,
    pool: str,
    devices: Mapping[str, FractionDevice],
) -> ClaimPlan:
    """Decide what to enforce for one claim.

    Args:
        ref: namespace/name/UID the kubelet asked for.
        claim: the ResourceClaim as decoded API JSON, unchecked (any JSON value).
        driver: our driver name; results of other drivers are ignored.
        pool: our pool name (the node name).
        devices: this node's fraction devices by name (from ``offer.offered_devices``).

    Raises:
        PrepareError: a field of the wrong JSON type (the message names its path), UID
            mismatch or malformed, not allocated, no results for this driver, a result for
            another pool or an unknown device, a share ID that is not a DNS label or is on a
            device that does not allow multiple allocations, malformed or
            contradictory parameters (limit below request or above the card, a mode other
            than the GPU's, an SM percentage on a time-slicing GPU).
    """
    validate_uid(ref.uid)
    who = f"claim {ref.namespace}/{ref.name}"
    root = Field(claim, owner=who, root="ResourceClaim")
    root.object()
    uid = root["metadata"]["uid"].string()
    if uid != ref.uid:
        raise PrepareError(
            f"{who} has UID {shown(uid)}, kubelet asked for {ref.uid!r} (the claim was deleted "
            "and recreated); the pod must be recreated"
        )
    allocation = _allocation(root, driver)
    if allocation is None:
        raise PrepareError(f"{who} is not allocated")
    results, configs = allocation
    if not results:
        raise PrepareError(f"{who} has no allocation results for driver {driver}")
    plans: dict[tuple[str, str | None], DevicePlan] = {}
    for result in results:
        if result.pool != pool:
            raise PrepareError(
                f"device {shown(result.device)} of pool {shown(result.pool)} is not on this "
                f"node (pool {pool})"
            )
        fraction = devices.get(result.device)
        if fraction is None:
            raise PrepareError(
                f"device {shown(result.device)} is not on this node any more (GPU removed or "
                "reconfigured)"
            )
        params = _parameters_for(configs, result.request)
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
