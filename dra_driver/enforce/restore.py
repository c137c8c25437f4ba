"""Restoring MPS state after a plugin start: every prepared claim re-applied, and what claims no
longer prepared left (namespaces, servers), unneeded compute modes and idle daemons removed."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from dra_driver.enforce.lifecycle import ClaimLifecycle
from dra_driver.enforce.mps import removal
from dra_driver.enforce.mps.control import MpsCommandError
from dra_driver.enforce.mps.objects import MpsObjects
from dra_driver.enforce.rules.base import MpsError
from dra_driver.enforce.rules.names import (
    DEDICATED_PREFIX,
    SERVER_PREFIX,
    claim_uid_of,
    claim_uid_of_server,
)
from dra_driver.model.plans import ClaimPlan

log = structlog.get_logger(__name__)


def restore_claims(life: ClaimLifecycle, plans: Sequence[ClaimPlan]) -> None:
    """Re-apply ``plans`` (the prepared claims) after a plugin start: remove MPS namespaces
    (and claim servers) of claims not in ``plans``, re-create servers and namespaces, delete
    our servers no claim uses, reset compute modes of GPUs nobody needs and stop daemons
    without claims. A claim that fails is logged and left pending (retried by the health
    check), with whatever MPS has of it kept."""
    ledger, objects = life.ledger, life.objects
    ledger.keep_only(plans)
    _remove_orphans(objects, {p.claim.uid for p in plans})
    for plan in plans:
        try:
            life.apply(plan)
        except MpsError as exc:
            ledger.pending[plan.claim.uid] = plan
            log.error(
                "claim not restored; will retry",
                claim_uid=plan.claim.uid,
                namespace=plan.claim.namespace,
                name=plan.claim.name,
                error=str(exc),
            )
    # pending claims count: one not restored keeps its server and daemon (its pods may run)
    wanted = ledger.wanted_targets()
    _remove_idle_servers(objects, {(t.mode, t.server) for t in wanted})
    life.reset_compute_modes()
    for mode, daemon in objects.daemons.items():
        if not any(t.mode == mode for t in wanted) and daemon.alive():
            daemon.stop(only_idle=True)
    log.info("MPS state restored", claims=len(ledger.claims), pending=len(ledger.pending))


def _remove_orphans(objects: MpsObjects, wanted: set[str]) -> None:
    """Remove the claim servers and namespaces of claims whose UID is not in ``wanted``
    (failures logged)."""
    for _, daemon, server in objects.servers():
        owner = claim_uid_of_server(server.name)
        if owner is not None:
            if owner not in wanted:
                try:
                    removal.remove_claim_server(daemon, server.name, owner)
                except MpsError as exc:
                    log.error("orphaned MPS server not removed", claim_uid=owner, error=str(exc))
            continue
        try:
            rows = daemon.control.namespace_list(server.name)
        except MpsCommandError:
            continue
        for row in rows:
            uid = claim_uid_of(row.name)
            if uid is None or uid in wanted:
                continue
            try:
                removal.delete_orphan(daemon, server.name, row.name, uid)
            except MpsError as exc:
                log.error("orphaned MPS namespace not removed", claim_uid=uid, error=str(exc))


def _remove_idle_servers(objects: MpsObjects, used: set[tuple[str, str]]) -> None:
    """``server delete --force`` every server of ours (by name) not in ``used``, a set of
    ``(mode, server name)`` (failures logged)."""
    ours = (SERVER_PREFIX, DEDICATED_PREFIX)
    for mode, daemon, server in objects.servers():
        if not server.name.startswith(ours) or (mode, server.name) in used:
            continue
        log.info("removing MPS server without claims", mps_server=server.name, mode=mode)
        try:
            daemon.control.server_delete(server.name, force=True)
        except MpsCommandError as exc:
            log.warning("MPS server delete failed", mps_server=server.name, error=str(exc))
