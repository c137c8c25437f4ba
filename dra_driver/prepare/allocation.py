"""The allocation of a ResourceClaim as this driver reads it (pure): its results and opaque
configs, type-checked from the claim's API JSON (:class:`~dra_driver.model.apijson.Field`), and the
merged parameters that apply to one request (class configs first, then the claim's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dra_driver.config.params import ClaimParameters, parse_parameters
from dra_driver.model.apijson import Field
from dra_driver.model.ids import DNS_LABEL, DNS_LABEL_RULE, is_dns_label
from dra_driver.model.textlimits import shown

_REQUEST_NAME = re.compile(f"{DNS_LABEL.pattern}(/{DNS_LABEL.pattern})?")
"""A request name, or ``<request>/<subrequest>`` (each an RFC 1123 label)."""
CONFIG_SOURCES = ("FromClass", "FromClaim")


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
        consumed: every capacity name in ``consumedCapacity``, sorted.
        admin_access: ``adminAccess`` is true.
    """

    path: str
    request: str
    pool: str
    device: str
    share_id: str | None
    consumed_memory: str | None
    consumed_slots: str | None = None
    consumed: tuple[str, ...] = ()
    admin_access: bool = False


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


def parameters_for(
    configs: list[DeviceConfig], request: str, from_class: bool | None = None
) -> ClaimParameters:
    """The merged parameters of the configs that apply to ``request`` (class configs first),
    or only of the class (``from_class`` True) or claim (False) configs."""
    params = ClaimParameters()
    for config in sorted(configs, key=lambda c: (not c.from_class, c.index)):
        if not _applies(config, request):
            continue
        if from_class is not None and config.from_class != from_class:
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
    consumed = field["consumedCapacity"]
    admin = field["adminAccess"]
    return AllocationResult(
        path=field.path,
        request=request,
        pool=field["pool"].string(),
        device=field["device"].string(),
        share_id=share_id,
        consumed_memory=consumed["memory"].optional_string(),
        consumed_slots=consumed["slots"].optional_string(),
        consumed=tuple(sorted(consumed.object())) if not consumed.absent else (),
        admin_access=False if admin.absent else admin.boolean(),
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


def read_allocation(
    claim: Field, driver: str
) -> tuple[list[AllocationResult], list[DeviceConfig]] | None:
    """Our driver's results and configs (``status.allocation.devices``) of the claim at
    ``claim``; None when the claim is not allocated.

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
