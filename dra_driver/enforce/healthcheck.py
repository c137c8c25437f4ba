"""Health check and repair of MPS enforcement: pending claims retried, every daemon, server and
namespace that claims need checked and re-created when gone, and each GPU's health reported."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from dra_driver.enforce.base import GpuHealth, MpsError
from dra_driver.enforce.lifecycle import ClaimLifecycle
from dra_driver.enforce.objects import EFFECT_ERRORS
from dra_driver.enforce.targets import FractionTarget
from dra_driver.model.vocabulary import Tier

log = structlog.get_logger(__name__)


class HealthRepair:
    """Checks and repairs what the claims of a :class:`ClaimLifecycle` need.

    Not locked: its owner, the enforcer, serializes every call.

    Attributes:
        daemon_restarts: control daemons found not answering (and restarted) so far.
        service_down: the MPS node service was not ready at the last check (every daemon
            has a :meth:`~dra_driver.enforce.daemon.MpsDaemon.service_problem`).
    """

    def __init__(self, life: ClaimLifecycle) -> None:
        self.life = life
        self.daemon_restarts = 0
        self.service_down = False

    def check(self) -> dict[str, GpuHealth]:
        """Retry pending claims, then check every daemon, server and namespace that applied
        claims need; repair what is gone.

        A daemon that does not answer is restarted and every claim it served re-applied; a
        missing or failed server (shared or a claim's own) is re-created with its namespaces;
        a missing namespace re-created. Returns GPU UUID -> health, for each GPU with claims.
        """
        self._retry_pending()
        health: dict[str, GpuHealth] = {}
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
            self._repair(targets, health)
        down = bool(daemons) and all(problems.values())
        if down != self.service_down:
            self.service_down = down
            if down:
                log.error("MPS service not ready; its GPUs are reported unhealthy", **problems)
            else:
                log.info("MPS service ready again; claims re-applied where needed")
        self.life.reset_compute_modes()  # retry restores that failed while the plugin runs
        return health

    def _retry_pending(self) -> None:
        for uid, plan in list(self.life.ledger.pending.items()):
            try:
                self.life.apply(plan)
            except MpsError as exc:
                log.warning("pending claim still not restored", claim_uid=uid, error=str(exc))

    def _repair(self, targets: Sequence[FractionTarget], health: dict[str, GpuHealth]) -> None:
        """Ensure each ``(server, namespace)`` of ``targets`` once; record each target's GPU
        in ``health`` (a failure makes the GPU unhealthy whatever its other targets say)."""
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
            self._note_pipe(t, result, bound)
            health.setdefault(t.gpu.uuid, GpuHealth(t.gpu.uuid, True))

    def _note_pipe(
        self, t: FractionTarget, pipe: str, bound: structlog.typing.FilteringBoundLogger
    ) -> None:
        applied = self.life.ledger.claims.get(t.claim.uid)
        if applied is None:
            return
        if applied.record_pipe(t.gpu.uuid, pipe):
            bound.warning(
                "claim's MPS pipe directory was re-created; running containers still see the "
                "old one and must be restarted to reach MPS",
                pipe_dir=pipe,
            )
