"""The MPS enforcer's record of claims: what each applied claim set up (targets, pipe
directories) and which claims wait for a retry, with the target queries the other parts share."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dra_driver.enforce.rules.base import MpsError
from dra_driver.enforce.rules.targets import FractionTarget, targets_for_claim
from dra_driver.model.plans import ClaimPlan


@dataclass
class Applied:
    """One applied claim: its plan, its targets, and per GPU UUID the pipe directory of its
    namespace with that directory's ``(st_dev, st_ino)`` when recorded, and the PID of its
    server as last seen (when ``server list`` shows one)."""

    plan: ClaimPlan
    targets: tuple[FractionTarget, ...]
    pipes: dict[str, str] = field(default_factory=dict)
    inodes: dict[str, tuple[int, int]] = field(default_factory=dict)
    server_pids: dict[str, int] = field(default_factory=dict)

    def record_server(self, gpu_uuid: str, pid: int | None) -> int | None:
        """Record ``pid`` as the PID of the GPU's server (None: unknown, nothing recorded);
        returns the PID it replaces when that was another one (the server was restarted: its
        clients lost their connection), else None."""
        if pid is None:
            return None
        before = self.server_pids.get(gpu_uuid)
        self.server_pids[gpu_uuid] = pid
        return before if before is not None and before != pid else None

    def record_pipe(self, gpu_uuid: str, pipe: str) -> bool:
        """Record ``pipe`` as the GPU's pipe directory; True when it replaces a recorded one
        that was another directory (re-created: running containers still see the old one)."""
        before = self.inodes.get(gpu_uuid)
        now = inode(pipe)
        self.pipes[gpu_uuid] = pipe
        self.inodes[gpu_uuid] = now
        return before is not None and now != before


class Ledger:
    """Applied claims (:attr:`claims`) and claims waiting for a retry (:attr:`pending`), by
    claim UID. Not locked: its owner, the enforcer, serializes every call.

    Args:
        tiers: GPU UUID -> tier, to compute the targets of pending claims.
        default_threads: active thread percentage of ``sm-sharing`` claims that set none.
    """

    def __init__(self, tiers: Mapping[str, str], default_threads: int) -> None:
        self.tiers = tiers
        self.default_threads = default_threads
        self.claims: dict[str, Applied] = {}
        self.pending: dict[str, ClaimPlan] = {}

    def keep_only(self, plans: Sequence[ClaimPlan]) -> None:
        """Forget claims not in ``plans``; every claim of ``plans`` not applied is pending."""
        wanted = {p.claim.uid for p in plans}
        for uid in [u for u in self.claims if u not in wanted]:
            del self.claims[uid]
        self.pending = {u: p for u, p in self.pending.items() if u in wanted}
        self.pending.update({p.claim.uid: p for p in plans if p.claim.uid not in self.claims})

    def targets(self) -> list[FractionTarget]:
        """Every target of every applied claim (all tiers)."""
        return list(self._applied())

    def mode_targets(self, mode: str) -> list[FractionTarget]:
        """MPS targets of applied claims in compute mode ``mode``."""
        return [t for t in self._applied() if t.uses_mps and t.mode == mode]

    def targets_of(self, plan: ClaimPlan) -> Sequence[FractionTarget]:
        """``plan``'s targets (none when it is invalid: it never made anything)."""
        try:
            return targets_for_claim(plan, self.tiers, self.default_threads)
        except MpsError:
            return ()

    def held(self) -> Iterator[tuple[str, Sequence[FractionTarget]]]:
        """(claim UID, targets) of every claim whose MPS state this process keeps: applied ones
        and pending ones (a pending claim's namespace may be there with its pods' clients)."""
        for uid, applied in self.claims.items():
            yield uid, applied.targets
        for uid, plan in self.pending.items():
            yield uid, self.targets_of(plan)

    def wanted_targets(self) -> list[FractionTarget]:
        """MPS targets of every claim that should be enforced: applied ones and pending ones
        (not yet re-applied after a restart or a failure). Servers and daemons they use are
        never retired, so one claim's rollback cannot tear down another's namespace."""
        return [t for _, targets in self.held() for t in targets if t.uses_mps]

    def _applied(self) -> Iterator[FractionTarget]:
        return (t for a in self.claims.values() for t in a.targets)


def inode(path: str) -> tuple[int, int]:
    """``(st_dev, st_ino)`` of ``path``; ``(0, 0)`` when it cannot be read."""
    try:
        st = Path(path).stat()
    except OSError:
        return (0, 0)
    return (st.st_dev, st.st_ino)
