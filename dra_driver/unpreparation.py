"""Unprepare: the records go first, then each claim's enforcement and CDI spec.

The order keeps the crash-consistency rule of :mod:`dra_driver.preparation`: a kill between the
checkpoint save and the removals leaves artifacts without a record, which start-up removes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import structlog

from dra_driver import budget, cdifiles
from dra_driver.budget import Budget, check_started, lock_timeout_message
from dra_driver.checkpoint import Checkpoint
from dra_driver.claimplan import ClaimRef, PrepareError, validate_uid
from dra_driver.claimreads import UnpreparedLog
from dra_driver.errors import CLAIM_ERRORS
from dra_driver.locking import LockTimeout, PrepareLock
from dra_driver.metrics import Metrics
from dra_driver.mps import FractionEnforcer
from dra_driver.podclaims import PodClaims

log = structlog.get_logger(__name__)


class PreparationParts(Protocol):
    """The parts of the node's claim preparation that Unprepare uses
    (:class:`dra_driver.preparation.ClaimPreparation`, which calls :func:`unprepare`)."""

    driver_name: str
    cdi_root: Path
    call_budget: float
    lock: PrepareLock
    checkpoint: Checkpoint
    metrics: Metrics
    pod_claims: PodClaims
    enforcer: FractionEnforcer
    unprepared_here: UnpreparedLog


def unprepare(prep: PreparationParts, refs: Iterable[ClaimRef]) -> dict[str, str]:
    """Unprepare each claim (unknown claims succeed); returns error text by UID ("" = ok).

    The records go first (one checkpoint save), then each claim's enforcement and CDI
    spec, so a kill in between leaves artifacts without a record, which start-up removes.
    If the checkpoint cannot be written, the records are put back, nothing is removed and
    those claims fail, so the kubelet's retry finds them again (memory never runs ahead
    of disk).
    """
    refs = list({r.uid: r for r in refs}.values())
    started = time.perf_counter()
    call = Budget.of(prep.call_budget)
    try:
        errors = _unprepare_locked(prep, refs, call)
    except LockTimeout as exc:
        errors = dict.fromkeys((r.uid for r in refs), lock_timeout_message(call, exc))
    prep.metrics.observe("unprepare", len(refs), time.perf_counter() - started)
    return errors


def _unprepare_locked(prep: PreparationParts, refs: list[ClaimRef], call: Budget) -> dict[str, str]:
    """The part of :meth:`unprepare` under the lock.

    Raises:
        LockTimeout: the lock was not obtained within the call's budget.
    """
    errors: dict[str, str] = {}
    with budget.within(call), prep.lock.held(timeout=call.remaining()):
        prep.checkpoint.reload_if_changed()
        valid: list[ClaimRef] = []
        for ref in refs:
            try:
                validate_uid(ref.uid)
                valid.append(ref)
            except PrepareError as exc:
                errors[ref.uid] = _unprepare_failed(prep, ref, exc)
        removed = {
            r.uid: record
            for r in valid
            if (record := prep.checkpoint.claims.pop(r.uid, None)) is not None
        }
        if removed:
            try:
                prep.checkpoint.save()
            except OSError as exc:
                prep.checkpoint.claims.update(removed)
                for uid in removed:
                    errors[uid] = f"checkpoint write to {prep.checkpoint.path} failed: {exc}"
                valid = [r for r in valid if r.uid not in removed]
            else:
                for uid in removed:
                    prep.unprepared_here.add(uid)
        for ref in valid:
            errors[ref.uid] = _remove_artifacts(prep, ref, call)
    return errors


def _remove_artifacts(prep: PreparationParts, ref: ClaimRef, call: Budget) -> str:
    """Release the claim's enforcement and remove its CDI spec; "" or the error text."""
    try:
        check_started(call, "unpreparing", f"{ref.namespace}/{ref.name}")
        prep.pod_claims.forget(ref.uid)
        prep.enforcer.release(ref.uid)
        cdifiles.remove_spec(prep.cdi_root, prep.driver_name, ref.uid)
    except Exception as exc:  # a bug must fail this claim only, not the batch
        return _unprepare_failed(prep, ref, exc)
    log.info("claim unprepared", claim_uid=ref.uid, namespace=ref.namespace, name=ref.name)
    return ""


def _unprepare_failed(prep: PreparationParts, ref: ClaimRef, exc: Exception) -> str:
    """Log and count a failed unprepare; return the error text for the kubelet."""
    prep.metrics.errors.labels(operation="unprepare").inc()
    bound = log.bind(claim_uid=ref.uid, namespace=ref.namespace, name=ref.name)
    if isinstance(exc, CLAIM_ERRORS):
        bound.warning("claim unprepare failed", error=str(exc))
        return str(exc)
    bound.exception("claim unprepare failed unexpectedly")
    return f"internal error: {exc!r}"
