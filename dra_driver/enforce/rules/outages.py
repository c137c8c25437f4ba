"""Pure: an MPS outage that cut a prepared claim's running containers off their namespace.

A container reaches MPS through the namespace's pipe directory, bind-mounted when the
container was created (``docs/enforcement.md``, "Layout and commands"). When the namespace's
server process is replaced (the server failed and was re-created, or its control daemon was
restarted: by the MPS node service, or by the health check with ``mps.service: in-plugin``),
every client of the old server lost its connection; when the namespace's directory is replaced,
the running containers still see the old one. The driver re-creates servers and namespaces on
its own, but a CUDA process does not reconnect: its containers must be restarted. The health
check (:mod:`dra_driver.enforce.healthcheck`) tells both apart from the claims' records
(:class:`~dra_driver.enforce.ledger.Applied`: each GPU's server PID and pipe directory inode,
as last seen) and reports one :class:`MpsOutage` per claim and server.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dra_driver.model.plans import ClaimRef

SERVER_RESTARTED = "MpsServerRestarted"
"""Reason of an outage whose server process was replaced (new PID in ``server list``)."""
NAMESPACE_RECREATED = "MpsNamespaceRecreated"
"""Reason of an outage whose namespace pipe directory was replaced (same server)."""


@dataclass(frozen=True)
class MpsOutage:
    """One claim cut off one MPS server's namespace.

    Attributes:
        claim: the claim.
        reason: :data:`SERVER_RESTARTED` or :data:`NAMESPACE_RECREATED`.
        mode: the compute mode (its daemon), ``time-slicing`` or ``sm-sharing``.
        server: the MPS server (``gpu_<i>``, or ``m_<uid>`` of a multi-GPU claim).
        namespace: the claim's namespace on it.
        gpus: ``(index, UUID)`` of the server's GPUs of this claim, by index.
        old_pid: the server's PID before (None: not a server restart, or not known).
        new_pid: its PID now (None: not known).
        at: when the health check saw it, seconds since the epoch (the outage happened at most
            one check interval before).
    """

    claim: ClaimRef
    reason: str
    mode: str
    server: str
    namespace: str
    gpus: tuple[tuple[int, str], ...]
    old_pid: int | None
    new_pid: int | None
    at: float


OutageListener = Callable[[Sequence[MpsOutage]], None]
"""Receives the outages one health check found (never called with none); called with the
enforcer's lock held, so it must return at once (queue the work)."""


def server_pid(text: str) -> int | None:
    """A ``server list`` PID column as a PID: a positive integer, else None (a server that has
    no process yet may show ``-`` or ``0``; [UNKNOWN] on r615)."""
    return int(text) if text.isdigit() and int(text) > 0 else None
