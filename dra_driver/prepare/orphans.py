"""Prepared claims that will never get their Unprepare: found and released.

The kubelet sends ``NodeUnprepareResources`` when the pods that used a claim have ended. When a
pod and its claim are force-deleted while the plugin is away, the kubelet may never send it,
and the fraction stays held: its MPS namespace and limits, its CDI spec, its checkpoint record
and its share of the GPU that the scheduler already gave to others (public reports of another
DRA GPU driver: kubernetes-sigs/dra-driver-nvidia-gpu#1278 and #840, a fraction held for six
hours).

The sweep (:class:`OrphanSweep`) looks at every checkpointed claim:

- **live**: the claim exists with the recorded UID and has an allocation result of this driver
  in this node's pool. Left alone; a claim whose pod is still Pending is allocated, so live.
- **gone**: the API server answers 404, or a claim of that name has another UID.
- **not allocated here**: the claim exists but none of its allocation results is ours on this
  node (it was deallocated, or allocated elsewhere).
- **unknown**: the API server did not answer. Left alone until a later sweep.

A gone or not-allocated-here claim is an orphan only while none of its consumers runs (the
consumer gate's records, :mod:`dra_driver.observe.consumers`): a container that still runs
keeps its claim until it ends (the kubelet then unprepares it). An orphan is released once two
sweeps at least ``confirm`` seconds apart found it so, and the claim is read a last time under
the prepare lock, so a Prepare of the same claim cannot slip in between (a claim shared by pods
can be deallocated and allocated to this node again with the same UID). Release is the same
code as the kubelet's Unprepare: checkpoint record, MPS namespace and limits (clients
terminated), CDI spec.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import Any, Protocol

import structlog

from dra_driver.infra.metrics import Metrics
from dra_driver.model.errors import PrepareError
from dra_driver.model.plans import ClaimRef
from dra_driver.prepare.claims import ClaimNotFound, ClaimReader

log = structlog.get_logger(__name__)

CONFIRM_AFTER_S = 30.0
"""Seconds between the sweep that first finds an orphan and the one that releases it."""

READ_TIMEOUT_S = 5.0
"""Seconds per claim read."""


class Verdict(StrEnum):
    """What the API server says of a checkpointed claim."""

    LIVE = "live"
    GONE = "gone"
    NOT_ALLOCATED_HERE = "not_allocated_here"
    UNKNOWN = "unknown"


ORPHANED = (Verdict.GONE, Verdict.NOT_ALLOCATED_HERE)
"""The verdicts that make a claim an orphan (when none of its consumers runs)."""


def allocated_here(claim: Mapping[str, Any], driver: str, pool: str) -> bool:
    """Pure: whether ``status.allocation.devices.results`` has a result of ``driver`` in
    ``pool`` (this node's pool); anything malformed counts as not allocated."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return any(
        isinstance(r, Mapping) and r.get("driver") == driver and r.get("pool") == pool
        for r in results
    )


def verdict(claim: Mapping[str, Any] | None, uid: str, driver: str, pool: str) -> Verdict:
    """Pure: the verdict of a checkpointed claim of UID ``uid``, from its read (None: 404)."""
    if claim is None or (claim.get("metadata") or {}).get("uid") != uid:
        return Verdict.GONE
    if not allocated_here(claim, driver, pool):
        return Verdict.NOT_ALLOCATED_HERE
    return Verdict.LIVE


def due(
    first_seen: Mapping[str, float], orphans: Iterable[str], now: float, confirm: float
) -> tuple[list[str], dict[str, float]]:
    """Pure: the orphans to release now, and when each current orphan was first seen.

    Args:
        first_seen: claim UID -> monotonic seconds when a sweep first found it orphaned.
        orphans: the UIDs this sweep found orphaned.
        now: monotonic seconds of this sweep.
        confirm: seconds an orphan must have been seen before it is released.

    Returns:
        ``(release, seen)``: the UIDs seen at least ``confirm`` seconds ago (sorted), and
        ``first_seen`` kept for this sweep's orphans only (a claim found live again is
        forgotten).
    """
    seen = {uid: first_seen.get(uid, now) for uid in orphans}
    return sorted(u for u, t in seen.items() if now - t >= confirm), seen


class Releaser(Protocol):
    """Unprepares a claim if a last check under the prepare lock still allows it
    (:meth:`dra_driver.prepare.preparation.ClaimPreparation.release_orphan`)."""

    def release_orphan(self, ref: ClaimRef, still: Callable[[], bool]) -> str | None:
        """``None`` if released, else why not (kept or failed)."""
        ...


@dataclass
class OrphanSweep:
    """Finds and releases orphaned claims (see the module); :meth:`run` is a thread target.

    Args:
        releaser: the claim preparation.
        records: the checkpointed claims now (``ClaimPreparation.prepared_refs``).
        reader: reads a claim from the API server.
        consumers_running: claim UID -> whether a consumer of the claim still runs.
        driver: our driver name.
        pool: this node's pool (the node name).
        metrics: counts ``dra_gpu_fraction_orphaned_claims_released_total{reason}``.
        confirm: :data:`CONFIRM_AFTER_S`.
        clock: ``time.monotonic``.
    """

    releaser: Releaser
    records: Callable[[], list[ClaimRef]]
    reader: ClaimReader
    consumers_running: Callable[[str], bool]
    driver: str
    pool: str
    metrics: Metrics
    confirm: float = CONFIRM_AFTER_S
    clock: Callable[[], float] = time.monotonic
    _first_seen: dict[str, float] = field(default_factory=dict)

    def read(self, ref: ClaimRef) -> Verdict:
        """The claim's verdict from one read of the API server."""
        try:
            claim = self.reader.read(ref.namespace, ref.name, READ_TIMEOUT_S)
        except ClaimNotFound:
            return verdict(None, ref.uid, self.driver, self.pool)
        except PrepareError as exc:
            log.info(
                "claim not read; its record is checked again at the next sweep",
                claim_uid=ref.uid,
                namespace=ref.namespace,
                name=ref.name,
                error=str(exc)[:300],
            )
            return Verdict.UNKNOWN
        return verdict(claim, ref.uid, self.driver, self.pool)

    def orphaned(self, ref: ClaimRef) -> Verdict | None:
        """The claim's verdict if it is an orphan now, else None."""
        found = self.read(ref)
        if found not in ORPHANED or self.consumers_running(ref.uid):
            return None
        return found

    def still_orphaned(self, ref: ClaimRef) -> bool:
        """Whether the claim is an orphan on a new read (the last check before release)."""
        return self.orphaned(ref) is not None

    def sweep(self) -> tuple[list[str], bool]:
        """One sweep: returns the UIDs released and whether orphans wait for confirmation."""
        refs = {r.uid: r for r in self.records()}
        found = {uid: v for uid, ref in refs.items() if (v := self.orphaned(ref)) is not None}
        release, self._first_seen = due(self._first_seen, found, self.clock(), self.confirm)
        released = []
        for uid in release:
            ref = refs[uid]
            bound = log.bind(claim_uid=uid, namespace=ref.namespace, name=ref.name)
            why = self.releaser.release_orphan(ref, partial(self.still_orphaned, ref))
            self._first_seen.pop(uid, None)
            if why is not None:
                bound.info("orphaned claim not released", reason=why[:300])
                continue
            released.append(uid)
            self.metrics.orphaned_claims_released.labels(reason=str(found[uid])).inc()
            bound.warning(
                "released a prepared claim that will never get its Unprepare (its pods and "
                "claim were deleted while the plugin was away, or the kubelet lost them)",
                verdict=str(found[uid]),
            )
        return released, bool(self._first_seen)

    def run(self, stop: threading.Event, first_after: float, interval: float) -> None:
        """Sweep ``first_after`` seconds after the call, then every ``interval`` seconds, or
        ``confirm`` seconds after a sweep that found orphans not yet released, until ``stop``
        (thread target; a sweep that fails is logged and the next one runs)."""
        wait = first_after
        while not stop.wait(wait):
            pending = False
            try:
                _, pending = self.sweep()
            except Exception:  # keep sweeping whatever happens
                log.exception("orphaned claim sweep failed")
            wait = self.confirm if pending else interval
