"""Pure: what a prepared claim's ``status.devices`` says about each of its fractions.

After Prepare, the plugin writes one ``AllocatedDeviceStatus`` (resource.k8s.io/v1, GA in
Kubernetes 1.37 as ``DRAResourceClaimDeviceStatus``) per allocated device of its own pool, so
a user reads with ``kubectl get resourceclaim <name> -o yaml`` what the fraction is and how it
is enforced. Each entry::

    {"driver": str, "pool": str, "device": str, "shareID"?: str,
     "data": {"gpu": {"uuid": str, "index": int, "productName": str},
              "memory": {"request": quantity, "requestBytes": int,
                         "limit": quantity, "limitBytes": int},
              "computeMode": ComputeMode value (time-slicing or sm-sharing),
              "activeThreadPercentage"?: int (1-100, sm-sharing only),
              "enforcement": "hard" | "cooperative" | "none",
              "consumers"?: {"max": int, "each": {"request": quantity, "limit": quantity},
                             "running": [str]},
              "shareID"?: str},
     "conditions": [{"type": "FractionEnforced", "status": "True" | "False",
                     "reason": str, "message": str, "lastTransitionTime": RFC 3339}]}

``FractionEnforced`` is ``True`` only for the ``hard`` tier (the memory ceiling is enforced by
the driver for every process of the claim); ``cooperative`` and ``none`` are ``False`` with a
reason and a message saying what holds instead (see ``docs/what-you-get.md``). An MPS device
also gets ``NonRootClients=False`` once a container of the claim runs as root, and
``MpsClientsConnected`` once its MPS server was restarted or its namespace re-created
(:mod:`dra_driver.observe.mpsoutages`): ``False`` while containers that ran before are still
running (they lost their MPS connection), ``True`` again once they were all restarted.

The entries go into the claim as read (:func:`dra_driver.prepare.claimwire.with_devices`):
other drivers' entries of the same claim are left alone (the list is a map keyed by driver,
pool, device and share ID).
Limits from the v1 API: at most 32 conditions per entry and 10 KiB of ``data``
(``AllocatedDeviceStatusDataMaxLength``); an entry here is well under both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from dra_driver.model.gpu import MIB
from dra_driver.model.plans import ClaimPlan, DevicePlan
from dra_driver.model.quantities import canonical_quantity
from dra_driver.model.vocabulary import ComputeMode, Tier

CONDITION_TYPE = "FractionEnforced"
"""The condition each entry carries."""

ROOT_CONDITION_TYPE = "NonRootClients"
"""The condition an MPS device's entry gets, False, once a container of the claim runs as root
(:mod:`dra_driver.observe.consumers`)."""

MAX_LISTED_CONSUMERS = 32
"""Most running consumers listed in one entry's ``data.consumers.running`` (each at most 317
characters: ``<namespace>/<pod>/<container>``; the entry stays within the API's 10 KiB)."""

CLIENTS_CONDITION_TYPE = "MpsClientsConnected"
"""The condition an MPS device's entry gets once the claim's MPS server or namespace was
replaced (:mod:`dra_driver.observe.mpsoutages`)."""


class ClientsCondition(NamedTuple):
    """The ``MpsClientsConnected`` condition of a claim's MPS devices.

    Attributes:
        connected: ``True`` once no container that ran before the outage is left.
        reason: CamelCase, e.g. ``MpsServerRestarted`` or ``ClientsReconnected``.
        message: one paragraph for the user.
        since: ``lastTransitionTime`` (RFC 3339).
    """

    connected: bool
    reason: str
    message: str
    since: str


class Enforcement(NamedTuple):
    """A GPU's enforcement tier and what keeps it from a stronger one (tier detection's
    reasons, e.g. ``driver 580.95.05 is older than r615``)."""

    tier: Tier
    reasons: tuple[str, ...] = ()


NOT_ENFORCED = Enforcement(Tier.NONE, ("enforcement tier unknown for this GPU",))

_REASONS = {
    Tier.HARD: "MemoryLimitEnforced",
    Tier.COOPERATIVE: "CooperativeMemoryLimit",
    Tier.NONE: "MemoryLimitNotEnforced",
}


def active_thread_percentage(plan: DevicePlan, default: int) -> int | None:
    """The SM ceiling MPS applies to the device's clients: sm-sharing's claim value or the
    plugin's ``--default-active-thread-percentage``; None for time-slicing (no ceiling)."""
    if plan.compute_mode != ComputeMode.SM_SHARING:
        return None
    return plan.active_thread_percentage or default


def _compute_text(percentage: int | None) -> str:
    if percentage is not None:
        return (
            f"compute: {ComputeMode.SM_SHARING}, at most {percentage}% of the GPU's SMs "
            "(a ceiling, not a reservation)"
        )
    return (
        f"compute: {ComputeMode.TIME_SLICING}, no compute share guaranteed (claims on the GPU "
        "take turns)"
    )


def condition_message(
    plan: DevicePlan, enforcement: Enforcement, percentage: int | None = None
) -> str:
    """One paragraph for the user: the ceiling, who enforces it (and, below ``hard``, why not
    more), and the compute share."""
    tier = enforcement.tier
    limit = canonical_quantity(plan.memory_limit_bytes)
    where = f"GPU {plan.gpu.index} ({plan.gpu.name}, {plan.gpu.uuid})"
    if tier == Tier.HARD:
        head = (
            f"memory ceiling {limit} on {where} is enforced by the driver for every process of "
            "the claim (MPS pinned memory limit and per-container limit)"
        )
    elif tier == Tier.COOPERATIVE:
        head = (
            f"memory ceiling {limit} on {where} is set as the MPS pinned memory limit of the "
            "claim's processes, but it is not enforced per container on this node: a process "
            "that overrides its MPS settings can exceed it"
        )
    else:
        head = (
            f"memory ceiling {limit} on {where} is accounted by the scheduler but not enforced "
            "(no usable MPS on this GPU): a process can use the whole card"
        )
    why = (
        f" ({'; '.join(enforcement.reasons)})" if enforcement.reasons and tier != Tier.HARD else ""
    )
    return f"{head}{why}; {_compute_text(percentage)}"


def root_condition(plan: DevicePlan, now: str) -> dict[str, Any]:
    """The ``NonRootClients=False`` condition of an MPS device whose claim has a container
    that runs as root."""
    where = f"GPU {plan.gpu.index} ({plan.gpu.uuid})"
    return {
        "type": ROOT_CONDITION_TYPE,
        "status": "False",
        "reason": "ContainerRunsAsRoot",
        "message": (
            f"a container of this claim runs as UID 0 on {where}, which MPS serves: a root MPS "
            "client can change the limits of its neighbours' namespaces; run the pod as "
            "non-root (securityContext.runAsNonRoot, Pod Security restricted)"
        ),
        "lastTransitionTime": now,
    }


def consumers_data(plan: DevicePlan, running: Sequence[str]) -> dict[str, Any]:
    """The ``data.consumers`` of an MPS device: how many containers may use the claim at once
    (``maxConsumers``), what each may hold of this device (its request and ceiling divided
    among them, whole MiB) and who runs now (``<namespace>/<pod>/<container>``, sorted, at most
    :data:`MAX_LISTED_CONSUMERS`)."""
    n = plan.max_consumers
    return {
        "max": n,
        "each": {
            "request": canonical_quantity(plan.memory_request_bytes // MIB // n * MIB),
            "limit": canonical_quantity(plan.memory_limit_bytes // MIB // n * MIB),
        },
        "running": sorted(running)[:MAX_LISTED_CONSUMERS],
    }


def device_status(
    plan: DevicePlan,
    driver: str,
    enforcement: Enforcement,
    now: str,
    default_percentage: int,
    runs_as_root: bool = False,
    consumers: Sequence[str] = (),
    clients: ClientsCondition | None = None,
) -> dict[str, Any]:
    """The ``status.devices[]`` entry of one planned device (API JSON, camelCase).

    Args:
        plan: the device as prepared.
        driver: our driver name (``driver`` of the entry).
        enforcement: the enforcement of the device's GPU.
        now: ``lastTransitionTime`` of the condition (RFC 3339, e.g. ``2026-12-01T10:00:00Z``).
        default_percentage: active thread percentage of sm-sharing claims that set none.
        runs_as_root: a container of the claim runs as root; an MPS device (tier hard or
            cooperative) then also gets :func:`root_condition`.
        consumers: the claim's running consumers (``<namespace>/<pod>/<container>``); an MPS
            device lists them in :func:`consumers_data`.
        clients: the claim's ``MpsClientsConnected`` condition, on an MPS device (None: none).
    """
    if plan.admin_access:
        return _admin_status(plan, driver, now)
    tier = enforcement.tier
    percentage = active_thread_percentage(plan, default_percentage)
    data: dict[str, Any] = {
        "gpu": {"uuid": plan.gpu.uuid, "index": plan.gpu.index, "productName": plan.gpu.name},
        "memory": {
            "request": canonical_quantity(plan.memory_request_bytes),
            "requestBytes": plan.memory_request_bytes,
            "limit": canonical_quantity(plan.memory_limit_bytes),
            "limitBytes": plan.memory_limit_bytes,
        },
        "computeMode": str(plan.compute_mode),
        "enforcement": str(tier),
    }
    if percentage is not None:
        data["activeThreadPercentage"] = percentage
    if tier != Tier.NONE:
        data["consumers"] = consumers_data(plan, consumers)
    entry: dict[str, Any] = {"driver": driver, "pool": plan.pool, "device": plan.device}
    if plan.share_id:
        entry["shareID"] = plan.share_id
        data["shareID"] = plan.share_id
    entry["data"] = data
    entry["conditions"] = [
        {
            "type": CONDITION_TYPE,
            "status": "True" if tier == Tier.HARD else "False",
            "reason": _REASONS[tier],
            "message": condition_message(plan, enforcement, percentage),
            "lastTransitionTime": now,
        }
    ]
    if runs_as_root and tier != Tier.NONE:
        entry["conditions"].append(root_condition(plan, now))
    if clients is not None and tier != Tier.NONE:
        entry["conditions"].append(
            {
                "type": CLIENTS_CONDITION_TYPE,
                "status": "True" if clients.connected else "False",
                "reason": clients.reason,
                "message": clients.message,
                "lastTransitionTime": clients.since,
            }
        )
    return entry


def _admin_status(plan: DevicePlan, driver: str, now: str) -> dict[str, Any]:
    """The entry of an admin-access device: monitoring access, no fraction."""
    where = f"GPU {plan.gpu.index} ({plan.gpu.name}, {plan.gpu.uuid})"
    entry: dict[str, Any] = {"driver": driver, "pool": plan.pool, "device": plan.device}
    if plan.share_id:
        entry["shareID"] = plan.share_id
    entry["data"] = {
        "gpu": {"uuid": plan.gpu.uuid, "index": plan.gpu.index, "productName": plan.gpu.name},
        "access": "admin",
    }
    entry["conditions"] = [
        {
            "type": CONDITION_TYPE,
            "status": "False",
            "reason": "AdminAccess",
            "message": (
                f"admin access to {where}: its device nodes for monitoring, no MPS namespace "
                "and no memory ceiling; the scheduler does not count it against the GPU"
            ),
            "lastTransitionTime": now,
        }
    ]
    return entry


def device_entries(
    plan: ClaimPlan,
    driver: str,
    enforcement: Mapping[str, Enforcement],
    now: str,
    default_percentage: int = 100,
    runs_as_root: bool = False,
    consumers: Sequence[str] = (),
    clients: ClientsCondition | None = None,
) -> list[dict[str, Any]]:
    """One :func:`device_status` entry per planned device. ``enforcement``: by GPU UUID
    (missing: :data:`NOT_ENFORCED`); ``default_percentage``, ``runs_as_root``, ``consumers``,
    ``clients``: see :func:`device_status`."""
    return [
        device_status(
            d,
            driver,
            enforcement.get(d.gpu.uuid, NOT_ENFORCED),
            now,
            default_percentage,
            runs_as_root,
            consumers,
            clients,
        )
        for d in plan.devices
    ]


def _without_times(entry: Mapping[str, Any]) -> dict[str, Any]:
    conditions = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in entry.get("conditions") or []
    ]
    return {**entry, "conditions": conditions}


def _key(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    def get(name: str) -> str:
        return str(entry.get(name) or "")

    return (get("driver"), get("pool"), get("device"), get("shareID"))


def already_written(claim: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``claim`` (API JSON as read) already carries every one of ``entries``
    (condition times aside), so no write is needed."""
    have = {_key(e): _without_times(e) for e in (claim.get("status") or {}).get("devices") or []}
    return all(have.get(_key(e)) == _without_times(e) for e in entries)


def allocated_node(claim: Mapping[str, Any]) -> str | None:
    """The node a claim is allocated to, as the API server reads it for the ``associated-node``
    check (a node selector of one term with one ``metadata.name In [node]`` field), or None."""
    selector = ((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector") or {}
    terms = selector.get("nodeSelectorTerms") or []
    if len(terms) != 1 or terms[0].get("matchExpressions"):
        return None
    fields = terms[0].get("matchFields") or []
    if len(fields) != 1:
        return None
    field = fields[0]
    values = field.get("values") or []
    if field.get("key") != "metadata.name" or field.get("operator") != "In" or len(values) != 1:
        return None
    node: str = values[0]
    return node
