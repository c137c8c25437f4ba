"""A simulated enforcer for GPU-free nodes: records calls, returns the real CDI edits.

It runs no command. Its edits come from the same pure functions the real
:class:`~dra_driver.mps.MpsEnforcer` uses (:func:`~dra_driver.mps.targets.plan_targets`,
:func:`~dra_driver.mps.targets.claim_edits`), with each namespace's pipe directory at the path
MPS v3 lays it out (:func:`~dra_driver.mps.targets.namespace_pipe_dir`). So a simulated node
refuses what a real one refuses (e.g. a multi-GPU claim with mixed limits) and hands out the
real shape: the pipe mount, the memory env and, on ``hard`` GPUs, the memory-limit and record
hooks.

With ``make_dirs`` (a simulated node whose specs a real runtime reads) it also creates each
claim's namespace pipe directory, which runc bind-mounts into the container, and removes it
when the claim is released.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dra_driver.atomicfile import ensure_dir
from dra_driver.cdi import ContainerEdits
from dra_driver.mps.base import MpsError
from dra_driver.mps.targets import (
    CONTAINER_PIPE_DIR,
    FractionTarget,
    MpsOptions,
    check_mode_conflicts,
    claim_edits,
    namespace_pipe_dir,
    plan_targets,
)
from dra_driver.prepare import ClaimPlan

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
            tiers = {d.gpu.uuid: "hard" for d in plan.devices}
        return plan_targets(plan, tiers, self.options.default_active_thread_percentage)

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
        if self.make_dirs:
            for d in self._pipe_dirs(targets):
                ensure_dir(d, 0o755)

    def _applied_targets(self, uid: str, plan: ClaimPlan) -> tuple[FractionTarget, ...]:
        memo = self._memo.get(uid)
        if memo is not None and memo[0] is plan:
            return memo[1]
        # A plan recorded by restore() without validation may be invalid: it holds no mode.
        targets = self._validated_or_none(plan)
        self._memo[uid] = (plan, targets)
        return targets

    def release(self, claim_uid: str) -> None:
        """Forget the claim (idempotent)."""
        self.calls.append(("release", claim_uid))
        plan = self.applied.pop(claim_uid, None)
        memo = self._memo.pop(claim_uid, None)
        if self.make_dirs and plan is not None:
            targets = memo[1] if memo is not None else self._validated_or_none(plan)
            for d in self._pipe_dirs(targets):
                with contextlib.suppress(OSError):
                    d.rmdir()  # empty on a simulated node: no MPS daemon writes into it

    def _validated_or_none(self, plan: ClaimPlan) -> tuple[FractionTarget, ...]:
        try:
            return self.targets(plan)
        except MpsError:
            return ()

    def restore(self, plans: Sequence[ClaimPlan]) -> None:
        """Re-record every plan."""
        self.calls.append(("restore", str(len(plans))))
        for plan in plans:
            self.applied[plan.claim.uid] = plan
            self._make_pipe_dirs(self._validated_or_none(plan))
