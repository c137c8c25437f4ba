"""A simulated enforcer for GPU-free nodes: records calls, returns the real CDI edits.

It runs no command. Its edits come from the same pure functions the real
:class:`~dra_driver.enforce.MpsEnforcer` uses
(:func:`~dra_driver.enforce.rules.targets.targets_for_claim`,
:func:`~dra_driver.enforce.rules.edits.claim_edits`), with each namespace's pipe directory at the
path MPS v3 lays it out (:func:`~dra_driver.enforce.rules.edits.namespace_pipe_dir`). So a simulated
node refuses what a real one refuses (e.g. a multi-GPU claim with mixed limits) and hands out the
real shape: the pipe mount, the memory env and, on ``hard`` GPUs, the memory-limit and record hooks.

With ``make_dirs`` (a simulated node whose specs a real runtime reads) it also creates each
claim's namespace pipe directory, which runc bind-mounts into the container, and removes it
when the claim is released; like the real enforcer, ``restore`` removes those of claims it is
not given and ``release`` of a claim it does not know removes what is on disk for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dra_driver.enforce.rules.base import MpsError, disk_problem
from dra_driver.enforce.rules.edits import CONTAINER_PIPE_DIR, claim_edits, namespace_pipe_dir
from dra_driver.enforce.rules.names import claim_uid_of, claim_uid_of_server
from dra_driver.enforce.rules.targets import (
    FractionTarget,
    MpsOptions,
    check_mode_conflicts,
    targets_for_claim,
)
from dra_driver.infra.atomicfile import ensure_dir
from dra_driver.model.cdi import ContainerEdits
from dra_driver.model.plans import ClaimPlan
from dra_driver.model.vocabulary import Tier

__all__ = ["CONTAINER_PIPE_DIR", "RecordingEnforcer"]


@dataclass
class RecordingEnforcer:
    """Records ``apply``/``release``/``restore`` calls; ``applied`` maps claim UID -> plan.

    Attributes:
        applied: plans of the applied claims.
        calls: ``(verb, claim UID or plan count)`` in call order.
        fail_for: claim UIDs whose ``apply`` raises (to test failure isolation).
        tiers: GPU UUID -> tier as on a real node; None (default) = every GPU ``hard``.
        options: the paths and defaults a real enforcer would use.
        make_dirs: create (and on release remove) the pipe directories the edits mount.
    """

    applied: dict[str, ClaimPlan] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    fail_for: set[str] = field(default_factory=set)
    tiers: Mapping[str, str] | None = None
    options: MpsOptions = field(default_factory=MpsOptions)
    make_dirs: bool = False
    _memo: dict[str, tuple[ClaimPlan, tuple[FractionTarget, ...]]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def targets(self, plan: ClaimPlan) -> tuple[FractionTarget, ...]:
        """The plan's per-GPU targets, validated as the real enforcer validates them.

        Raises:
            MpsError: for a plan the real enforcer would refuse.
        """
        tiers = self.tiers
        if tiers is None:
            tiers = {d.gpu.uuid: Tier.HARD for d in plan.devices}
        return targets_for_claim(plan, tiers, self.options.default_active_thread_percentage)

    def apply(self, plan: ClaimPlan) -> Mapping[str, ContainerEdits]:
        """Record the plan and return per-device edits; raise MpsError for ``fail_for`` and
        for plans the real enforcer refuses (nothing is recorded then)."""
        uid = plan.claim.uid
        self.calls.append(("apply", uid))
        if uid in self.fail_for:
            raise MpsError(f"simulated MPS failure for claim {uid}")
        targets = self.targets(plan)
        check_mode_conflicts(
            uid, targets, ((u, self._applied_targets(u, p)) for u, p in self.applied.items())
        )
        self._make_pipe_dirs(targets)
        self.applied[uid] = plan
        self._memo[uid] = (plan, targets)
        return claim_edits(targets, self.options)

    def _pipe_dirs(self, targets: Sequence[FractionTarget]) -> list[Path]:
        return [Path(namespace_pipe_dir(t, self.options)) for t in targets if t.uses_mps]

    def _make_pipe_dirs(self, targets: Sequence[FractionTarget]) -> None:
        """Create the targets' pipe directories (with ``make_dirs``).

        Raises:
            MpsError: a directory cannot be made
                (:func:`~dra_driver.enforce.rules.base.disk_problem`).
        """
        if self.make_dirs:
            try:
                for d in self._pipe_dirs(targets):
                    ensure_dir(d, 0o755)
            except OSError as exc:
                raise MpsError(disk_problem(exc)) from exc

    def _applied_targets(self, uid: str, plan: ClaimPlan) -> tuple[FractionTarget, ...]:
        memo = self._memo.get(uid)
        if memo is not None and memo[0] is plan:
            return memo[1]
        # A plan recorded by restore() without validation may be invalid: it holds no mode.
        targets = self._validated_or_none(plan)
        self._memo[uid] = (plan, targets)
        return targets

    def enforced(self, plan: ClaimPlan) -> bool:
        """Whether ``plan`` is recorded as it stands and (with ``make_dirs``) its pipe
        directories exist."""
        uid = plan.claim.uid
        if self.applied.get(uid) != plan:
            return False
        targets = self._applied_targets(uid, self.applied[uid])
        return not self.make_dirs or all(d.is_dir() for d in self._pipe_dirs(targets))

    def release(self, claim_uid: str) -> None:
        """Forget the claim and remove its pipe directories, known or not (idempotent)."""
        self.calls.append(("release", claim_uid))
        self.applied.pop(claim_uid, None)
        self._memo.pop(claim_uid, None)
        self._remove_dirs(lambda uid: uid == claim_uid)

    def _remove_dirs(self, whose: Callable[[str], bool]) -> None:
        """With ``make_dirs``: remove the namespace pipe directories and claim server
        directories on disk of the claims ``whose`` selects (by claim UID)."""
        if not self.make_dirs:
            return
        for server in sorted(self.options.mps_root.glob("*/pipe/*")):
            owner = claim_uid_of_server(server.name)
            for ns in sorted(server.iterdir()) if server.is_dir() else ():
                # A claim's own server (multi-GPU) holds one namespace of a fixed name.
                uid = owner if owner is not None else claim_uid_of(ns.name)
                if uid is not None and whose(uid):
                    with contextlib.suppress(OSError):
                        ns.rmdir()  # empty on a simulated node: no MPS daemon writes into it
            if owner is not None and whose(owner):
                with contextlib.suppress(OSError):
                    server.rmdir()

    def _validated_or_none(self, plan: ClaimPlan) -> tuple[FractionTarget, ...]:
        try:
            return self.targets(plan)
        except MpsError:
            return ()

    def restore(self, plans: Sequence[ClaimPlan]) -> None:
        """Re-record every plan (creating its pipe directories) and forget every other claim
        (removing what is on disk for it)."""
        self.calls.append(("restore", str(len(plans))))
        wanted = {p.claim.uid for p in plans}
        for uid in [u for u in self.applied if u not in wanted]:
            del self.applied[uid]
            self._memo.pop(uid, None)
        self._remove_dirs(lambda uid: uid not in wanted)
        for plan in plans:
            self.applied[plan.claim.uid] = plan
            self._make_pipe_dirs(self._validated_or_none(plan))

    def check_health(self) -> None:
        """Nothing to supervise: no daemon runs for simulated GPUs (returns None)."""
        return None

    def check_clients(self) -> None:
        """No MPS clients: no daemon runs for simulated GPUs (returns None)."""
        return None
