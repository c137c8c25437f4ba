"""What a plugin start reconciles between the checkpoint's records and the node, after the
enforcer's restore (:meth:`~dra_driver.prepare.preparation.ClaimPreparation.start`):

- CDI specs without a record are removed with their enforcement (a Prepare killed before its
  checkpoint save, an Unprepare killed after it);
- after a driver reload the GPUs keep their UUIDs but may get other device minors
  (kubernetes-sigs/dra-driver-nvidia-gpu#1144's variant), and a CDI spec naming the old
  ``/dev/nvidia<minor>`` gives a container that starts again another GPU or none: such specs
  and records follow the new minors;
- a recorded claim whose spec is missing or lists other devices gets it rewritten."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import structlog

from dra_driver.enforce import FractionEnforcer
from dra_driver.infra.metrics import Metrics
from dra_driver.model.errors import CLAIM_ERRORS, PrepareError
from dra_driver.model.gpu import Gpu
from dra_driver.model.ids import validate_uid
from dra_driver.model.plans import with_current_gpus
from dra_driver.prepare.cdispecs import CdiSpecs
from dra_driver.prepare.checkpoint import Checkpoint, CheckpointCorrupt, ClaimRecord

log = structlog.get_logger(__name__)


def load_checkpoint(checkpoint: Checkpoint, metrics: Metrics) -> bool:
    """Load the records; False when the checkpoint is corrupt: it is then logged as an error and
    kept aside, and the start reconciles nothing (no restore, which would tear down the
    namespaces of running claims, and no sweep), so running containers keep their CDI specs
    and MPS settings. A checkpoint of an earlier boot is discarded (True, no records)."""
    try:
        if not checkpoint.load():
            log.warning("checkpoint from an earlier boot discarded", path=str(checkpoint.path))
    except CheckpointCorrupt as exc:
        metrics.errors.labels(operation="checkpoint").inc()
        log.error(
            "checkpoint corrupt; starting with no prepared claims and leaving existing "
            "CDI specs and MPS state in place (unprepare still removes them by claim UID)",
            error=str(exc),
        )
        checkpoint.remember_file()
        return False
    checkpoint.remember_file()
    return True


def reconcile(
    checkpoint: Checkpoint,
    cdi: CdiSpecs,
    enforcer: FractionEnforcer,
    current: Mapping[str, Gpu],
    answer: Callable[[ClaimRecord], object],
) -> None:
    """Records, enforcement and CDI specs made to agree (see the module), in this order: the
    enforcer restores the recorded claims and removes the rest, unrecorded specs go, specs
    follow renumbered GPUs (``current``: the GPUs discovered now, by UUID), and missing specs
    are re-created (``answer``)."""
    enforcer.restore([r.plan for r in checkpoint.claims.values()])
    sweep_unrecorded(checkpoint, cdi, enforcer)
    follow_renumbered_gpus(checkpoint, cdi, enforcer, current)
    rewrite_missing_specs(checkpoint, cdi, answer)


def sweep_unrecorded(checkpoint: Checkpoint, cdi: CdiSpecs, enforcer: FractionEnforcer) -> None:
    """Remove the CDI spec and the enforcement of every claim that has a spec but no record
    (file names that are no claim UID are left alone)."""
    for uid in sorted(cdi.claim_uids() - set(checkpoint.claims)):
        try:
            validate_uid(uid)
        except PrepareError:
            continue
        cdi.remove(uid)
        enforcer.release(uid)
        log.info("removed orphaned CDI spec", claim_uid=uid)


def rewrite_missing_specs(
    checkpoint: Checkpoint, cdi: CdiSpecs, answer: Callable[[ClaimRecord], object]
) -> None:
    """Re-create (``answer``: Prepare's answer from a record) every recorded claim whose spec is
    missing or lists other devices (an older version's killed Unprepare removed it before the
    record); a claim that fails stays recorded, and the kubelet's next Prepare retries it."""
    for uid in sorted(checkpoint.claims):
        record = checkpoint.claims[uid]
        if not cdi.lists(uid, record.devices):
            try:
                answer(record)
            except CLAIM_ERRORS as exc:
                log.warning("recorded claim not restored", claim_uid=uid, error=str(exc))


def follow_renumbered_gpus(
    checkpoint: Checkpoint, cdi: CdiSpecs, enforcer: FractionEnforcer, current: Mapping[str, Gpu]
) -> None:
    """Rewrite the CDI spec and record of every recorded claim whose GPU (by UUID, ``current``:
    the GPUs discovered now) has another device minor; the CDI device names stay. The spec is
    written before the record: a plugin killed between the two finds the old record and does
    it again. A claim whose spec cannot be written is logged and left as it is."""
    changed = False
    for uid in sorted(checkpoint.claims):
        record = checkpoint.claims[uid]
        plan = with_current_gpus(record.plan, current)
        if plan is record.plan:
            continue
        try:
            cdi.write(plan, enforcer.apply(plan))
        except CLAIM_ERRORS as exc:
            log.warning("renumbered claim not rewritten", claim_uid=uid, error=str(exc))
            continue
        checkpoint.claims[uid] = replace(record, plan=plan)
        changed = True
        log.warning(
            "CDI spec rewritten for the GPUs' new device nodes",
            claim_uid=uid,
            namespace=record.namespace,
            name=record.name,
            gpu=",".join(sorted({d.gpu.device_node for d in plan.devices})),
        )
    if changed:
        checkpoint.save()
