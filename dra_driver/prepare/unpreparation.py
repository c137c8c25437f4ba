"""Unprepare: the records go first, then each claim's enforcement and CDI spec.

The order keeps the crash-consistency rule of :mod:`dra_driver.prepare.preparation`: a kill
between the checkpoint save and the removals leaves artifacts without a record, which start-up
removes. If the checkpoint cannot be written, the records are put back, nothing is removed and
those claims fail, so the kubelet's retry finds them again (memory never runs ahead of disk).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from dra_driver.enforce import FractionEnforcer
from dra_driver.infra import budget
from dra_driver.infra.budget import Budget, check_started
from dra_driver.infra.locking import PrepareLock
from dra_driver.model.errors import PrepareError
from dra_driver.model.ids import validate_uid
from dra_driver.model.plans import ClaimRef
from dra_driver.prepare.cdispecs import CdiSpecs
from dra_driver.prepare.checkpoint import Checkpoint
from dra_driver.prepare.podclaims import PodClaims
from dra_driver.prepare.reads import UnpreparedLog

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Unpreparation:
    """The parts an Unprepare call changes: the lock it holds, the checkpoint whose records
    go first, then each claim's enforcement, CDI spec and pod record; ``unprepared`` notes
    each claim this plugin unprepared (for a Prepare that lost the lock to it); ``still``,
    when given, is asked under the lock whether each claim may still go (the orphan sweep's
    last read, :mod:`dra_driver.prepare.orphans`), and a claim it keeps is left as it is
    (result None)."""

    lock: PrepareLock
    checkpoint: Checkpoint
    enforcer: FractionEnforcer
    cdi: CdiSpecs
    pod_claims: PodClaims
    unprepared: UnpreparedLog
    still: Callable[[ClaimRef], bool] | None = None

    def call(self, refs: list[ClaimRef], call: Budget) -> dict[str, None | Exception]:
        """The claims of one Unprepare call: per claim UID None (done; unknown claims too) or
        why it failed (see :func:`~dra_driver.prepare.callshell.run_call`).

        Raises:
            LockTimeout: the lock was not obtained within the call's budget.
        """
        results: dict[str, None | Exception] = {}
        with budget.within(call), self.lock.held(timeout=call.remaining()):
            self.checkpoint.reload_if_changed()
            valid = []
            for ref in refs:
                try:
                    validate_uid(ref.uid)
                except PrepareError as exc:
                    results[ref.uid] = exc
                    continue
                if self.still is None or self.still(ref):
                    valid.append(ref)
                else:
                    results[ref.uid] = None
            removed = {
                r.uid: record
                for r in valid
                if (record := self.checkpoint.claims.pop(r.uid, None)) is not None
            }
            if removed:
                try:
                    self.checkpoint.save()
                except OSError as exc:
                    self.checkpoint.claims.update(removed)
                    failed = PrepareError(
                        f"checkpoint write to {self.checkpoint.path} failed: {exc}"
                    )
                    results.update(dict.fromkeys(removed, failed))
                    valid = [r for r in valid if r.uid not in removed]
                else:
                    for uid in removed:
                        self.unprepared.add(uid)
            for ref in valid:
                try:
                    self._remove_artifacts(ref, call)
                    results[ref.uid] = None
                except Exception as exc:  # this claim fails alone (run_call says why)
                    results[ref.uid] = exc
        return results

    def _remove_artifacts(self, ref: ClaimRef, call: Budget) -> None:
        """Release the claim's enforcement and remove its CDI spec."""
        check_started(call, "unpreparing", f"{ref.namespace}/{ref.name}")
        self.pod_claims.forget(ref.uid)
        self.enforcer.release(ref.uid)
        self.cdi.remove(ref.uid)
        log.info("claim unprepared", claim_uid=ref.uid, namespace=ref.namespace, name=ref.name)
