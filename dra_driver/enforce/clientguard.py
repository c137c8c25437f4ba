"""Holding each claim to its share of the MPS client table: ``client list`` once per control
daemon, then ``client terminate`` for each claim's clients beyond its cap, newest first
(decisions in :mod:`dra_driver.enforce.rules.clientcap`; ``docs/enforcement.md``, "Client cap")."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

import structlog

from dra_driver.enforce.mps.daemon import MpsDaemon
from dra_driver.enforce.rules.base import ClientTermination, MpsError
from dra_driver.enforce.rules.clientcap import Excess, Ranks, cap_groups, plan_terminations
from dra_driver.enforce.rules.targets import FractionTarget
from dra_driver.model.plans import ClaimRef

log = structlog.get_logger(__name__)

OVER_CLAIM_CAP = "over_claim_cap"
"""Why the guard terminates a client: its claim holds more than its cap."""

ClientsTerminated = Callable[[ClaimRef, str, list[int], int], None]
"""Called after a claim's clients were terminated: ``(claim, gpu_uuid, pids, cap)``."""


def ignore_terminations(claim: ClaimRef, gpu_uuid: str, pids: list[int], cap: int) -> None:
    """The default :data:`ClientsTerminated`: nothing."""


class ClientGuard:
    """Terminates each claim's MPS clients beyond its cap; remembers, per namespace, the order
    in which clients were first seen (so the earliest stay).

    Runs its commands without the enforcer's lock (its owner passes the targets in), so a
    check never keeps Prepare waiting; its own lock serializes checks.

    Args:
        daemons: the control daemon of each compute mode.
        on_terminated: called once per namespace whose clients were terminated (exceptions
            are logged, never raised).
    """

    def __init__(
        self,
        daemons: Mapping[str, MpsDaemon],
        on_terminated: ClientsTerminated = ignore_terminations,
    ) -> None:
        self.daemons = daemons
        self.on_terminated = on_terminated
        self._lock = threading.Lock()
        self._ranks: dict[str, Ranks] = {}
        self._failing: dict[str, str] = {}

    def check(self, targets: Mapping[str, Sequence[FractionTarget]]) -> list[ClientTermination]:
        """One check of every daemon with claims: ``client list`` (one command per daemon),
        then ``client terminate <pid>`` for each client over its claim's cap.

        Args:
            targets: compute mode -> the MPS targets of the claims applied in it.

        Returns:
            What was terminated, one entry per claim namespace (PIDs whose terminate failed
            are left out). A daemon that cannot be asked is skipped (logged once until it
            answers again).
        """
        done: list[ClientTermination] = []
        with self._lock:
            for mode, daemon in self.daemons.items():
                groups = cap_groups(targets.get(mode, ()))
                if not groups:
                    self._ranks.pop(mode, None)
                    continue
                try:
                    rows = daemon.control.client_list()
                except MpsError as exc:
                    self._note_failure(mode, str(exc))
                    continue
                self._note_failure(mode, None)
                excess, self._ranks[mode] = plan_terminations(
                    rows, groups, self._ranks.get(mode, {})
                )
                for e in excess:
                    ended = self._terminate(daemon, e)
                    if ended is not None:
                        done.append(ended)
        return done

    def _terminate(self, daemon: MpsDaemon, e: Excess) -> ClientTermination | None:
        g = e.group
        bound = log.bind(**g.log_fields, mps_server=g.server, mps_namespace=g.namespace)
        if e.spared:
            bound.warning(
                "claim over its MPS client cap; clients also attached elsewhere are not terminated",
                pids=list(e.spared),
                cap=g.cap,
                clients=e.contexts,
            )
        ended = []
        for pid in e.pids:
            try:
                daemon.control.client_terminate(pid)
            except MpsError as exc:  # gone meanwhile, or a hung daemon: the next check sees
                bound.info("MPS client terminate failed", pid=pid, error=str(exc))
                continue
            ended.append(pid)
        if not ended:
            return None
        bound.warning(
            "claim over its MPS client cap; its newest clients were terminated",
            pids=ended,
            cap=g.cap,
            clients=e.contexts,
            reason=OVER_CLAIM_CAP,
        )
        try:
            self.on_terminated(g.claim, g.gpu_uuid, list(ended), g.cap)
        except Exception:  # a broken reporter must not stop enforcement
            bound.exception("reporting terminated MPS clients failed")
        return ClientTermination(g.claim, g.gpu_uuid, tuple(ended), g.cap, OVER_CLAIM_CAP)

    def _note_failure(self, mode: str, error: str | None) -> None:
        before = self._failing.pop(mode, None)
        if error is None:
            if before is not None:
                log.info("MPS client check works again", mode=mode)
            return
        self._failing[mode] = error
        if error != before:
            log.warning("MPS client check failed; retried every check", mode=mode, error=error)
