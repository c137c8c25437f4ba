"""Pure planning for NodePrepareResources: claim + allocation + node facts -> what to enforce.

No I/O here. :func:`plan_claim` turns the ResourceClaim (API JSON, as read from the API
server) into a :class:`~dra_driver.model.plans.ClaimPlan`: for each device allocated to this
driver on this node, the GPU, the memory request and ceiling (bytes), the compute mode and the
SM percentage. The allocation is read by :mod:`dra_driver.prepare.allocation`; caps come from
:mod:`dra_driver.config.caps`.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from dra_driver.config.caps import CapPolicy, memory_ceiling_cap, thread_cap
from dra_driver.config.params import ClaimLimits, ClaimParameters, quantity_bytes
from dra_driver.model.apijson import Field
from dra_driver.model.devices import PublishedDevice, product_memory_bytes
from dra_driver.model.errors import PrepareError
from dra_driver.model.ids import validate_uid
from dra_driver.model.plans import ClaimPlan, ClaimRef, DevicePlan
from dra_driver.model.quantities import QuantityError, canonical_quantity, quantity_decimal
from dra_driver.model.textlimits import shown
from dra_driver.model.vocabulary import ComputeMode, FractionModel
from dra_driver.prepare.allocation import AllocationResult, parameters_for, read_allocation

NO_NODE_CAPS = CapPolicy()
"""A node without ``claimLimits`` and the default SM ceiling 100."""


def _consumed_memory(result: AllocationResult) -> int | None:
    if result.consumed_memory is None:
        return None
    return quantity_bytes(result.consumed_memory, f"{result.path}.consumedCapacity.memory")


def device_capacity(fraction: PublishedDevice) -> str:
    """The consumable capacity ``fraction`` publishes: ``memory`` (capacity model, bytes) or
    ``slots`` (products model)."""
    return "memory" if fraction.fraction_model == FractionModel.CAPACITY else "slots"


def _requested_memory(result: AllocationResult, fraction: PublishedDevice) -> int:
    """Bytes the allocation gives the claim on ``fraction``: its consumed ``slots`` as a share
    of the card (products; rounded down to a whole MiB, like a product) or its consumed
    ``memory`` (capacity).

    Raises:
        ParameterError: a consumed memory amount that is not a positive quantity.
        PrepareError: a consumed capacity the device does not publish, none of the one it
            does (the scheduler always records it for a device with a capacity), or consumed
            slots that are not whole or no size of the device.
    """
    name = device_capacity(fraction)
    where = f"{result.path}.consumedCapacity"
    foreign = [c for c in result.consumed if c != name]
    if foreign:
        raise PrepareError(
            f"{where}: device {fraction.name} has no capacity {shown(', '.join(foreign))}; its "
            f"only capacity is {name!r}. The allocation is malformed: re-create the claim"
        )
    if name not in result.consumed:
        raise PrepareError(
            f"{where}: missing {name!r}; device {fraction.name} is shared by its {name}, and "
            "the scheduler records what each share consumes. Re-create the claim"
        )
    if fraction.fraction_model == FractionModel.CAPACITY:
        consumed = _consumed_memory(result)
        assert consumed is not None
        return consumed
    assert result.consumed_slots is not None
    slots = _consumed_slots(result.consumed_slots, f"{where}.slots", fraction)
    return product_memory_bytes(fraction.gpu, Fraction(slots, fraction.slots))


def _consumed_slots(value: str, where: str, fraction: PublishedDevice) -> int:
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


def _plan_admin(result: AllocationResult, fraction: PublishedDevice) -> DevicePlan:
    """Monitoring access to the GPU (``adminAccess: true``): no memory, no MPS namespace."""
    return DevicePlan(
        request_names=(result.request,),
        pool=result.pool,
        device=fraction.name,
        share_id=result.share_id,
        gpu=fraction.gpu,
        compute_mode=fraction.compute_mode,
        memory_request_bytes=0,
        memory_limit_bytes=0,
        active_thread_percentage=None,
        admin_access=True,
    )


def _plan_device(
    result: AllocationResult,
    fraction: PublishedDevice,
    params: ClaimParameters,
    class_caps: ClaimLimits,
    policy: CapPolicy,
) -> DevicePlan:
    gpu = fraction.gpu
    where = f"device {fraction.name} (GPU {gpu.index}, {gpu.uuid})"
    if result.admin_access:
        return _plan_admin(result, fraction)
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
    cap, why = memory_ceiling_cap(card, request, class_caps, params.limits, policy.node)
    if limit > cap:
        raise PrepareError(
            f"{where}: memory limit {canonical_quantity(limit)} exceeds the cap "
            f"{canonical_quantity(cap)} ({why}); ask for at most that, or ask a cluster admin "
            "for a class that allows more"
        )
    threads = params.active_thread_percentage
    if fraction.compute_mode == ComputeMode.SM_SHARING:
        most = thread_cap(class_caps, params.limits, policy.node)
        if most is not None and threads is not None and threads > most:
            raise PrepareError(
                f"{where}: activeThreadPercentage {threads} exceeds the cap {most} "
                "(maxActiveThreadPercentage of the claim's DeviceClass or the node); ask for at "
                "most that"
            )
        if most is not None and threads is None and policy.default_threads > most:
            threads = most
    return DevicePlan(
        request_names=(result.request,),
        pool=result.pool,
        device=fraction.name,
        share_id=result.share_id,
        gpu=gpu,
        compute_mode=fraction.compute_mode,
        memory_request_bytes=request,
        memory_limit_bytes=limit,
        active_thread_percentage=threads,
        max_consumers=params.max_consumers or 1,
    )


def plan_claim(
    ref: ClaimRef,
    claim: Any,
    driver: str,
    pool: str,
    devices: Mapping[str, PublishedDevice],
    policy: CapPolicy = NO_NODE_CAPS,
) -> ClaimPlan:
    """Decide what to enforce for one claim.

    Args:
        ref: namespace/name/UID the kubelet asked for.
        claim: the ResourceClaim as decoded API JSON, unchecked (any JSON value).
        driver: our driver name; results of other drivers are ignored.
        pool: our pool name (the node name).
        devices: this node's published devices by name (from ``offer.offered_devices``).
        policy: the node's caps and default SM ceiling (class caps come with the claim).

    Raises:
        PrepareError: a field of the wrong JSON type (the message names its path), UID
            mismatch or malformed, not allocated, no results for this driver, a result for
            another pool or an unknown device, a share ID that is not a DNS label, missing
            or given twice in the claim, a consumed capacity the device does not publish (or
            none), malformed or contradictory parameters (limit below request or above the
            card, a mode other than the GPU's, an SM percentage on a time-slicing GPU), a
            ceiling or SM percentage above its cap (:func:`memory_ceiling_cap`,
            :func:`thread_cap`).
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
    allocation = read_allocation(root, driver)
    if allocation is None:
        raise PrepareError(f"{who} is not allocated")
    results, configs = allocation
    if not results:
        raise PrepareError(f"{who} has no allocation results for driver {driver}")
    plans: dict[tuple[str, str | None], DevicePlan] = {}
    paths: dict[tuple[str, str | None], str] = {}
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
        params = parameters_for(configs, result.request)
        class_caps = parameters_for(configs, result.request, from_class=True).limits
        plan = _plan_device(result, fraction, params, class_caps, policy)
        key = (plan.device, plan.share_id)
        if key in plans:
            raise PrepareError(
                f"{who}: {paths[key]} and {result.path} are both share {shown(plan.share_id)} of "
                f"device {plan.device}; the scheduler gives every share its own ID, so the "
                "allocation is malformed (each share would be counted once). Re-create the claim"
            )
        plans[key] = plan
        paths[key] = result.path
    return ClaimPlan(claim=ref, devices=tuple(plans.values()))
