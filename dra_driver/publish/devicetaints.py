"""Pure decision: which GPUs' devices carry a taint in the published ResourceSlices.

A GPU is tainted while it is unhealthy, with one taint on every device of the GPU:

- ``key``: ``<driver>/gpu-unhealthy`` (:func:`taint_key`);
- ``value``: ``gpu-lost`` when the GPU left the inventory (NVML no longer lists it or cannot
  read it) or ``mps-check-failed`` when its last enforcement health check failed (MPS daemon
  or server down and not yet repaired); a lost GPU is ``gpu-lost`` whatever its last check;
- ``effect``: ``NoSchedule``: the scheduler allocates the devices only to claims that
  tolerate the taint; claims already allocated stay (the driver evicts nothing; an
  administrator's DeviceTaintRule with ``NoExecute`` does, see docs/admin-guide.md);
- ``timeAdded``: when this plugin process first saw the GPU unhealthy for that reason, in
  whole seconds (RFC 3339, UTC), so that publishing the same taint again renders the same
  slice body and causes no write.

A lost GPU's devices stay published, tainted, from the GPU's last record seen since the plugin
started (:func:`published_inventory`); the taint goes when the GPU is healthy again. The rules
on taints are those of the resource.k8s.io/v1 API (``DeviceTaint`` in k8s.io/api
``resource/v1/types.go``; DRADeviceTaints, GA in Kubernetes 1.37).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from dra_driver.model.gpu import Gpu, Inventory

TAINT_NAME = "gpu-unhealthy"
"""The name part of the taint key (its prefix is the driver name)."""

GPU_LOST = "gpu-lost"
"""Taint value: the GPU left the node's GPU inventory."""

MPS_CHECK_FAILED = "mps-check-failed"
"""Taint value: the GPU's last enforcement (MPS) health check failed."""

NO_SCHEDULE = "NoSchedule"
"""Taint effect: no new allocation unless tolerated; allocated claims stay."""


def taint_key(driver: str) -> str:
    """The taint key of ``driver`` (a DNS subdomain): ``<driver>/gpu-unhealthy``."""
    return f"{driver}/{TAINT_NAME}"


def rfc3339(moment: datetime) -> str:
    """``moment`` in UTC, whole seconds, as RFC 3339 (``2026-01-02T03:04:05Z``).

    Raises:
        ValueError: ``moment`` is naive (no time zone).
    """
    if moment.tzinfo is None:
        raise ValueError(f"{moment!r} has no time zone")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class DeviceTaint:
    """One taint of a GPU's devices.

    Attributes:
        key: ``<driver>/gpu-unhealthy``.
        value: :data:`GPU_LOST` or :data:`MPS_CHECK_FAILED`.
        time_added: RFC 3339 UTC, whole seconds (see :func:`rfc3339`).
        effect: :data:`NO_SCHEDULE`.
    """

    key: str
    value: str
    time_added: str
    effect: str = NO_SCHEDULE

    def body(self) -> dict[str, str]:
        """The taint as resource.k8s.io/v1 API JSON (a device's ``taints[]`` entry)."""
        return {
            "key": self.key,
            "value": self.value,
            "effect": self.effect,
            "timeAdded": self.time_added,
        }


def lost_gpus(current: Inventory, seen: Iterable[Gpu]) -> dict[str, Gpu]:
    """GPUs seen since start but absent from ``current`` (by UUID), with their last record.

    Args:
        current: the latest discovery; its ``skipped`` GPUs (unreadable) count as absent.
        seen: GPU records seen since the plugin started, oldest first (a later record of the
            same UUID replaces an earlier one).
    """
    present = {g.uuid for g in current.gpus}
    return {g.uuid: g for g in seen if g.uuid not in present}


def published_inventory(current: Inventory, lost: Mapping[str, Gpu]) -> Inventory:
    """The inventory whose devices are published: ``current`` plus the ``lost`` GPUs, in
    index order. Device and counter-set names follow the index, so one GPU per index is
    published: a present GPU wins over lost ones, and of several lost GPUs that had one index
    (a card swapped, then lost too) the newest card (``lost`` is in the order first seen)."""
    taken = {g.index for g in current.gpus}
    kept = {g.index: g for g in lost.values() if g.index not in taken}
    if not kept:
        return current
    gpus = tuple(sorted((*current.gpus, *kept.values()), key=lambda g: g.index))
    return Inventory(gpus=gpus, skipped=current.skipped)


def gpu_taints(
    driver: str,
    lost: Iterable[str],
    unhealthy_gpus: Mapping[str, str],
    previous: Mapping[str, DeviceTaint],
    now: datetime,
) -> dict[str, DeviceTaint]:
    """GPU UUID -> the taint of its devices, for every unhealthy GPU (healthy ones: absent).

    Args:
        driver: the DRA driver name (taint key prefix).
        lost: UUIDs of GPUs that left the inventory (:func:`lost_gpus`).
        unhealthy_gpus: GPU UUID -> reason, from the last enforcement health check.
        previous: the result of the previous call; a GPU tainted with the same value keeps
            its ``time_added``, a new or changed taint gets ``now``.
        now: the current time (time-zone aware).

    Raises:
        ValueError: ``now`` is naive.
    """
    values = {uuid: MPS_CHECK_FAILED for uuid in unhealthy_gpus}
    values.update({uuid: GPU_LOST for uuid in lost})
    stamp = rfc3339(now)
    key = taint_key(driver)
    out: dict[str, DeviceTaint] = {}
    for uuid, value in sorted(values.items()):
        before = previous.get(uuid)
        if before is not None and before.key == key and before.value == value:
            out[uuid] = before
        else:
            out[uuid] = DeviceTaint(key=key, value=value, time_added=stamp)
    return out


def utc_now() -> datetime:
    """The current time in UTC (:class:`TaintMemory`'s default clock)."""
    return datetime.now(UTC)


class TaintMemory:
    """Remembers the taints of the last publish, so a taint that stays keeps its time.

    Args:
        clock: returns the current time, time-zone aware (default :func:`utc_now`).
    """

    def __init__(self, clock: Callable[[], datetime] = utc_now) -> None:
        self._clock = clock
        self.taints: dict[str, DeviceTaint] = {}
        """GPU UUID -> taint, from the last :meth:`update`."""

    def update(
        self,
        driver: str,
        current: Inventory,
        seen: Iterable[Gpu],
        unhealthy_gpus: Mapping[str, str],
    ) -> tuple[Inventory, dict[str, DeviceTaint]]:
        """The inventory to publish (:func:`published_inventory`) and GPU UUID -> taint of its
        devices (:func:`gpu_taints`), remembered for the next call.

        Args:
            driver: the DRA driver name.
            current: the latest discovery.
            seen: GPU records seen since the plugin started, oldest first.
            unhealthy_gpus: GPU UUID -> reason, from the last enforcement health check.
        """
        lost = lost_gpus(current, seen)
        self.taints = gpu_taints(driver, lost, unhealthy_gpus, self.taints, self._clock())
        return published_inventory(current, lost), self.taints
