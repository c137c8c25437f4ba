"""Health check and repair of MPS enforcement: pending claims retried, every daemon, server and
namespace that claims need checked and re-created when gone, each GPU's health reported, and
each claim whose running containers lost their server or namespace reported as an outage
(:mod:`dra_driver.enforce.rules.outages`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import structlog

from dra_driver.enforce.lifecycle import ClaimLifecycle
from dra_driver.enforce.mps.objects import EFFECT_ERRORS
from dra_driver.enforce.rules.base import GpuHealth, MpsError
from dra_driver.enforce.rules.outages import (
    NAMESPACE_RECREATED,
    SERVER_RESTARTED,
    MpsOutage,
    OutageListener,
)
from dra_driver.enforce.rules.targets import FractionTarget
from dra_driver.model.vocabulary import Tier

log = structlog.get_logger(__name__)


class HealthRepair:
    """Checks and repairs what the claims of a :class:`ClaimLifecycle` need.

    Not locked: its owner, the enforcer, serializes every call.

    Attributes:
        daemon_restarts: control daemons found not answering (and restarted) so far.
        service_down: the MPS node service was not ready at the last check (every daemon
            has a :meth:`~dra_driver.enforce.mps.daemon.MpsDaemon.service_problem`).
        on_outages: receives the outages each check finds (None: they are only logged).

    Args:
        life: the claims and their MPS objects.
        clock: ``time.time``, the time of an outage.
    """

    def __init__(self, life: ClaimLifecycle, clock: Callable[[], float] = time.time) -> None:
        self.life = life
        self.clock = clock
        self.daemon_restarts = 0
        self.service_down = False
        self.on_outages: OutageListener | None = None

    def check(self) -> dict[str, GpuHealth]:
        """Retry pending claims, then check every daemon, server and namespace that applied
        claims need; repair what is gone.

        A daemon that does not answer is restarted and every claim it served re-applied; a
        missing or failed server (shared or a claim's own) is re-created with its namespaces;
        a missing namespace re-created. A claim whose server now has another PID, or whose
        namespace directory is another one, is reported to :attr:`on_outages` (a listener
        that raises is logged). Returns GPU UUID -> health, for each GPU with claims.
        """
        self._retry_pending()
        health: dict[str, GpuHealth] = {}
        outages: list[MpsOutage] = []
        self.life.objects.created.clear()
        daemons = self.life.objects.daemons
        problems = {m: d.service_problem() for m, d in daemons.items()}
        if daemons and all(problems.values()):
            # No MPS service: every GPU that MPS enforces is unusable, claims or not.
            detail = f"MPS service not ready: {problems[next(iter(problems))]}"
            for uuid, tier in self.life.tiers.items():
                if tier != Tier.NONE:
                    health[uuid] = GpuHealth(uuid, False, detail[:1024])
        for mode, daemon in daemons.items():
            targets = self.life.ledger.mode_targets(mode)
            if not targets:
                continue
            if not daemon.alive():
                self.daemon_restarts += 1
                log.error(
                    "MPS control daemon not answering; re-applying claims once it answers"
                    if problems[mode]
                    else "MPS control daemon not answering; restarting and re-applying claims",
                    mode=mode,
                    claims=sorted({t.claim.uid for t in targets}),
                    service_problem=problems[mode],
                )
            self._repair(targets, health, outages)
        down = bool(daemons) and all(problems.values())
        if down != self.service_down:
            self.service_down = down
            if down:
                log.error("MPS service not ready; its GPUs are reported unhealthy", **problems)
            else:
                log.info("MPS service ready again; claims re-applied where needed")
        self.life.reset_compute_modes()  # retry restores that failed while the plugin runs
        if outages and self.on_outages is not None:
            try:
                self.on_outages(outages)
            except Exception:  # reporting must never stop the supervision
                log.exception("MPS outage report failed", claims=[o.claim.uid for o in outages])
        return health

    def _retry_pending(self) -> None:
        for uid, plan in list(self.life.ledger.pending.items()):
            try:
                self.life.apply(plan)
            except MpsError as exc:
                log.warning("pending claim still not restored", claim_uid=uid, error=str(exc))

    def _repair(
        self,
        targets: Sequence[FractionTarget],
        health: dict[str, GpuHealth],
        outages: list[MpsOutage],
    ) -> None:
        """Ensure each ``(server, namespace)`` of ``targets`` once; record each target's GPU
        in ``health`` (a failure makes the GPU unhealthy whatever its other targets say) and
        each claim cut off its server or namespace in ``outages``."""
        done: dict[tuple[str, str], str | Exception] = {}
        for t in targets:
            bound = log.bind(**t.log_fields)
            key = (t.server, t.namespace)
            if key not in done:
                try:
                    done[key] = self.life.objects.ensure(t)
                except EFFECT_ERRORS as exc:
                    bound.error("MPS enforcement broken", mps_server=t.server, error=str(exc))
                    done[key] = exc
            result = done[key]
            if isinstance(result, Exception):
                health[t.gpu.uuid] = GpuHealth(t.gpu.uuid, False, str(result))
                continue
            self._note_identity(t, result, bound, outages)
            health.setdefault(t.gpu.uuid, GpuHealth(t.gpu.uuid, True))

    def _note_identity(
        self,
        t: FractionTarget,
        pipe: str,
        bound: structlog.typing.FilteringBoundLogger,
        outages: list[MpsOutage],
    ) -> None:
        """Record the server PID and pipe directory ``t``'s claim has now; when either is
        another than before, or this check created the namespace, add the claim's outage
        (once per claim and server)."""
        applied = self.life.ledger.claims.get(t.claim.uid)
        if applied is None:
            return
        new_pid = self.life.objects.server_pid(t.mode, t.server)
        old_pid = applied.record_server(t.gpu.uuid, new_pid)
        recreated = applied.record_pipe(t.gpu.uuid, pipe) or (
            (t.mode, t.server, t.namespace) in self.life.objects.created
        )
        if old_pid is None and not recreated:
            return
        if any(o.claim.uid == t.claim.uid and o.server == t.server for o in outages):
            return  # a multi-GPU claim's server: one outage for all its GPUs
        outage = MpsOutage(
            claim=t.claim,
            reason=SERVER_RESTARTED if old_pid is not None else NAMESPACE_RECREATED,
            mode=t.mode,
            server=t.server,
            namespace=t.namespace,
            gpus=tuple((g.index, g.uuid) for g in t.server_gpus),
            old_pid=old_pid,
            new_pid=new_pid,
            at=self.clock(),
        )
        outages.append(outage)
        bound.warning(
            "claim's MPS server or namespace was replaced; its running containers lost their "
            "MPS connection and must be restarted to reconnect",
            reason=outage.reason,
            mode=t.mode,
            mps_server=t.server,
            mps_namespace=t.namespace,
            old_server_pid=old_pid,
            new_server_pid=new_pid,
            pipe_dir=pipe,
        )
