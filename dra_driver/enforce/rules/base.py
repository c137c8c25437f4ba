"""The enforcement interface the plugin's Prepare/Unprepare call (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from dra_driver.model.cdi import ContainerEdits
from dra_driver.model.errors import ClaimError
from dra_driver.model.plans import ClaimPlan, ClaimRef


class MpsError(ClaimError, RuntimeError):
    """Enforcement failed for one claim (daemon down, command refused); message is user-facing."""


def disk_problem(exc: OSError) -> str:
    """An OSError of the node's MPS files in a user's terms, without errno numbers:
    ``[Errno 20] Not a directory: '/run/x/mps'`` -> ``the node's MPS directory /run/x/mps
    cannot be used (not a directory); the plugin's --mps-root (chart: runDir) must be a
    directory the plugin can write``."""
    reason = (exc.strerror or type(exc).__name__).lower()
    where = f" {exc.filename}" if exc.filename else ""
    return (
        f"the node's MPS directory{where} cannot be used ({reason}); the plugin's --mps-root "
        "(chart: runDir) must be a directory the plugin can write"
    )


@dataclass(frozen=True)
class GpuHealth:
    """Health of enforcement on one GPU (from :meth:`FractionEnforcer.check_health`);
    ``detail`` says what failed."""

    gpu_uuid: str
    healthy: bool
    detail: str = ""


@dataclass(frozen=True)
class ClientTermination:
    """MPS clients of one claim on one GPU that the enforcer terminated
    (from :meth:`FractionEnforcer.check_clients`).

    Attributes:
        claim: the claim.
        gpu_uuid: the GPU (of a multi-GPU claim: the one whose cap binds).
        pids: the terminated clients' host PIDs, newest first.
        cap: the claim's client cap there (client contexts per device).
        reason: why, e.g. ``over_claim_cap`` (a Prometheus label value).
    """

    claim: ClaimRef
    gpu_uuid: str
    pids: tuple[int, ...]
    cap: int
    reason: str


class FractionEnforcer(Protocol):
    """Applies and removes a claim's memory ceilings and compute mode on the node.

    Every method is idempotent: applying an applied claim or releasing an unknown one is
    not an error. Calls are serialized by the plugin's prepare lock.
    """

    def apply(self, plan: ClaimPlan) -> Mapping[str, ContainerEdits]:
        """Enforce ``plan``; return the container edits per device plan key
        (``DevicePlan.key``): env, mounts and hooks (device nodes are added by the caller).

        Raises:
            MpsError: when the claim cannot be enforced; nothing of it is left applied.
        """
        ...

    def enforced(self, plan: ClaimPlan) -> bool:
        """Whether ``plan`` is applied as it stands and its pipe directories exist (cheap:
        from the enforcer's own records and the file system, no MPS command); False means
        :meth:`apply` it again."""
        ...

    def release(self, claim_uid: str) -> None:
        """Remove everything :meth:`apply` set up for the claim (unknown UID: no-op)."""
        ...

    def restore(self, plans: Sequence[ClaimPlan]) -> None:
        """Re-apply every prepared claim after a plugin or daemon restart, and remove what
        claims not in ``plans`` left (a plugin killed before recording or after forgetting
        them)."""
        ...

    def check_health(self) -> Mapping[str, GpuHealth] | None:
        """Check, and repair, what the applied claims need (the plugin calls it every 10 s):
        GPU UUID -> health for each GPU with claims; None when this enforcer runs nothing that
        needs supervising (the plugin then stops asking)."""
        ...

    def check_clients(self) -> Sequence[ClientTermination] | None:
        """Terminate each claim's MPS clients beyond its share of the server's client table
        (the plugin calls it every 2 s): what was terminated; None when this enforcer runs no
        MPS clients (the plugin then stops asking)."""
        ...
