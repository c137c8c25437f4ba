"""The node's claim preparation: Prepare and Unprepare, the effects around the pure claim plan
(:mod:`dra_driver.model.plans`): API read, enforcement (:mod:`dra_driver.enforce`), CDI spec,
checkpoint.

Crash consistency: once :meth:`ClaimPreparation.start` has run after a kill at any instant,
each claim is either prepared (checkpoint record, a CDI spec listing the recorded CDI devices,
and its enforcement) or absent (none of them). The orders that make it so:

- Prepare: plan -> enforcer.apply -> CDI spec write -> checkpoint save. Killed before the
  save, a claim has no record, and start-up removes what it left.
- Unprepare: checkpoint save without the records -> enforcer.release -> CDI spec removal.
  Killed before the save, the claim is intact; after it, start-up removes what is left. If
  the save fails, the records are put back and nothing is removed.
- Start-up (:mod:`dra_driver.prepare.startup`): the enforcer re-applies recorded claims and
  removes the enforcement of others; CDI specs without a record are removed; a recorded
  claim whose spec is missing or lists other devices gets it rewritten.
- Prepare of a recorded claim first re-creates what is missing (enforcement re-applied from
  the recorded plan, CDI spec rewritten), then answers from the record.

Time: each call has a budget (:mod:`dra_driver.infra.budget`, ``--call-budget``) shared by its
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

from dra_driver.config.caps import CapPolicy
from dra_driver.enforce import FractionEnforcer
from dra_driver.infra import budget
from dra_driver.infra.atomicfile import remove_temp_files
from dra_driver.infra.budget import (
    DEFAULT_CALL_BUDGET_S,
    STARTUP_BUDGET_S,
    Budget,
    check_started,
)
from dra_driver.infra.locking import PrepareLock
from dra_driver.infra.metrics import Metrics
from dra_driver.model.devices import PublishedDevice
from dra_driver.model.errors import PrepareError
from dra_driver.model.ids import validate_uid
from dra_driver.model.plans import ClaimPlan, ClaimRef, PreparedDevice, prepared_devices
from dra_driver.prepare.callshell import run_call
from dra_driver.prepare.cdispecs import CdiSpecs
from dra_driver.prepare.checkpoint import Checkpoint, ClaimRecord
from dra_driver.prepare.claims import ClaimReader
from dra_driver.prepare.devicenodes import check_device_nodes
from dra_driver.prepare.overcommit import overcommit_error
from dra_driver.prepare.plan import NO_NODE_CAPS, plan_claim
from dra_driver.prepare.podclaims import PodClaims
from dra_driver.prepare.reads import ClaimReads, UnpreparedLog, unread_error
from dra_driver.prepare.startup import load_checkpoint, reconcile

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
        devices: returns the node's current published devices by name.
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
            (:mod:`dra_driver.prepare.devicenodes`); default ``device_root`` itself.
        on_prepared: called with the plan of each claim once it is prepared and recorded, and
            of each recorded claim at :meth:`start` (the claim status writer's ``submit``);
            it must return at once.
        caps: the node's caps on what claims may ask and its default SM ceiling
            (:class:`~dra_driver.config.caps.CapPolicy`).
        node_problem: why the node offers no GPU now (the NVIDIA driver not loaded), or None;
            a new claim then fails with it (recorded claims are still answered and
            unprepared).
    """

    def __init__(
        self,
        *,
        driver_name: str,
        pool: str,
        reader: ClaimReader,
        devices: Callable[[], Mapping[str, PublishedDevice]],
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
        node_problem: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.driver_name = driver_name
        self.pool = pool
        self.reader = reader
        self.devices = devices
        self.enforcer = enforcer
        self.cdi = CdiSpecs(Path(cdi_root), driver_name, Path(device_root))
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
        self.node_problem = node_problem
        self.unprepared_here = UnpreparedLog()

    def start(self) -> None:
        """Load the checkpoint and reconcile records, enforcement and CDI specs both ways
        (:mod:`dra_driver.prepare.startup`; a corrupt checkpoint reconciles nothing), then hand
        every recorded plan to ``on_prepared``."""
        with self.lock.held():
            remove_temp_files(self.cdi.root, self.checkpoint.path.parent)
            if not load_checkpoint(self.checkpoint, self.metrics):
                return
            with budget.within(Budget.of(self.startup_budget)):
                current = {d.gpu.uuid: d.gpu for d in self.devices().values()}
                reconcile(
                    self.checkpoint, self.cdi, self.enforcer, current, self._answer_from_record
                )
            for plan in self.prepared_plans():
                self.on_prepared(plan)

    def _answer_from_record(self, record: ClaimRecord) -> tuple[PreparedDevice, ...]:
        """The recorded answer, after re-creating the claim's enforcement and CDI spec from
        the recorded plan if either is missing.

        Raises:
            MpsError, CdiError, OSError: when they cannot be re-created (the record stays, so
                the kubelet's retry tries again).
        """
        plan = record.plan
        if not (self.cdi.lists(plan.claim.uid, record.devices) and self.enforcer.enforced(plan)):
            self.cdi.write(plan, self.enforcer.apply(plan))
            log.warning(
                "re-created the enforcement and CDI spec of a prepared claim",
                claim_uid=plan.claim.uid,
                namespace=plan.claim.namespace,
                name=plan.claim.name,
            )
        return record.devices

    def prepare(self, refs: Iterable[ClaimRef]) -> dict[str, PrepareOutcome]:
        """Prepare each claim; each one fails alone (:func:`~dra_driver.prepare.callshell.
        run_call`). Returns outcomes keyed by claim UID; a claim listed twice is prepared once.
        """
        results = run_call("prepare", refs, self.call_budget, self.metrics, self._prepare_call)
        return {
            uid: PrepareOutcome(error=r) if isinstance(r, str) else PrepareOutcome(devices=r)
            for uid, r in results.items()
        }

    def _prepare_call(
        self, refs: list[ClaimRef], call: Budget
    ) -> dict[str, tuple[PreparedDevice, ...] | Exception]:
        """The claims of one Prepare call: per claim UID its reply rows or why it failed.

        A claim recorded when the call came is answered from its record (re-created if need
        be), without the API server. The others are read first, in parallel, outside the
        prepare lock (a hung read must not hold up other calls) and within
        :data:`CLAIM_READ_SHARE` of the budget; under the lock each is then prepared
        (:meth:`_prepare_claim`) and the new records saved in one checkpoint write.

        Raises:
            LockTimeout: the lock was not obtained within the call's budget.
        """
        since = time.monotonic()
        reading = Budget.of(call.seconds * CLAIM_READ_SHARE)
        unknown = [r for r in refs if r.uid not in self.checkpoint.claims]
        reads = self._reads.read_all(unknown, reading, call)
        results: dict[str, tuple[PreparedDevice, ...] | Exception] = {}
        with budget.within(call), self.lock.held(timeout=call.remaining()):
            self.checkpoint.reload_if_changed()
            fresh = []
            for ref in refs:
                record = self.checkpoint.claims.get(ref.uid)
                try:
                    if record is not None:
                        results[ref.uid] = self._answer_from_record(record)
                    elif ref.uid not in reads:  # recorded when the call came, unprepared since
                        here = self.unprepared_here.since(ref.uid, since)
                        results[ref.uid] = unread_error(ref, here)
                    elif isinstance(read := reads[ref.uid], Exception):
                        results[ref.uid] = read
                    else:
                        check_started(call, "preparing", f"{ref.namespace}/{ref.name}")
                        results[ref.uid] = self._prepare_claim(ref, read)
                        fresh.append(ref.uid)
                except Exception as exc:  # this claim fails alone (run_call says why)
                    results[ref.uid] = exc
            self._record(fresh, results)
        return results

    def _prepare_claim(self, ref: ClaimRef, claim: Mapping[str, Any]) -> tuple[PreparedDevice, ...]:
        """Prepare one claim as read: plan, over-commit check, device nodes, enforcement, CDI
        spec, in-memory record (saved by :meth:`_record`). Returns its reply rows.

        Raises:
            PrepareError, MpsError, OSError: the claim is not prepared (nothing of it is left).
        """
        problem = self.node_problem()
        if problem:
            raise PrepareError(
                f"this node offers no GPU now ({problem}); the kubelet retries the claim, "
                "which is prepared once the NVIDIA driver answers"
            )
        plan = plan_claim(ref, claim, self.driver_name, self.pool, self.devices(), self.caps)
        others = (r.plan for uid, r in self.checkpoint.claims.items() if uid != ref.uid)
        overcommit = overcommit_error(plan, others)
        if overcommit:
            raise PrepareError(f"not prepared: {overcommit}")
        check_device_nodes(self.device_root_view, plan)
        edits = self.enforcer.apply(plan)
        try:
            devices = prepared_devices(plan, self.cdi.write(plan, edits))
        except OSError as exc:
            self.enforcer.release(ref.uid)
            raise PrepareError(f"writing the CDI spec under {self.cdi.root} failed: {exc}") from exc
        except BaseException:
            self.enforcer.release(ref.uid)
            raise
        self.checkpoint.claims[ref.uid] = ClaimRecord(ref.namespace, ref.name, devices, plan)
        self.pod_claims.add(claim, plan)
        log.info("claim prepared", claim_uid=ref.uid, namespace=ref.namespace, name=ref.name,
                 devices=[d.device for d in devices])  # fmt: skip
        return devices

    def _record(
        self, fresh: list[str], results: dict[str, tuple[PreparedDevice, ...] | Exception]
    ) -> None:
        """Save the newly prepared claims' records in one checkpoint write; if it fails, undo
        them (they fail, and the kubelet retries), else report them (``on_prepared``)."""
        if not fresh:
            return
        try:
            self.checkpoint.save()
        except OSError as exc:
            for uid in fresh:
                self.checkpoint.claims.pop(uid, None)
                self._unprepare_claim(uid)
                results[uid] = PrepareError(
                    f"checkpoint write to {self.checkpoint.path} failed: {exc}"
                )
            return
        for uid in fresh:
            self.on_prepared(self.checkpoint.claims[uid].plan)

    def unprepare(self, refs: Iterable[ClaimRef]) -> dict[str, str]:
        """Unprepare each claim (unknown claims succeed); returns error text by UID ("" = ok)."""
        results = run_call("unprepare", refs, self.call_budget, self.metrics, self._unprepare_call)
        return {uid: r or "" for uid, r in results.items()}

    def release_orphan(self, ref: ClaimRef, still: Callable[[], bool]) -> str | None:
        """Unprepare ``ref`` as the kubelet's call would, if it is still recorded and
        ``still()`` (the orphan sweep's last read of the claim,
        :mod:`dra_driver.prepare.orphans`) holds under the prepare lock. Returns None once
        released, else why not (kept, or the error text of a failed Unprepare)."""
        confirmed = []

        def check(r: ClaimRef) -> bool:
            confirmed.append(r.uid in self.checkpoint.claims and still())
            return confirmed[-1]

        work = partial(self._unprepare_call, still=check)
        result = run_call("unprepare", [ref], self.call_budget, self.metrics, work)[ref.uid]
        if result:
            return result
        if confirmed and confirmed[-1]:
            return None
        return "kept: already unprepared, or found live on a last read under the prepare lock"

    def _unprepare_call(
        self, refs: list[ClaimRef], call: Budget, still: Callable[[ClaimRef], bool] | None = None
    ) -> dict[str, None | Exception]:
        """The claims of one Unprepare call: per claim UID None (done; unknown claims too) or
        why it failed. The records go first, in one checkpoint write (:meth:`_forget`), then
        each claim's enforcement and CDI spec (:meth:`_unprepare_claim`). ``still``, when
        given, is asked under the lock whether each claim may still go (the orphan sweep's
        last read); a claim it keeps is left as it is (result None).

        Raises:
            LockTimeout: the lock was not obtained within the call's budget.
        """
        results: dict[str, None | Exception] = {}
        with budget.within(call), self.lock.held(timeout=call.remaining()):
            self.checkpoint.reload_if_changed()
            going = []
            for ref in refs:
                try:
                    validate_uid(ref.uid)
                except PrepareError as exc:
                    results[ref.uid] = exc
                    continue
                if still is None or still(ref):
                    going.append(ref)
                else:
                    results[ref.uid] = None
            for ref in self._forget(going, results):
                try:
                    check_started(call, "unpreparing", f"{ref.namespace}/{ref.name}")
                    self._unprepare_claim(ref.uid)
                    log.info("claim unprepared", claim_uid=ref.uid, namespace=ref.namespace,
                             name=ref.name)  # fmt: skip
                    results[ref.uid] = None
                except Exception as exc:  # this claim fails alone (run_call says why)
                    results[ref.uid] = exc
        return results

    def _forget(self, refs: list[ClaimRef], results: dict[str, None | Exception]) -> list[ClaimRef]:
        """Drop the claims' records in one checkpoint write; if it fails, put them back (those
        claims fail, and the kubelet retries: memory never runs ahead of disk). Returns the
        claims whose enforcement and spec may now go."""
        removed = {
            r.uid: record
            for r in refs
            if (record := self.checkpoint.claims.pop(r.uid, None)) is not None
        }
        if not removed:
            return refs
        try:
            self.checkpoint.save()
        except OSError as exc:
            self.checkpoint.claims.update(removed)
            failed = PrepareError(f"checkpoint write to {self.checkpoint.path} failed: {exc}")
            results.update(dict.fromkeys(removed, failed))
            return [r for r in refs if r.uid not in removed]
        for uid in removed:
            self.unprepared_here.add(uid)
        return refs

    def _unprepare_claim(self, uid: str) -> None:
        """Release one claim's enforcement and remove its CDI spec (its record is gone)."""
        self.pod_claims.forget(uid)
        self.enforcer.release(uid)
        self.cdi.remove(uid)

    def prepared_refs(self) -> list[ClaimRef]:
        """The identity of every prepared claim (safe without the lock, as
        :meth:`prepared_plans`)."""
        return [
            ClaimRef(r.namespace, r.name, uid) for uid, r in list(self.checkpoint.claims.items())
        ]

    def prepared_plans(self) -> list[ClaimPlan]:
        """Plans of every prepared claim (for metrics and health); safe without the lock:
        ``list(dict.values())`` copies in one step under the GIL, and records come and go whole.
        """
        return [r.plan for r in list(self.checkpoint.claims.values())]

    def close(self) -> None:
        """Stop the claim-reader threads."""
        self._reads.close()
