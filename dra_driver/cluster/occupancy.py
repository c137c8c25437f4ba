"""Occupancy of the cluster's GPUs (pure), decided from API JSON alone (``dra-driver occupancy``).

Pure: the reader (:mod:`dra_driver.cluster.occupancyread`) lists the objects; this module turns
them into a :class:`Report` (:mod:`dra_driver.cluster.occupancyrender` renders it). Inputs are
resource.k8s.io/v1 and v1 API JSON as ``kubectl get -o json`` shows it (camelCase).

Per node and GPU (the ``index`` attribute of the driver's devices in its ResourceSlices):

- ``mode``: the compute mode of the devices holding allocated shares, or ``idle``;
- ``tier``: the ``memoryEnforcement`` attribute (``hard`` | ``cooperative`` | ``none``);
- ``promised``: the sum of the shares of allocated claims on the GPU's devices, in bytes: a
  products-model share is consumed ``slots`` / the device's slots x ``gpuMemory``, rounded down
  to a MiB (as Prepare computes it, :func:`dra_driver.model.devices.portion_bytes`); a
  capacity-model share is its consumed ``memory``; a result without consumed capacity counts
  the whole card (as Prepare does);
- ``free``: ``gpuMemory - promised`` (bytes, never below 0);
- ``taints``: the ``NoSchedule`` / ``NoExecute`` taints on the GPU's devices, as
  ``key=value:effect`` (the plugin taints a lost GPU or one whose MPS check fails; an
  administrator's DeviceTaintRules are not read): new claims land there only if they
  tolerate them.

Pending pods and their reasons: :mod:`dra_driver.cluster.occupancywait`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dra_driver.cluster.occupancyusage import ClaimUse
from dra_driver.model.devices import portion_bytes
from dra_driver.model.quantities import QuantityError, canonical_quantity, quantity_value
from dra_driver.model.vocabulary import ANY_PRODUCT, FractionModel

IDLE = "idle"
"""Mode shown for a GPU without allocated shares."""

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
"""Device taint effects that keep new claims away (resource.k8s.io/v1 ``DeviceTaint``)."""

GIB = 1024**3

Json = Mapping[str, Any]


@dataclass(frozen=True)
class Cluster:
    """What the reader gathered: lists of API JSON objects (``items`` of each list call)."""

    slices: Sequence[Json] = ()
    claims: Sequence[Json] = ()
    templates: Sequence[Json] = ()
    pods: Sequence[Json] = ()
    quotas: Sequence[Json] = ()
    classes: Sequence[Json] = ()
    nodes: Sequence[Json] = ()


@dataclass(frozen=True)
class Device:
    """One published device of the driver: its GPU (node, index), model, mode and sizes."""

    node: str
    name: str
    gpu: int
    fraction_model: str
    compute_mode: str
    product: str | None
    slots: int | None
    """Total slots (products model), None for capacity devices."""
    card_bytes: int
    portion: Fraction | None
    """The ``portion`` attribute of an extended-resource device (one product), else None."""
    tier: str
    uuid: str
    product_name: str
    taints: tuple[str, ...] = ()
    """Its blocking taints as ``key=value:effect``."""
    memory_default: int | None = None
    """Bytes of its ``memory`` capacity's ``requestPolicy.default`` (capacity model): what a
    request that names no memory consumes. None for products devices."""


@dataclass(frozen=True)
class Holder:
    """One allocated share of a claim on a GPU."""

    namespace: str
    name: str
    pods: tuple[str, ...]
    fraction: str
    """Product name, or the consumed memory as a quantity (capacity model)."""
    memory_bytes: int
    device: str
    share_id: str
    uid: str = ""
    """The claim's UID."""


@dataclass
class GpuUse:
    """One GPU of a node and the shares its devices carry."""

    node: str
    index: int
    uuid: str
    product_name: str
    tier: str
    memory_bytes: int
    holders: list[Holder] = field(default_factory=list)
    modes: set[str] = field(default_factory=set)
    taints: set[str] = field(default_factory=set)
    """Blocking taints of any of its devices (``key=value:effect``)."""

    @property
    def mode(self) -> str:
        """``idle``, the one compute mode of its shares, or ``a+b`` (never expected)."""
        return "+".join(sorted(self.modes)) or IDLE

    @property
    def promised_bytes(self) -> int:
        return sum(h.memory_bytes for h in self.holders)

    @property
    def free_bytes(self) -> int:
        return max(0, self.memory_bytes - self.promised_bytes)


@dataclass(frozen=True)
class Pending:
    """A Pending pod waiting for one of the driver's classes, and the likely reason."""

    namespace: str
    name: str
    classes: tuple[str, ...]
    reason: str
    """One of :data:`dra_driver.cluster.occupancywait.REASONS`."""
    detail: str


@dataclass(frozen=True)
class Report:
    gpus: list[GpuUse]
    pending: list[Pending]
    node: str | None = None
    """The node the report is limited to (``--node``), or None for the whole cluster."""
    usage: Mapping[tuple[str, str], ClaimUse] | None = None
    """What each claim uses by (claim UID, GPU UUID), from the plugins' metrics
    (:mod:`dra_driver.cluster.occupancyusage`); None when not read (``--no-usage``)."""
    usage_problems: Mapping[str, str] = field(default_factory=dict)
    """Node -> why its plugin's usage could not be read."""


def attribute(device: Json, name: str) -> Any:
    """Value of attribute ``name`` of a device body (``{"int": 3}`` -> 3), or None."""
    value = (device.get("attributes") or {}).get(name)
    if not isinstance(value, Mapping) or not value:
        return None
    return next(iter(value.values()))


def quantity_int(text: Any, default: int | None = None) -> int | None:
    """A quantity string as a whole number (``"40Gi"`` -> 42949672960), or ``default``."""
    try:
        return int(quantity_value(str(text)))
    except QuantityError:
        return default


def _fraction_or_none(text: Any) -> Fraction | None:
    try:
        return Fraction(str(text)) if text is not None else None
    except (ValueError, ZeroDivisionError):
        return None


def blocking_taints(device: Json) -> tuple[str, ...]:
    """A device body's ``NoSchedule`` / ``NoExecute`` taints as ``key=value:effect``."""
    return tuple(
        f"{t.get('key', '')}={t.get('value', '')}:{t['effect']}"
        for t in device.get("taints") or []
        if t.get("effect") in BLOCKING_EFFECTS
    )


def _newest(slices: Iterable[Json], driver: str) -> list[Json]:
    """The driver's slices of each pool's highest generation (older ones are being replaced)."""
    ours = [s for s in slices if s.get("spec", {}).get("driver") == driver]
    newest: dict[str, int] = {}
    for s in ours:
        pool = s["spec"].get("pool", {})
        newest[pool.get("name", "")] = max(newest.get(pool.get("name", ""), 0), pool["generation"])
    return [s for s in ours if s["spec"]["pool"]["generation"] == newest[s["spec"]["pool"]["name"]]]


def devices(slices: Iterable[Json], driver: str) -> dict[tuple[str, str], Device]:
    """(pool, device name) -> :class:`Device` for every device of ``driver``'s slices."""
    found: dict[tuple[str, str], Device] = {}
    for s in _newest(slices, driver):
        spec = s["spec"]
        node = spec.get("nodeName") or spec["pool"]["name"]
        for d in spec.get("devices") or []:
            capacity = d.get("capacity") or {}
            slots = quantity_int((capacity.get("slots") or {}).get("value", ""))
            found[(spec["pool"]["name"], d["name"])] = Device(
                node=node,
                name=d["name"],
                gpu=int(attribute(d, "index") or 0),
                fraction_model=str(attribute(d, "fractionModel") or ""),
                compute_mode=str(attribute(d, "computeMode") or ""),
                product=attribute(d, "product"),
                slots=slots,
                card_bytes=int(attribute(d, "gpuMemory") or 0),
                portion=_fraction_or_none(attribute(d, "portion")),
                tier=str(attribute(d, "memoryEnforcement") or "none"),
                uuid=str(attribute(d, "uuid") or ""),
                product_name=str(attribute(d, "productName") or ""),
                taints=blocking_taints(d),
                memory_default=quantity_int(
                    ((capacity.get("memory") or {}).get("requestPolicy") or {}).get("default", "")
                ),
            )
    return found


def request_class(claim_spec: Json, request: str) -> str | None:
    """The deviceClassName of ``request`` (``name`` or ``name/subrequest``) in a claim spec."""
    top, _, sub = request.partition("/")
    for r in (claim_spec.get("devices") or {}).get("requests") or []:
        if r.get("name") != top:
            continue
        alts = [r.get("exactly") or {}] if not sub else r.get("firstAvailable") or []
        for alt in alts:
            if not sub or alt.get("name") == sub:
                name = alt.get("deviceClassName")
                return str(name) if name else None
    return None


def class_product(classes: Mapping[str, Json], name: str | None, driver: str) -> str | None:
    """The product a DeviceClass selects (its ``<driver>/product`` label), or None."""
    labels = (classes.get(name or "") or {}).get("metadata", {}).get("labels") or {}
    product: Any = labels.get(f"{driver}/product")
    return str(product) if product else None


def share_bytes(result: Json, device: Device) -> int:
    """Bytes one allocation result promises on ``device`` (see the module docstring)."""
    consumed = result.get("consumedCapacity") or {}
    if device.fraction_model == FractionModel.CAPACITY:
        return quantity_int(consumed.get("memory", ""), device.card_bytes) or 0
    slots = quantity_int(consumed.get("slots", ""))
    if slots is None or not device.slots:
        return device.card_bytes
    return portion_bytes(device.card_bytes, Fraction(min(slots, device.slots), device.slots))


def _fraction(result: Json, device: Device, product: str | None, nbytes: int) -> str:
    if device.fraction_model == FractionModel.CAPACITY:
        return canonical_quantity(nbytes)
    if device.product not in (None, ANY_PRODUCT):
        return str(device.product)
    if product:
        return product
    slots = (result.get("consumedCapacity") or {}).get("slots", "?")
    return f"{slots}/{device.slots} slots"


def _pods(claim: Json) -> tuple[str, ...]:
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return tuple(sorted(r["name"] for r in reserved if r.get("resource") == "pods"))


def gpu_uses(cluster: Cluster, driver: str) -> list[GpuUse]:
    """Every GPU of ``driver``'s slices with the shares allocated on it, by node and index."""
    by_name = devices(cluster.slices, driver)
    classes = {c["metadata"]["name"]: c for c in cluster.classes}
    gpus: dict[tuple[str, int], GpuUse] = {}
    for d in by_name.values():
        gpus.setdefault(
            (d.node, d.gpu),
            GpuUse(d.node, d.gpu, d.uuid, d.product_name, d.tier, d.card_bytes),
        ).taints.update(d.taints)
    for claim in cluster.claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        meta = claim["metadata"]
        for result in (allocation.get("devices") or {}).get("results") or []:
            device = by_name.get((result.get("pool", ""), result.get("device", "")))
            if result.get("driver") != driver or device is None:
                continue
            nbytes = share_bytes(result, device)
            cls = request_class(claim.get("spec") or {}, result.get("request", ""))
            product = class_product(classes, cls, driver)
            gpu = gpus[(device.node, device.gpu)]
            gpu.modes.add(device.compute_mode)
            gpu.holders.append(
                Holder(
                    namespace=meta.get("namespace", ""),
                    name=meta["name"],
                    uid=meta.get("uid", ""),
                    pods=_pods(claim),
                    fraction=_fraction(result, device, product, nbytes),
                    memory_bytes=nbytes,
                    device=device.name,
                    share_id=str(result.get("shareID", "")),
                )
            )
    for g in gpus.values():
        g.holders.sort(key=lambda h: (h.namespace, h.name, h.device, h.share_id))
    return [gpus[k] for k in sorted(gpus)]


def gib(nbytes: int) -> str:
    """Bytes as GiB with one decimal (``150083731456`` -> ``139.8Gi``), rounded down."""
    return f"{nbytes * 10 // GIB / 10:.1f}Gi"


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as lines with left-aligned columns, two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
