"""Applying and releasing one claim: its namespaces (or its own server) made or removed, a
failed apply rolled back, and servers, compute modes and daemons nobody needs any more retired."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence

import structlog

from dra_driver.enforce.janitor import SoftLimitJanitor
from dra_driver.enforce.ledger import Applied, Ledger
from dra_driver.enforce.mps import removal
from dra_driver.enforce.mps.computemode import ComputeModes
from dra_driver.enforce.mps.objects import EFFECT_ERRORS, MpsObjects
from dra_driver.enforce.rules.base import MpsError, disk_problem
from dra_driver.enforce.rules.edits import claim_edits
from dra_driver.enforce.rules.names import dedicated_server_name, mib, namespace_name
from dra_driver.enforce.rules.targets import (
    FractionTarget,
    MpsOptions,
    check_mode_conflicts,
    targets_for_claim,
)
from dra_driver.gpus import Gpu
from dra_driver.model.cdi import ContainerEdits
from dra_driver.model.plans import ClaimPlan
from dra_driver.model.vocabulary import Tier

log = structlog.get_logger(__name__)


class ClaimLifecycle:
    """Applies and releases claims against the node's MPS objects, recording them in the ledger.

    Not locked: its owner, the enforcer, serializes every call.

    Args:
        tiers: GPU UUID -> ``hard`` | ``cooperative`` | ``none``.
        options: paths and defaults.
        ledger: the applied and pending claims.
        objects: the MPS daemons, servers and namespaces.
        modes: compute-mode bookkeeping.
        janitor: the soft-limit reservations of ``hard`` claims.
    """

    def __init__(
        self,
        tiers: Mapping[str, str],
        options: MpsOptions,
        ledger: Ledger,
        objects: MpsObjects,
        modes: ComputeModes,
        janitor: SoftLimitJanitor,
    ) -> None:
        self.tiers = tiers
        self.options = options
        self.ledger = ledger
        self.objects = objects
        self.modes = modes
        self.janitor = janitor

    def apply(self, plan: ClaimPlan, fresh: bool = False) -> Mapping[str, ContainerEdits]:
        """Enforce ``plan`` (idempotent) and return the CDI edits per device key. ``fresh``: a
        kubelet's Prepare; a claim this process does not hold (nor retries) then has its
        namespace created without listing first (:meth:`MpsObjects.ensure`); a restore or a
        repair (False) lists, as its namespace may be there with clients attached.

        Raises:
            MpsError: invalid plan, a mode conflict on a GPU, or an MPS/NVML failure. A claim
                nobody held before this call (a kubelet's first Prepare: no pod of it runs
                yet) is then rolled back; any other (a restore, a repair, a second Prepare)
                is left pending, retried by the health check. Either way what this call made
                is removed and what was there before is kept (another plugin process, or the
                claim's running pods, may use it).
        """
        ref = plan.claim
        bound = log.bind(claim_uid=ref.uid, namespace=ref.namespace, name=ref.name)
        gone = sorted({d.gpu.uuid for d in plan.devices if d.gpu.uuid not in self.tiers})
        if gone:
            # Not "tier none": the claim's container may still run with an MPS mount.
            raise MpsError(
                f"claim {ref.namespace}/{ref.name}: GPU(s) {', '.join(gone)} not on this "
                "node (any more)"
            )
        targets = targets_for_claim(plan, self.tiers, self.options.default_active_thread_percentage)
        check_mode_conflicts(ref.uid, targets, self.ledger.held())
        previous = self.ledger.claims.pop(ref.uid, None)
        fresh = fresh and previous is None and ref.uid not in self.ledger.pending
        applied = Applied(plan, targets)
        done: dict[tuple[str, str], str] = {}
        self.objects.created.clear()
        try:
            for t in targets:
                if not t.uses_mps:
                    bound.warning(
                        "GPU memory NOT capped: no usable MPS on this GPU (tier none)",
                        gpu=t.gpu.uuid,
                        gpu_index=t.gpu.index,
                    )
                    continue
                key = (t.server, t.namespace)
                if key not in done:
                    done[key] = self.objects.ensure(t, fresh)
                applied.record_pipe(t.gpu.uuid, done[key])
                applied.record_server(t.gpu.uuid, self.objects.server_pid(t.mode, t.server))
        except EFFECT_ERRORS as exc:
            why = disk_problem(exc) if isinstance(exc, OSError) else str(exc)
            # What this call made is removed, only that: a namespace that was there may be
            # another process's (the other plugin pod of a rolling update) or serve the claim's
            # running pods; one made now may lack its limits, and no client may stay on it.
            made = [t for t in targets if _made_key(t) in self.objects.created]
            if fresh:
                bound.error("MPS enforcement failed; claim rolled back", error=why)
            else:
                # A restore, a repair or a second Prepare: the claim's pods may run on what
                # was there, so none of it is removed (no driver restart may end a tenant's
                # work); check_health retries the claim.
                bound.error("MPS enforcement failed; claim kept as it was, retried", error=why)
                self.ledger.pending[ref.uid] = plan
            self._teardown(made, also_idle=targets if fresh else ())
            raise MpsError(f"claim {ref.namespace}/{ref.name}: {why}") from exc
        self.ledger.claims[ref.uid] = applied
        self.ledger.pending.pop(ref.uid, None)
        if previous:
            kept = {(t.mode, t.server) for t in targets if t.uses_mps}
            stale = tuple(t for t in previous.targets if (t.mode, t.server) not in kept)
            self._teardown(stale, also_idle=previous.targets)
        for t in targets:
            self._log_target(bound, t, applied.pipes.get(t.gpu.uuid))
        return claim_edits(targets, self.options, applied.pipes)

    def release(self, claim_uid: str) -> None:
        """Remove the claim's namespaces (clients terminated first) and its own server if it
        has one, undo its soft-limit reservations, and retire what nobody needs any more
        (idempotent; an unknown claim: whatever MPS still has of it is removed).

        Raises:
            MpsError: when a namespace or the claim's own server cannot be removed; the claim
                stays recorded so that a retry repeats the release.
        """
        ns = namespace_name(claim_uid)
        pending = self.ledger.pending.pop(claim_uid, None)
        applied = self.ledger.claims.get(claim_uid)
        bound = log.bind(claim_uid=claim_uid, mps_namespace=ns)
        if applied is None:
            self._release_unknown(claim_uid)
            if pending is not None:  # what it kept: its server and GPU retired if idle now
                self._idle(self.ledger.targets_of(pending))
            return
        errors = []
        for t in _by_server(applied.targets):
            try:
                removal.remove_target(self.objects.daemons[t.mode], t)
            except EFFECT_ERRORS as exc:
                where = f"MPS server {t.server}" if t.dedicated else f"GPU {t.gpu.index}"
                errors.append(f"{where}: {exc}")
        if errors:
            bound.error("MPS release failed", errors=errors)
            raise MpsError(f"releasing claim {claim_uid}: " + "; ".join(errors))
        hard = [t for t in applied.targets if t.tier == Tier.HARD]
        self.janitor.release(
            claim_uid,
            [t.gpu.uuid for t in hard],
            max((t.request_bytes for t in hard), default=0),
        )
        self._drop_consumer_records(claim_uid)
        del self.ledger.claims[claim_uid]
        self._idle(applied.targets)
        bound.info("claim released", gpus=[t.gpu.uuid for t in applied.targets])

    def _drop_consumer_records(self, claim_uid: str) -> None:
        """Remove the consumer gate's records of a released claim (``<root>/users/<uid>``):
        its containers can no longer start (the kubelet unprepares a claim only once its pods
        are gone), and a release leaves nothing of the claim behind."""
        shutil.rmtree(self.options.user_record_root / claim_uid, ignore_errors=True)

    def _teardown(
        self, targets: Sequence[FractionTarget], also_idle: Sequence[FractionTarget] = ()
    ) -> None:
        """Best effort: remove what ``targets`` set up and idle what nobody needs (GPUs of
        ``targets`` and ``also_idle``)."""
        for t in _by_server(targets):
            try:
                removal.remove_target(self.objects.daemons[t.mode], t)
            except EFFECT_ERRORS as exc:
                log.warning(
                    "rollback: MPS removal failed",
                    **t.log_fields,
                    mps_server=t.server,
                    error=str(exc),
                )
        self._idle(tuple(targets) + tuple(also_idle))

    def _idle(self, targets: Sequence[FractionTarget]) -> None:
        """Delete shared servers, reset compute modes and stop daemons no claim needs any more."""
        users = self.ledger.wanted_targets()
        seen: dict[tuple[str, str], Gpu] = {}
        for t in targets:
            if t.uses_mps:
                seen.setdefault((t.mode, t.gpu.uuid), t.gpu)
        for (mode, uuid), gpu in seen.items():
            on_gpu = [o for o in users if o.gpu.uuid == uuid]
            try:
                kept = False
                if not any(o.mode == mode and not o.dedicated for o in on_gpu):
                    kept = not removal.delete_shared_server(self.objects.daemons[mode], gpu)
                if not on_gpu and not kept:  # a kept server's clients keep the GPU's mode
                    self.modes.restore(uuid)
            except EFFECT_ERRORS as exc:
                log.error("retiring MPS server failed", gpu=uuid, error=str(exc))
        for mode, daemon in self.objects.daemons.items():
            if any(t.mode == mode for t in targets) and not any(u.mode == mode for u in users):
                daemon.stop(only_idle=True)

    def reset_compute_modes(self) -> None:
        """Put back to DEFAULT every GPU whose compute mode was changed and no claim needs."""
        self.modes.reset_unused({t.gpu.uuid for t in self.ledger.wanted_targets()})

    def _release_unknown(self, claim_uid: str) -> None:
        """Remove what MPS has of a claim not in the ledger (its own server, its namespaces)
        and its soft-limit records.

        Raises:
            MpsError: a command failed.
        """
        ns = namespace_name(claim_uid)
        own = dedicated_server_name(claim_uid)
        for _, daemon, server in self.objects.servers():
            if server.name == own:
                removal.remove_claim_server(daemon, own, claim_uid)
            elif any(r.name == ns for r in daemon.control.namespace_list(server.name)):
                removal.delete_orphan(daemon, server.name, ns, claim_uid)
        self.janitor.release(claim_uid, [], 0)
        self._drop_consumer_records(claim_uid)

    def _log_target(
        self, bound: structlog.typing.FilteringBoundLogger, t: FractionTarget, pipe: str | None
    ) -> None:
        fields = {
            "gpu": t.gpu.uuid,
            "gpu_index": t.gpu.index,
            "compute_mode": t.mode,
            "tier": t.tier,
            "request_mib": mib(t.request_bytes),
            "limit_mib": mib(t.limit_bytes),
            "threads": t.threads,
        }
        if t.tier == Tier.COOPERATIVE:
            bound.warning(
                "fraction enforced cooperatively: MPS namespace pinned limit only; the driver "
                "does not cap the container's cgroup",
                mps_server=t.server,
                mps_namespace=t.namespace,
                pipe_dir=pipe,
                **fields,
            )
        elif t.tier == Tier.HARD:
            bound.info(
                "fraction enforced (hard)",
                mps_server=t.server,
                mps_namespace=t.namespace,
                pipe_dir=pipe,
                **fields,
            )


def _made_key(t: FractionTarget) -> tuple[str, str, str]:
    """``t``'s entry in :attr:`MpsObjects.created` when a call made what a rollback of it
    removes: its claim's own server, else its namespace."""
    return (t.mode, t.server, "" if t.dedicated else t.namespace)


def _by_server(targets: Sequence[FractionTarget]) -> list[FractionTarget]:
    """MPS targets, one per (mode, server, namespace): a multi-GPU claim's GPUs share one."""
    seen: set[tuple[str, str, str]] = set()
    out = []
    for t in targets:
        key = (t.mode, t.server, t.namespace)
        if t.uses_mps and key not in seen:
            seen.add(key)
            out.append(t)
    return out
