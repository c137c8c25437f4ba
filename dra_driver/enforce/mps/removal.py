"""Removing MPS objects from one control daemon: namespaces, a claim's own server, a GPU's
shared server, always terminating their clients first."""

from __future__ import annotations

import shutil
from collections.abc import Sequence

import structlog

from dra_driver.enforce.mps.control import MpsCommandError, MpsControl, MpsTimeout
from dra_driver.enforce.mps.daemon import MpsDaemon
from dra_driver.enforce.rules.names import server_name
from dra_driver.enforce.rules.rows import ClientRow
from dra_driver.enforce.rules.targets import FractionTarget
from dra_driver.gpus import Gpu

log = structlog.get_logger(__name__)


def terminate_clients(ctl: MpsControl, server: str, namespace: str | None = None) -> None:
    """``client terminate`` every client of ``server`` (of ``namespace`` only, if given)
    before removing it: a client killed with work in flight can wedge the GPU
    (``docs/enforcement.md``, "Lifecycle"). A refused terminate is logged.

    Raises:
        MpsCommandError: ``client list`` failed.
    """
    terminate_listed(ctl, server, ctl.client_list(server), namespace)


def terminate_listed(
    ctl: MpsControl, server: str, clients: Sequence[ClientRow], namespace: str | None = None
) -> None:
    """:func:`terminate_clients` with ``server``'s ``client list`` already read."""
    for client in clients:
        if namespace is not None and client.namespace != namespace:
            continue
        try:
            ctl.client_terminate(client.pid)
            log.info(
                "MPS client terminated",
                pid=client.pid,
                mps_server=server,
                mps_namespace=client.namespace,
            )
        except MpsCommandError as exc:
            log.warning("MPS client terminate failed", pid=client.pid, error=str(exc))


def remove_target(daemon: MpsDaemon, t: FractionTarget) -> None:
    """Remove what ``t`` set up in ``daemon`` (its mode's): its namespace, or its claim's own
    server.

    Raises:
        MpsError: a command failed (:class:`MpsTimeout`: the daemon is hung).
    """
    if t.dedicated:
        remove_claim_server(daemon, t.server, t.claim.uid)
    else:
        remove_namespace(daemon, t)


def remove_namespace(daemon: MpsDaemon, t: FractionTarget) -> None:
    """Delete ``t``'s namespace (its clients terminated first) and its pipe directory: two
    commands (``client list``, ``namespace delete``) when both are there; the server and the
    namespace are listed only when a command is refused, to tell "already gone" from a failure.

    Raises:
        MpsError: a command failed (:class:`MpsTimeout`: the daemon is hung).
    """
    ctl = daemon.control
    try:
        clients = ctl.client_list(t.server)
    except MpsTimeout:
        raise
    except MpsCommandError:
        if _listed(ctl, t.server):
            raise
        clients = None  # no server (or no daemon): nothing of the namespace is left in MPS
    if clients is not None:
        terminate_listed(ctl, t.server, clients, t.namespace)
        try:
            ctl.namespace_delete(t.namespace, t.server, force=True)
        except MpsTimeout:
            raise
        except MpsCommandError:
            # refused because it is not there (never made, or deleted before a crash): done
            if any(r.name == t.namespace for r in ctl.namespace_list(t.server)):
                raise
    shutil.rmtree(daemon.pipe_dir / t.server / t.namespace, ignore_errors=True)


def remove_claim_server(daemon: MpsDaemon, server: str, claim_uid: str) -> None:
    """Delete a multi-GPU claim's own server: clients terminated first, then ``server
    delete --force``; its pipe directory removed.

    Raises:
        MpsError: a command failed (:class:`MpsTimeout`: the daemon is hung).
    """
    ctl = daemon.control
    if _listed(ctl, server):
        terminate_clients(ctl, server)
        ctl.server_delete(server, force=True)
        log.info("claim's MPS server deleted", claim_uid=claim_uid, mps_server=server)
    shutil.rmtree(daemon.pipe_dir / server, ignore_errors=True)


def delete_shared_server(daemon: MpsDaemon, gpu: Gpu) -> bool:
    """Delete ``gpu``'s shared server in ``daemon`` if listed (a hung daemon: left). Called
    when no claim of this process needs it; a delete refused because clients are attached is
    logged and the server kept: those clients are of claims this process does not hold (the
    other plugin pod of a rolling update prepared them), and ending them would end a tenant's
    work. The next release or restore that finds it idle deletes it. Returns False when the
    server was kept."""
    ctl = daemon.control
    name = server_name(gpu.index)
    try:
        present = _listed(ctl, name)
    except MpsTimeout:
        return False
    if not present:
        return True
    try:
        ctl.server_delete(name)
    except MpsCommandError as exc:
        log.warning(
            "MPS server without claims of this process kept: delete refused (clients attached?)",
            mps_server=name,
            error=str(exc),
        )
        return False
    return True


def delete_orphan(daemon: MpsDaemon, server: str, ns: str, uid: str) -> None:
    """Delete namespace ``ns`` of claim ``uid`` on ``server`` (clients terminated first) and
    its pipe directory.

    Raises:
        MpsError: a command failed.
    """
    ctl = daemon.control
    terminate_clients(ctl, server, ns)
    ctl.namespace_delete(ns, server, force=True)
    shutil.rmtree(daemon.pipe_dir / server / ns, ignore_errors=True)
    log.info("orphaned MPS namespace removed", claim_uid=uid, mps_namespace=ns, mps_server=server)


def _listed(ctl: MpsControl, name: str) -> bool:
    """Whether server ``name`` is listed; False when the daemon is gone (a failed command: its
    servers and clients are gone with it).

    Raises:
        MpsTimeout: the daemon is hung, not gone: what it serves stays until it answers.
    """
    try:
        servers = ctl.server_list()
    except MpsTimeout:
        raise
    except MpsCommandError:
        return False
    return any(r.name == name for r in servers)
