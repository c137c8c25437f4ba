"""Prepared claims after a driver reload: the GPUs keep their UUIDs but may get other device
minors (kubernetes-sigs/dra-driver-nvidia-gpu#1144's variant), and a CDI spec naming the old
``/dev/nvidia<minor>`` gives a container that starts again another GPU or none."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import structlog

from dra_driver.enforce import FractionEnforcer
from dra_driver.model.errors import CLAIM_ERRORS
from dra_driver.model.gpu import Gpu
from dra_driver.model.plans import with_current_gpus
from dra_driver.prepare.cdispecs import CdiSpecs
from dra_driver.prepare.checkpoint import Checkpoint

log = structlog.get_logger(__name__)


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
