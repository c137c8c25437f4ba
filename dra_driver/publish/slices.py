"""Pure planning: GPU inventory + node configuration -> published devices -> ResourceSlice bodies.

:func:`~dra_driver.publish.offer.offered_devices` is the single source of truth for which
devices exist: the publisher publishes exactly these, and Prepare maps an allocated device name
back to its GPU, memory and compute mode with :func:`~dra_driver.publish.offer.devices_by_name`.
Nothing here touches the network or files (``dra-driver render-slices`` reads the GPU source
and configuration in :mod:`dra_driver.app.readcmds`).

Per offered GPU (index ``i``), in each compute mode it is offered in (both for ``computeMode:
auto``, the default; one when pinned):

- counter set ``gpu-<i>`` with one counter ``gpu: 1``; every device of the GPU allows multiple
  allocations and consumes all of it, which the scheduler charges once, at a device's first
  share, so a GPU serves one device (one compute mode) at a time;
- products model: device ``gpu-<i>-<mode>`` with capacity ``slots`` = ``slotsPerGpu`` (default:
  the least common multiple of the product denominators), ``requestPolicy`` ``validValues`` =
  each product's ``portion * slotsPerGpu``, ascending, ``default`` the smallest (the largest
  with extended resources on, :func:`dra_driver.publish.offer.shared_default_size`), and attribute
  ``product: "*"``; a claim's product is the slots it consumes. With ``extendedResources``,
  before it, one device ``gpu-<i>-<mode>-<product>`` per product whose only size is its own;
- capacity model: device ``gpu-<i>-<mode>`` with capacity ``memory`` = the card, with
  ``requestPolicy`` ``validRange{min, step, max}`` where
  ``max = min + floor((card - min) / step) * step`` (the largest on-grid amount that fits) and
  ``default`` = the configured default rounded up to the grid (capped at ``max``), or ``min``.

Devices of an unhealthy GPU (lost, or failing its MPS check) carry a ``NoSchedule`` taint
``<driver>/gpu-unhealthy`` (:mod:`dra_driver.publish.devicetaints`); other devices have no
``taints``.

Slices (Kubernetes >= 1.35 layout): counter sets go in their own slices (at most 8 sets each),
devices in further slices (at most 64 each, since they consume counters or allow multiple
allocations; one GPU's devices are never split across slices), all in pool ``<node>`` with one
``generation`` and ``resourceSliceCount``.
Limits are from the resource.k8s.io/v1 API (``ResourceSliceMaxDevices...`` in k8s.io/api
``resource/v1/types.go``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import structlog

from dra_driver.config.classnames import label_value
from dra_driver.config.node import (
    NodeConfig,
)
from dra_driver.model.devices import PublishedDevice
from dra_driver.model.errors import UsageError
from dra_driver.model.gpu import Inventory
from dra_driver.model.ids import is_dns_subdomain
from dra_driver.model.quantities import canonical_quantity
from dra_driver.model.vocabulary import ANY_PRODUCT, TIERS, FractionModel, Tier
from dra_driver.publish.devicetaints import DeviceTaint
from dra_driver.publish.offer import Offer, OfferedGpu, capacity_request_policy, offer

log = structlog.get_logger(__name__)

RESOURCE_API_VERSION = "resource.k8s.io/v1"
"""API group/version of ResourceSlice and DeviceClass bodies."""

"""Values of the ``memoryEnforcement`` attribute (see ``docs/enforcement.md``, "Tiers")."""

MAX_DEVICES_PER_SLICE_ADVANCED = 64
"""Devices per slice when a device consumes counters, has taints or allows multiple allocations
(Kubernetes allows 128 otherwise; every device here consumes counters or allows multiple
allocations, so 64 always applies)."""

MAX_COUNTER_SETS_PER_SLICE = 8
"""Counter sets per ResourceSlice."""

MAX_ATTRIBUTE_VALUE_LENGTH = 64
"""Longest string or version attribute value."""

MAX_SLICE_NAME_LENGTH = 253
"""``metadata.name`` of a ResourceSlice is a DNS subdomain."""

PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
"""Standard attribute carrying the parent GPU's PCI address."""

MEMORY = "memory"
"""Name of the capacity-model devices' consumable capacity, in bytes."""

SLOTS = "slots"
"""Name of the products-model devices' consumable capacity: the GPU in ``slotsPerGpu`` equal
slots; a product of portion ``p`` takes ``p * slotsPerGpu``."""

GPU_COUNTER = "gpu"
"""The one counter of a GPU's counter set (value 1). Each device of the GPU consumes all of
it; the scheduler charges a device that allows multiple allocations once, at its first share
(k8s.io/dynamic-resource-allocation, ``allocator_incubating.go``), so the GPU's devices
exclude each other while one has shares, and each takes many shares."""

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
"""Label set on every published slice; its value is the driver name."""

_NO_ENFORCEMENT: Mapping[str, str] = MappingProxyType({})
_NO_TAINTS: Mapping[str, DeviceTaint] = MappingProxyType({})
_NUMERIC_VERSION = re.compile(r"[0-9]+(\.[0-9]+){0,2}")
_SEMVER = re.compile(
    r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?"
)


def semver(text: str) -> str | None:
    """``text`` as a semver 2.0 string for a ``version`` attribute, or None when impossible.

    Dotted numbers of 1-3 parts are normalised (``"9.0"`` -> ``"9.0.0"``,
    ``"615.71.09"`` -> ``"615.71.9"``: semver forbids leading zeros); a string that is
    already semver is kept.
    """
    if _NUMERIC_VERSION.fullmatch(text):
        parts = [str(int(p)) for p in text.split(".")]
        parts += ["0"] * (3 - len(parts))
        return ".".join(parts)
    if _SEMVER.fullmatch(text) and len(text) <= MAX_ATTRIBUTE_VALUE_LENGTH:
        return text
    return None


def _string(value: str) -> dict[str, Any]:
    return {"string": value[:MAX_ATTRIBUTE_VALUE_LENGTH]}


def _version_or_string(value: str) -> dict[str, Any]:
    version = semver(value)
    return {"version": version} if version is not None else _string(value)


def _device_attributes(device: PublishedDevice, enforcement: str) -> dict[str, Any]:
    gpu = device.gpu
    attrs: dict[str, Any] = {
        "uuid": _string(gpu.uuid),
        "index": {"int": gpu.index},
        "minor": {"int": gpu.minor},
        "productName": _string(gpu.name),
        "architecture": _string(gpu.architecture),
        "computeCapability": _version_or_string(gpu.compute_capability),
        "driverVersion": _version_or_string(gpu.driver_version),
        "driverVersionString": _string(gpu.driver_version),
        "cudaDriverVersion": _version_or_string(gpu.cuda_driver_version),
        "gpuMemory": {"int": gpu.memory_bytes},
        "smCount": {"int": gpu.sm_count},
        "computeMode": _string(device.compute_mode),
        "fractionModel": _string(device.fraction_model),
        "memoryEnforcement": _string(enforcement),
    }
    if device.product is not None and device.portion is not None:
        attrs["product"] = _string(device.product)
        attrs["portion"] = _string(str(device.portion))
    elif device.fraction_model == FractionModel.PRODUCTS:
        attrs["product"] = _string(ANY_PRODUCT)
    attrs[PCI_BUS_ID_ATTRIBUTE] = _string(gpu.pci_bus_id)
    return attrs


def _device_body(device: PublishedDevice, planned: OfferedGpu, enforcement: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": device.name,
        "attributes": _device_attributes(device, enforcement),
        "allowMultipleAllocations": True,
    }
    if device.fraction_model == FractionModel.CAPACITY:
        policy = capacity_request_policy(device.gpu.memory_bytes, planned.config.capacity)
        assert policy is not None  # offer() excludes GPUs without a valid policy
        body["capacity"] = {
            MEMORY: {"value": canonical_quantity(device.memory_bytes), "requestPolicy": policy}
        }
    else:
        values = [canonical_quantity(s, binary=False) for s in device.sizes]
        default = canonical_quantity(device.default_size, binary=False)
        body["capacity"] = {
            SLOTS: {
                "value": canonical_quantity(device.slots, binary=False),
                "requestPolicy": {"default": default, "validValues": values},
            }
        }
    assert device.counter_set is not None
    body["consumesCounters"] = [
        {"counterSet": device.counter_set, "counters": {GPU_COUNTER: {"value": "1"}}}
    ]
    return body


def _counter_set_body(planned: OfferedGpu) -> dict[str, Any]:
    return {"name": planned.counter_set, "counters": {GPU_COUNTER: {"value": "1"}}}


def slice_name(node: str, driver: str, n: int) -> str:
    """Deterministic ``metadata.name`` of slice ``n``: ``<node>-<driver, dots as dashes>-<n>``.

    A name longer than 253 characters keeps a prefix and gets an 8-hex-digit hash of the full
    base name, so it stays unique, deterministic and a DNS subdomain.
    """
    base = f"{node}-{driver.replace('.', '-')}"
    suffix = f"-{n}"
    if len(base) + len(suffix) > MAX_SLICE_NAME_LENGTH:
        digest = hashlib.sha256(base.encode()).hexdigest()[:8]
        keep = MAX_SLICE_NAME_LENGTH - len(suffix) - len(digest) - 1
        base = f"{base[:keep].rstrip('-.')}-{digest}"
    return base + suffix


def _check_names(node: str, driver: str) -> None:
    if not is_dns_subdomain(node, MAX_SLICE_NAME_LENGTH):
        raise UsageError(f"node name {node!r} is not a DNS subdomain (lower case, <= 253 chars)")
    if not is_dns_subdomain(driver, 63):
        raise UsageError(f"driver name {driver!r} must be a DNS subdomain of at most 63 chars")


_last_reported: dict[str, tuple[object, ...]] = {}


def log_exclusions(inventory: Inventory, result: Offer, key: str = "") -> None:
    """Log one warning per GPU that discovery skipped or the plan excluded.

    Repeated calls with the same ``key`` (the node) and the same exclusions log nothing, so a
    publisher rebuilding slices every interval does not repeat the warnings.
    """
    report = (inventory.skipped, result.excluded)
    if _last_reported.get(key) == report:
        return
    _last_reported[key] = report
    for skipped in inventory.skipped:
        log.warning(
            "gpu not offered: discovery skipped it", gpu=skipped.index, reason=skipped.reason
        )
    for excluded in result.excluded:
        log.warning(
            "gpu not offered", gpu=excluded.index, uuid=excluded.uuid, reason=excluded.reason
        )


def build_slices(
    inventory: Inventory,
    config: NodeConfig,
    driver: str,
    node: str,
    enforcement: Mapping[str, str] = _NO_ENFORCEMENT,
    generation: int = 1,
    node_uid: str | None = None,
    taints: Mapping[str, DeviceTaint] = _NO_TAINTS,
) -> list[dict[str, Any]]:
    """The node's ResourceSlice bodies (resource.k8s.io/v1 API JSON: camelCase, no nulls).

    Args:
        inventory: discovered GPUs; skipped and excluded GPUs are logged as warnings (once
            per change, see :func:`log_exclusions`).
        config: node configuration.
        driver: driver name (``spec.driver``; unqualified attribute names live in its domain).
        node: node name: ``spec.nodeName`` and the pool name.
        enforcement: GPU UUID -> ``hard`` | ``cooperative`` | ``none`` (missing: ``none``),
            published as the ``memoryEnforcement`` attribute.
        generation: ``spec.pool.generation`` of every slice (the publisher replaces it).
        node_uid: when given, each slice gets an ownerReference to its Node, so the garbage
            collector removes the slices with the Node object.
        taints: GPU UUID -> the taint every device of that GPU carries (``taints``, see
            :mod:`dra_driver.publish.devicetaints`); devices of other GPUs have no ``taints`` field.

    Returns:
        Counter slices first (``sharedCounters`` only), then device slices; ``[]`` when the
        node offers no device. Slice ``n`` is named :func:`slice_name` (node, driver, n).

    Raises:
        ValueError: invalid node or driver name, unknown enforcement level, negative generation.
    """
    _check_names(node, driver)
    if generation < 0:
        raise ValueError(f"generation {generation} must not be negative")
    for uuid, level in enforcement.items():
        if level not in TIERS:
            raise ValueError(f"enforcement for {uuid}: {level!r} is not one of {TIERS}")
    result = offer(inventory, config)
    log_exclusions(inventory, result, key=f"{driver}/{node}")

    counter_sets = [_counter_set_body(g) for g in result.gpus]
    groups: list[tuple[str, list[dict[str, Any]]]] = [
        ("sharedCounters", counter_sets[i : i + MAX_COUNTER_SETS_PER_SLICE])
        for i in range(0, len(counter_sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    # Devices are packed GPU by GPU, never splitting one GPU's devices across slices (a GPU
    # has at most 2 modes x (MAX_PRODUCTS + 1) = 22 devices, fewer than a slice holds).
    current: list[dict[str, Any]] = []
    for g in result.gpus:
        level = enforcement.get(g.gpu.uuid, Tier.NONE)
        bodies = [_device_body(d, g, level) for d in g.devices]
        if g.gpu.uuid in taints:
            for body in bodies:
                body["taints"] = [taints[g.gpu.uuid].body()]
        if current and len(current) + len(bodies) > MAX_DEVICES_PER_SLICE_ADVANCED:
            groups.append(("devices", current))
            current = []
        current.extend(bodies)
    if current:
        groups.append(("devices", current))
    labels = {MANAGED_BY_LABEL: label_value(driver)}
    slices: list[dict[str, Any]] = []
    for n, (key, items) in enumerate(groups):
        metadata: dict[str, Any] = {"name": slice_name(node, driver, n), "labels": dict(labels)}
        if node_uid:
            metadata["ownerReferences"] = [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node,
                    "uid": node_uid,
                    "controller": True,
                }
            ]
        slices.append(
            {
                "apiVersion": RESOURCE_API_VERSION,
                "kind": "ResourceSlice",
                "metadata": metadata,
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {
                        "name": node,
                        "generation": generation,
                        "resourceSliceCount": len(groups),
                    },
                    key: items,
                },
            }
        )
    return slices


def slice_devices(slices: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """All device bodies of a list of slices (test and status helper)."""
    return [d for s in slices for d in s["spec"].get("devices", [])]
