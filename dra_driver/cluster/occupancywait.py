"""Why a Pending pod waits for one of the driver's DeviceClasses: a pure decision from the
gathered API JSON (:class:`dra_driver.cluster.occupancy.Cluster`) and the GPUs' occupancy.

A pod waits for a class when it is Pending, unbound and its ``PodScheduled`` condition is
``False``, and one of its claims (``spec.resourceClaims``: a named ResourceClaim, or the claim
made from a ResourceClaimTemplate, or the template's spec while that claim does not exist
yet) or one of its containers' extended resources (a class's ``extendedResourceName``) names a
class whose CEL selector is on ``device.driver == "<driver>"``.

A waiting pod whose claim names a DeviceClass that does not exist (a typo such as
``gpu-quater``: the API server accepts the claim, the scheduler waits) is listed too, with the
reason ``unknown-device-class`` and the closest existing class names (:mod:`difflib`, the
driver's classes first).

Each request for one of the driver's classes is checked in this order; the first failing
check is the pod's reason:

1. ``quota-exhausted``: the request is not admitted yet (its claim does not exist, or it is an
   extended resource) and a ResourceQuota of the namespace has ``used >= hard`` for
   ``<class>.deviceclass.resource.k8s.io/devices`` or ``requests.<extended resource>``
   (Kubernetes quota for DRA, KEP-4381 / KEP-5004);
2. ``no-matching-node``: ``spec.nodeSelector`` matches no Node that has the driver's slices;
3. ``no-device-for-class``: no GPU of the matching nodes offers the class's fraction model,
   compute mode and product (the class's ``<driver>/fraction-model``, ``/compute-mode`` and
   ``/product`` labels);
4. ``gpu-tainted``: every such GPU carries a ``NoSchedule`` / ``NoExecute`` device taint
   (lost, or its MPS check failed; the claim's tolerations are not evaluated);
5. ``other-compute-mode``: every untainted such GPU is busy in the other compute mode (a GPU
   carries one mode at a time);
6. ``not-enough-memory``: no untainted GPU in the class's mode (or idle) has free memory for
   the size:
   the request's ``capacity.requests.memory`` (else the device's ``requestPolicy.default``, as
   the scheduler consumes it) or ``slots`` (written by the sizing policy), else the product's
   portion (an extended-resource device's ``portion`` attribute, or the default
   products) x the card.

A reason from checks 5-6 names the tainted GPUs it left out, if any.

When every request passes, the reason is ``unknown`` and the detail is the scheduler's
message (e.g. several claims that fit alone but not together).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from difflib import get_close_matches
from fractions import Fraction

from dra_driver.cluster.occupancy import (
    IDLE,
    Cluster,
    Device,
    GpuUse,
    Json,
    Pending,
    Report,
    devices,
    gib,
    gpu_uses,
    quantity_int,
)
from dra_driver.config.node import DEFAULT_PRODUCTS
from dra_driver.model.devices import portion_bytes
from dra_driver.model.vocabulary import ANY_PRODUCT, FractionModel

UNKNOWN_CLASS = "unknown-device-class"
QUOTA = "quota-exhausted"
NO_NODE = "no-matching-node"
NO_DEVICE = "no-device-for-class"
TAINTED = "gpu-tainted"
OTHER_MODE = "other-compute-mode"
NO_MEMORY = "not-enough-memory"
UNKNOWN = "unknown"
REASONS = (UNKNOWN_CLASS, QUOTA, NO_NODE, NO_DEVICE, TAINTED, OTHER_MODE, NO_MEMORY, UNKNOWN)
"""Reasons in the order they are checked."""
SIMILAR_CUTOFF = 0.6
"""How alike a class name must be to be offered as the one meant (difflib's ratio, 0-1)."""


@dataclass(frozen=True)
class DeviceClassInfo:
    """What a class of the driver selects (from its labels; None: not labelled)."""

    name: str
    fraction_model: str | None
    compute_mode: str | None
    product: str | None
    extended_resource: str | None


@dataclass(frozen=True)
class Wanted:
    """One request of a pending pod for a class of the driver."""

    cls: DeviceClassInfo
    request: Json
    """The request's ``exactly`` (or firstAvailable alternative) body."""
    admitted: bool
    """True when its claim exists (quota admission let it in)."""


def our_classes(classes: Sequence[Json], driver: str) -> dict[str, DeviceClassInfo]:
    """Class name -> info for DeviceClasses whose CEL selectors are on ``driver``."""
    marker = f'device.driver == "{driver}"'
    found = {}
    for c in classes:
        exprs = [(s.get("cel") or {}).get("expression", "") for s in c["spec"].get("selectors", [])]
        if not any(marker in e for e in exprs):
            continue
        labels = c["metadata"].get("labels") or {}
        name = c["metadata"]["name"]
        found[name] = DeviceClassInfo(
            name=name,
            fraction_model=labels.get(f"{driver}/fraction-model"),
            compute_mode=labels.get(f"{driver}/compute-mode"),
            product=labels.get(f"{driver}/product"),
            extended_resource=c["spec"].get("extendedResourceName"),
        )
    return found


def _requests(spec: Json) -> Iterator[Json]:
    for r in (spec.get("devices") or {}).get("requests") or []:
        if r.get("exactly"):
            yield r["exactly"]
        yield from r.get("firstAvailable") or []


def claim_specs(pod: Json, cluster: Cluster) -> list[tuple[Json, bool]]:
    """(claim spec, admitted) of each of the pod's claims: its ResourceClaim's spec when it
    exists (admitted), else its template's claim spec (not admitted yet)."""
    ns = pod["metadata"].get("namespace", "")
    claims = {c["metadata"]["name"]: c for c in cluster.claims if c["metadata"]["namespace"] == ns}
    templates = {
        t["metadata"]["name"]: t for t in cluster.templates if t["metadata"]["namespace"] == ns
    }
    made = {
        s["name"]: s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    specs: list[tuple[Json, bool]] = []
    for ref in pod["spec"].get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or made.get(ref["name"])
        if name in claims:
            specs.append((claims[name].get("spec") or {}, True))
        elif ref.get("resourceClaimTemplateName") in templates:
            template = templates[ref["resourceClaimTemplateName"]]
            specs.append(((template.get("spec") or {}).get("spec") or {}, False))
    return specs


def unknown_classes(pod: Json, cluster: Cluster) -> list[str]:
    """The DeviceClass names the pod's claims ask for that no DeviceClass has, in order."""
    existing = {c["metadata"]["name"] for c in cluster.classes}
    names = (
        r.get("deviceClassName") for spec, _ in claim_specs(pod, cluster) for r in _requests(spec)
    )
    return list(dict.fromkeys(n for n in names if n and n not in existing))


def closest_classes(name: str, ours: Sequence[str], others: Sequence[str]) -> list[str]:
    """Existing class names like ``name`` (at most 3), the driver's own (``ours``) first."""
    found = get_close_matches(name, ours, n=3, cutoff=SIMILAR_CUTOFF)
    found += get_close_matches(name, others, n=3, cutoff=SIMILAR_CUTOFF)
    return found[:3]


def unknown_class_detail(names: Sequence[str], cluster: Cluster, driver: str) -> str:
    """What ``unknown-device-class`` says: each missing class and what may have been meant."""
    ours = sorted(our_classes(cluster.classes, driver))
    others = sorted({c["metadata"]["name"] for c in cluster.classes} - set(ours))
    parts = []
    for name in names:
        similar = closest_classes(name, ours, others)
        meant = (
            f"did you mean {' or '.join(similar)}?" if similar else "no class has a similar name"
        )
        parts.append(f"DeviceClass {name} does not exist; {meant}")
    return "; ".join(parts) + " (kubectl get deviceclasses)"


def wanted(pod: Json, cluster: Cluster, classes: Mapping[str, DeviceClassInfo]) -> list[Wanted]:
    """The pod's requests for ``classes``: from its claims, templates and extended resources."""
    specs = claim_specs(pod, cluster)
    found = [
        Wanted(classes[r["deviceClassName"]], r, admitted)
        for spec, admitted in specs
        for r in _requests(spec)
        if r.get("deviceClassName") in classes
    ]
    by_resource = {c.extended_resource: c for c in classes.values() if c.extended_resource}
    containers = [*pod["spec"].get("initContainers", []), *pod["spec"].get("containers", [])]
    names = {
        key
        for c in containers
        for part in ("requests", "limits")
        for key in ((c.get("resources") or {}).get(part) or {})
    }
    found += [Wanted(by_resource[n], {}, False) for n in sorted(names) if n in by_resource]
    return found


def is_waiting(pod: Json) -> bool:
    """Pending, not bound, and ``PodScheduled`` is ``False``."""
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    unscheduled = any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)
    return status.get("phase") == "Pending" and not pod["spec"].get("nodeName") and unscheduled


def _quota_full(ns: str, item: Wanted, quotas: Sequence[Json]) -> str | None:
    if item.admitted:
        return None
    keys = [f"{item.cls.name}.deviceclass.resource.k8s.io/devices"]
    if item.cls.extended_resource:
        keys.append(f"requests.{item.cls.extended_resource}")
    for q in quotas:
        if q["metadata"].get("namespace") != ns:
            continue
        status = q.get("status") or {}
        for key in keys:
            hard = quantity_int((status.get("hard") or {}).get(key, ""))
            used = quantity_int((status.get("used") or {}).get(key, "0"), 0)
            if hard is not None and used is not None and used >= hard:
                return f"ResourceQuota {q['metadata']['name']}: {key} used {used} of {hard}"
    return None


def _offers(device: Device, cls: DeviceClassInfo) -> bool:
    return (
        cls.fraction_model in (None, device.fraction_model)
        and cls.compute_mode in (None, device.compute_mode)
        and (cls.product is None or device.product in (ANY_PRODUCT, cls.product))
    )


def _portion(item: Wanted, offered: Sequence[Device]) -> Fraction:
    """Share of a card a products-model request takes: its ``slots`` of the device's slots,
    else its product's portion (an extended-resource device's, else the default products'),
    else the whole card."""
    requested = quantity_int(
        ((item.request.get("capacity") or {}).get("requests") or {}).get("slots", "")
    )
    total = next((d.slots for d in offered if d.slots), None)
    if requested and total:
        return Fraction(min(requested, total), total)
    product = item.cls.product
    own = next((d.portion for d in offered if d.portion and d.product == product), None)
    if own is not None:
        return own
    return next((p.portion for p in DEFAULT_PRODUCTS if p.name == product), Fraction(1))


def size_bytes(item: Wanted, gpu: GpuUse, offered: Sequence[Device]) -> int:
    """Bytes the request needs on ``gpu`` (see the module docstring, check 6)."""
    if item.cls.fraction_model == FractionModel.CAPACITY:
        requests = (item.request.get("capacity") or {}).get("requests") or {}
        default = next((d.memory_default for d in offered if d.memory_default), None)
        return quantity_int(requests.get("memory", ""), default or gpu.memory_bytes) or 0
    return portion_bytes(gpu.memory_bytes, _portion(item, offered))


def _selected(pod: Json, nodes: Sequence[Json], gpus: Sequence[GpuUse]) -> set[str]:
    """Names of the nodes with the driver's GPUs whose labels match ``spec.nodeSelector``."""
    selector = pod["spec"].get("nodeSelector") or {}
    labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in nodes}
    return {
        g.node for g in gpus if all(labels.get(g.node, {}).get(k) == v for k, v in selector.items())
    }


def _check_gpus(
    item: Wanted, nodes: set[str], gpus: Sequence[GpuUse], offered: Sequence[Device]
) -> tuple[str, str] | None:
    """Checks 3-6 of one request on the GPUs of ``nodes``; None when some GPU fits it."""
    mine = [d for d in offered if d.node in nodes and _offers(d, item.cls)]
    on: dict[tuple[str, int], list[Device]] = {}
    for d in mine:
        on.setdefault((d.node, d.gpu), []).append(d)
    candidates = [g for g in gpus if (g.node, g.index) in on]
    name = item.cls.name
    if not candidates:
        return NO_DEVICE, f"no GPU on {len(nodes)} matching node(s) offers {name}"
    untainted = [g for g in candidates if not g.taints]
    taints = ", ".join(sorted({t for g in candidates for t in g.taints}))
    if not untainted:
        return TAINTED, (
            f"all {len(candidates)} GPU(s) for {name} are tainted ({taints}); only claims "
            "that tolerate it land there"
        )
    failed = _check_untainted(item, untainted, on)
    if failed and taints:
        tainted = len(candidates) - len(untainted)
        return failed[0], f"{failed[1]}; {tainted} other GPU(s) for {name} tainted ({taints})"
    return failed


def _check_untainted(
    item: Wanted, candidates: Sequence[GpuUse], on: Mapping[tuple[str, int], list[Device]]
) -> tuple[str, str] | None:
    """Checks 5-6 of one request on its untainted candidate GPUs; None when one fits it."""
    name, mode = item.cls.name, item.cls.compute_mode
    usable = [g for g in candidates if mode is None or g.mode in (IDLE, mode)]
    if not usable:
        busy = ", ".join(sorted({g.mode for g in candidates}))
        return OTHER_MODE, f"all {len(candidates)} GPU(s) for {name} are busy in {busy}"
    need = {(g.node, g.index): size_bytes(item, g, on[(g.node, g.index)]) for g in usable}
    if any(g.free_bytes >= need[(g.node, g.index)] for g in usable):
        return None
    best = max(usable, key=lambda g: g.free_bytes)
    return NO_MEMORY, (
        f"{name} needs {gib(need[(best.node, best.index)])}; the most free on a GPU "
        f"idle or in {mode or 'its'} mode is {gib(best.free_bytes)} ({best.node} GPU {best.index})"
    )


def reason(
    pod: Json, items: Sequence[Wanted], cluster: Cluster, gpus: Sequence[GpuUse], driver: str
) -> tuple[str, str]:
    """(reason, detail) for a waiting pod's ``items``: the first failing check (module
    docstring) over its requests in order, else ``unknown`` with the scheduler's message."""
    ns = pod["metadata"].get("namespace", "")
    nodes = _selected(pod, cluster.nodes, gpus)
    offered = list(devices(cluster.slices, driver).values())
    for item in items:
        quota = _quota_full(ns, item, cluster.quotas)
        if quota:
            return QUOTA, quota
        if not nodes:
            selector = pod["spec"].get("nodeSelector") or {}
            return NO_NODE, f"nodeSelector {selector} matches no node with {driver} GPUs"
        failed = _check_gpus(item, nodes, gpus, offered)
        if failed:
            return failed
    conditions = (pod.get("status") or {}).get("conditions") or []
    message = next((c.get("message") for c in conditions if c["type"] == "PodScheduled"), None)
    return UNKNOWN, message or "every request fits alone; see kubectl describe pod"


def pending_pods(cluster: Cluster, gpus: Sequence[GpuUse], driver: str) -> list[Pending]:
    """Every waiting pod (:func:`is_waiting`) with requests for the driver's classes or for a
    class that does not exist, and its reason, sorted by namespace and name."""
    classes = our_classes(cluster.classes, driver)
    found = []
    for pod in cluster.pods:
        if not is_waiting(pod):
            continue
        meta = pod["metadata"]
        missing = unknown_classes(pod, cluster)
        items = wanted(pod, cluster, classes)
        if missing:
            detail = unknown_class_detail(missing, cluster, driver)
            names = tuple(dict.fromkeys([*missing, *(i.cls.name for i in items)]))
            found.append(
                Pending(meta.get("namespace", ""), meta["name"], names, UNKNOWN_CLASS, detail)
            )
            continue
        if not items:
            continue
        why, detail = reason(pod, items, cluster, gpus, driver)
        names = tuple(dict.fromkeys(i.cls.name for i in items))
        found.append(Pending(meta.get("namespace", ""), meta["name"], names, why, detail))
    return sorted(found, key=lambda p: (p.namespace, p.name))


def build_report(cluster: Cluster, driver: str, node: str | None = None) -> Report:
    """The occupancy report of ``driver``'s GPUs; with ``node``, only that node's GPUs and the
    waiting pods whose nodeSelector allows it (reasons are still decided cluster-wide)."""
    gpus = gpu_uses(cluster, driver)
    pending = pending_pods(cluster, gpus, driver)
    if node is None:
        return Report(gpus, pending)
    pods = {(p["metadata"].get("namespace", ""), p["metadata"]["name"]): p for p in cluster.pods}
    here = [g for g in gpus if g.node == node]
    allowed = [
        p for p in pending if node in _selected(pods[(p.namespace, p.name)], cluster.nodes, here)
    ]
    return Report(here, allowed, node)
