"""The node's claim preparation: Prepare and Unprepare, the effects around the pure claim plan
(:mod:`dra_driver.claimplan`): API read, enforcement (:mod:`dra_driver.mps`), CDI spec,
checkpoint.

Crash consistency: once :meth:`ClaimPreparation.start` has run after a kill at any instant,
each claim is either prepared (checkpoint record, a CDI spec listing the recorded CDI devices,
and its enforcement) or absent (none of them). The orders that make it so:

- Prepare: plan -> enforcer.apply -> CDI spec write -> checkpoint save. Killed before the
  save, a claim has no record, and start-up removes what it left.
- Unprepare: checkpoint save without the records -> enforcer.release -> CDI spec removal.
  Killed before the save, the claim is intact; after it, start-up removes what is left.
- Start-up: the enforcer re-applies recorded claims and removes the enforcement of others
  (``restore``); CDI specs without a record are removed; a recorded claim whose spec is
  missing or lists other devices gets it rewritten.
- Prepare of a recorded claim first re-creates what is missing (enforcement re-applied from
  the recorded plan, CDI spec rewritten), then answers from the record.

Time: each call has a budget (:mod:`dra_driver.budget`, ``--call-budget``) shared by its
claims. Claims are read from the API server first, in parallel, without the prepare lock (a
hung read must not hold up other calls) and within half of the budget; the lock is then taken
for the node-side work.
A claim whose read, lock wait or MPS commands run out of the budget fails alone with a
message saying so; the kubelet retries it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import structlog

from dra_driver import budget, cdi, cdifiles, unpreparation
from dra_driver.atomicfile import remove_temp_files
from dra_driver.budget import (
    DEFAULT_CALL_BUDGET_S,
    STARTUP_BUDGET_S,
    Budget,
    check_started,
    lock_timeout_message,
)
from dra_driver.cdifiles import spec_matches, write_claim_spec
from dra_driver.checkpoint import Checkpoint, CheckpointCorrupt, ClaimRecord, PreparedDevice
from dra_driver.claimplan import (
    NO_NODE_CAPS,
    CapPolicy,
    ClaimPlan,
    ClaimRef,
    PrepareError,
    plan_claim,
    validate_uid,
)
from dra_driver.claimreads import ClaimReads, UnpreparedLog, unread_error
from dra_driver.claims import ClaimReader
from dra_driver.devicenodes import check_device_nodes
from dra_driver.devices import FractionDevice
from dra_driver.errors import CLAIM_ERRORS
from dra_driver.locking import LockTimeout, PrepareLock
from dra_driver.metrics import Metrics
from dra_driver.mps import FractionEnforcer
from dra_driver.overcommit import overcommit_error
from dra_driver.podclaims import PodClaims

log = structlog.get_logger(__name__)

CLAIM_READ_SHARE = 0.5
"""Part of a call's budget its claim reads may take; the rest is kept for the node-side work
of the claims that were read (so hung reads cannot starve the good claims of a batch)."""

__all__ = ["ClaimPreparation", "PrepareOutcome", "PreparedDevice"]


@dataclass(frozen=True)
class PrepareOutcome:
    """Per-claim result: the devices, or an error message for the kubelet (never both)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class ClaimPreparation:
    """The node-side driver: serialized, idempotent Prepare/Unprepare of claims.

    Args:
        driver_name: our DRA driver name (also the CDI vendor).
        pool: this node's pool name (the node name).
        reader: reads ResourceClaims from the API server.
        devices: returns the node's current fraction devices by name.
        enforcer: applies MPS ceilings/compute mode.
        cdi_root: CDI spec directory (``/var/run/cdi``).
        state_dir: holds ``checkpoint.json``.
        lock: the Prepare/Unprepare lock shared with other plugin instances.
        boot_id: the node's boot ID (a different one resets the checkpoint).
        device_root: host directory holding the ``dev/nvidia*`` nodes that CDI specs name
            (``/`` on a real node; a simulated node's simulation root).
        call_budget: seconds each Prepare/Unprepare call may take, shared by its claims
            (below the kubelet's 45 s; ``--call-budget``).
        startup_budget: seconds :meth:`start` may spend re-applying enforcement; claims not
            restored by then stay pending and the enforcer's health checks retry them.
        device_root_view: where the plugin sees ``device_root`` to check that the nodes exist
            (:mod:`dra_driver.devicenodes`); default ``device_root`` itself.
        on_prepared: called with the plan of each claim once it is prepared and recorded, and
            of each recorded claim at :meth:`start` (the claim status writer's ``submit``);
            it must return at once.
        caps: the node's caps on what claims may ask and its default SM ceiling
            (:class:`~dra_driver.claimcaps.CapPolicy`).
    """

    def __init__(
        self,
        *,
        driver_name: str,
        pool: str,
        reader: ClaimReader,
        devices: Callable[[], Mapping[str, FractionDevice]],
        enforcer: FractionEnforcer,
        cdi_root: str | Path,
        state_dir: str | Path,
        lock: PrepareLock,
        boot_id: str,
        metrics: Metrics | None = None,
        device_root: str | Path = "/",
        call_budget: float = DEFAULT_CALL_BUDGET_S,
        startup_budget: float = STARTUP_BUDGET_S,
        device_root_view: str | Path | None = None,
        on_prepared: Callable[[ClaimPlan], None] | None = None,
        caps: CapPolicy = NO_NODE_CAPS,
    ) -> None:
        self.driver_name = driver_name
        self.pool = pool
        self.reader = reader
        self.devices = devices
        self.enforcer = enforcer
        self.cdi_root = Path(cdi_root)
        self.device_root = Path(device_root)
        self.device_root_view = Path(device_root_view or device_root)
        self.lock = lock
        self.checkpoint = Checkpoint(state_dir, boot_id)
        self.metrics = metrics or Metrics()
        self.call_budget = call_budget
        self.startup_budget = startup_budget
        self._reads = ClaimReads(lambda: self.reader)
        self.pod_claims = PodClaims()
        self.on_prepared = on_prepared or (lambda plan: None)
        self.caps = caps
        self.unprepared_here = UnpreparedLog()

    def start(self) -> None:
        """Load the checkpoint and reconcile records, enforcement and CDI specs both ways:
        prepared claims are re-applied (and their missing specs rewritten), enforcement and
        CDI specs of claims without a record are removed.

        A corrupt checkpoint is logged as an error and kept aside; enforcement is then left
        as it is (no restore, which would tear down the namespaces of running claims) and
        the sweep is skipped, so running containers keep their CDI specs and MPS settings.
        """
        with self.lock.held():
            remove_temp_files(self.cdi_root, self.checkpoint.path.parent)
            try:
                same_boot = self.checkpoint.load()
                if not same_boot:
                    log.warning(
                        "checkpoint from an earlier boot discarded", path=str(self.checkpoint.path)
                    )
            except CheckpointCorrupt as exc:
                self.metrics.errors.labels(operation="checkpoint").inc()
                log.error(
                    "checkpoint corrupt; starting with no prepared claims and leaving existing "
                    "CDI specs and MPS state in place (unprepare still removes them by claim UID)",
                    error=str(exc),
                )
                self.checkpoint.remember_file()
                return
            self.checkpoint.remember_file()
            with budget.within(Budget.of(self.startup_budget)):
                self.enforcer.restore(self.prepared_plans())
                self._sweep()
                self._rewrite_missing_specs()
            for plan in self.prepared_plans():
                self.on_prepared(plan)

    def _sweep(self) -> None:
        known = set(self.checkpoint.claims)
        for uid in sorted(cdifiles.claim_uids_on_disk(self.cdi_root, self.driver_name) - known):
            try:
                validate_uid(uid)
            except PrepareError:
                continue
            cdifiles.remove_spec(self.cdi_root, self.driver_name, uid)
            self.enforcer.release(uid)
            log.info("removed orphaned CDI spec", claim_uid=uid)

    def _rewrite_missing_specs(self) -> None:
        """Rewrite the spec of every recorded claim whose spec is missing or lists other
        devices (an older version's killed Unprepare removed it before the record)."""
        for uid in sorted(self.checkpoint.claims):
            record = self.checkpoint.claims[uid]
            if not self._spec_ok(record):
                self._claim_outcome(record.plan.claim, partial(self._ensure_artifacts, record))

    def _ensure_artifacts(self, record: ClaimRecord) -> PrepareOutcome:
        """The recorded answer, after re-creating the claim's enforcement and CDI spec from
        the recorded plan if either is missing.

        Raises:
            MpsError, CdiError, OSError: when they cannot be re-created (the record stays, so
                the kubelet's retry tries again).
        """
        plan = record.plan
        if not (self._spec_ok(record) and self.enforcer.enforced(plan)):
            write_claim_spec(
                self.cdi_root, self.driver_name, self.device_root, plan, self.enforcer.apply(plan)
            )
            log.warning(
                "re-created the enforcement and CDI spec of a prepared claim",
                claim_uid=plan.claim.uid,
                namespace=plan.claim.namespace,
                name=plan.claim.name,
            )
        return PrepareOutcome(devices=record.devices)

    def prepare(self, refs: Iterable[ClaimRef]) -> dict[str, PrepareOutcome]:
        """Prepare each claim; each one fails alone. Returns outcomes keyed by claim UID.

        A claim listed twice is prepared once.
        """
        refs = list({r.uid: r for r in refs}.values())
        started = time.perf_counter()
        since = time.monotonic()
        call = Budget.of(self.call_budget)
        # Read outside the lock (claims our snapshot knows are answered from the checkpoint).
        reading = Budget.of(call.seconds * CLAIM_READ_SHARE)
        unknown = [r for r in refs if r.uid not in self.checkpoint.claims]
        claims = self._reads.read_all(unknown, reading, call)
        try:
            outcomes = self._prepare_locked(refs, claims, call, since)
        except LockTimeout as exc:
            error = lock_timeout_message(call, exc)
            outcomes = {r.uid: PrepareOutcome(error=error) for r in refs}
        self.metrics.observe("prepare", len(refs), time.perf_counter() - started)
        return outcomes

    def _prepare_locked(
        self,
        refs: list[ClaimRef],
        claims: Mapping[str, Mapping[str, Any] | Exception],
        call: Budget,
        since: float,
    ) -> dict[str, PrepareOutcome]:
        """The part of :meth:`prepare` under the lock: ``claims`` are the reads (or their
        errors) of the claims that were not prepared when the call came (at ``since``,
        monotonic).

        Raises:
            LockTimeout: the lock was not obtained within the call's budget.
        """
        outcomes: dict[str, PrepareOutcome] = {}
        with budget.within(call), self.lock.held(timeout=call.remaining()):
            self.checkpoint.reload_if_changed()
            todo: list[ClaimRef] = []
            for ref in refs:
                record = self.checkpoint.claims.get(ref.uid)
                if record is not None:
                    step = partial(self._ensure_artifacts, record)
                    outcomes[ref.uid] = self._claim_outcome(ref, step)
                else:
                    todo.append(ref)
            table = self.devices() if todo else {}
            prepared = {p.claim.uid: p for p in self.prepared_plans()} if todo else {}
            fresh: list[str] = []
            for ref in todo:
                here = self.unprepared_here.since(ref.uid, since)
                claim = claims[ref.uid] if ref.uid in claims else unread_error(ref, here)
                step = partial(self._prepare_budgeted, ref, claim, table, prepared, call)
                outcomes[ref.uid] = self._claim_outcome(ref, step)
                if not outcomes[ref.uid].error:
                    fresh.append(ref.uid)
            if fresh:
                try:
                    self.checkpoint.save()
                except OSError as exc:
                    for uid in fresh:
                        self._undo(uid)
                        outcomes[uid] = PrepareOutcome(
                            error=f"checkpoint write to {self.checkpoint.path} failed: {exc}"
                        )
                else:
                    for uid in fresh:
                        self.on_prepared(self.checkpoint.claims[uid].plan)
        return outcomes

    def _claim_outcome(self, ref: ClaimRef, step: Callable[[], PrepareOutcome]) -> PrepareOutcome:
        """``step()``, or the error it raised as this claim's outcome (logged and counted)."""
        bound = log.bind(claim_uid=ref.uid, namespace=ref.namespace, name=ref.name)
        try:
            outcome = step()
        except CLAIM_ERRORS as exc:
            self.metrics.errors.labels(operation="prepare").inc()
            bound.warning("claim prepare failed", error=str(exc))
            return PrepareOutcome(error=str(exc))
        except Exception as exc:  # a bug must fail this claim only, not the batch
            self.metrics.errors.labels(operation="prepare").inc()
            bound.exception("claim prepare failed unexpectedly")
            return PrepareOutcome(error=f"internal error: {exc!r}")
        bound.info("claim prepared", devices=[d.device for d in outcome.devices])
        return outcome

    def _prepare_budgeted(
        self,
        ref: ClaimRef,
        claim: Mapping[str, Any] | Exception,
        table: Mapping[str, FractionDevice],
        prepared: dict[str, ClaimPlan],
        call: Budget,
    ) -> PrepareOutcome:
        """:meth:`_prepare_one` once the claim was read (``claim``: as read, or the error
        reading it raised) and if the call's budget is left."""
        if isinstance(claim, Exception):
            raise claim
        check_started(call, "preparing", f"{ref.namespace}/{ref.name}")
        return self._prepare_one(ref, claim, table, prepared)

    def _prepare_one(
        self,
        ref: ClaimRef,
        claim: Mapping[str, Any],
        table: Mapping[str, FractionDevice],
        prepared: dict[str, ClaimPlan],
    ) -> PrepareOutcome:
        """Prepare one claim as read; ``prepared`` (plans by claim UID) and the in-memory
        checkpoint gain it on success."""
        plan = plan_claim(ref, claim, self.driver_name, self.pool, table, self.caps)
        problem = overcommit_error(plan, (p for u, p in prepared.items() if u != ref.uid))
        if problem:
            raise PrepareError(f"not prepared: {problem}")
        check_device_nodes(self.device_root_view, plan)
        edits = self.enforcer.apply(plan)
        try:
            devices = write_claim_spec(
                self.cdi_root, self.driver_name, self.device_root, plan, edits
            )
        except OSError as exc:
            self.enforcer.release(ref.uid)
            raise PrepareError(f"writing the CDI spec under {self.cdi_root} failed: {exc}") from exc
        except BaseException:
            self.enforcer.release(ref.uid)
            raise
        self.checkpoint.claims[ref.uid] = ClaimRecord(ref.namespace, ref.name, devices, plan)
        prepared[ref.uid] = plan
        self.pod_claims.add(claim, plan)
        return PrepareOutcome(devices=devices)

    def _spec_ok(self, record: ClaimRecord) -> bool:
        return spec_matches(self.cdi_root, self.driver_name, record)

    def _write_spec(
        self, plan: ClaimPlan, edits: Mapping[str, cdi.ContainerEdits]
    ) -> tuple[PreparedDevice, ...]:
        return write_claim_spec(self.cdi_root, self.driver_name, self.device_root, plan, edits)

    def _undo(self, uid: str) -> None:
        self.checkpoint.claims.pop(uid, None)
        self.pod_claims.forget(uid)
        cdifiles.remove_spec(self.cdi_root, self.driver_name, uid)
        self.enforcer.release(uid)

    def unprepare(self, refs: Iterable[ClaimRef]) -> dict[str, str]:
        """Unprepare each claim (unknown claims succeed); returns error text by UID ("" = ok).
        See :func:`dra_driver.unpreparation.unprepare`."""
        return unpreparation.unprepare(self, refs)

    def prepared_plans(self) -> list[ClaimPlan]:
        """Plans of every prepared claim (for metrics and health); safe without the lock.

        ``list(dict.values())`` copies in one step under the GIL, and Prepare/Unprepare only
        add or remove whole records, so the snapshot is consistent.
        """
        return [r.plan for r in list(self.checkpoint.claims.values())]

    def close(self) -> None:
        """Stop the claim-reader threads."""
        self._reads.close()
