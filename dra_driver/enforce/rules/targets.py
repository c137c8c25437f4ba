"""Pure decisions of MPS enforcement: a claim's per-GPU targets and the CDI edits they give.

Both enforcers use these functions, so a simulated node
(:class:`~dra_driver.enforce.RecordingEnforcer`)
hands containers exactly the edits a real node (:class:`~dra_driver.enforce.MpsEnforcer`) would:

- :func:`targets_for_claim`: claim plan + GPU tiers -> one :class:`FractionTarget` per GPU,
  validated (including the multi-GPU rules below);
- :func:`namespace_pipe_dir`: where a target's namespace pipe directory lives on the host;
- :func:`target_edits` / :func:`claim_edits`: the CDI container edits per device;
- :func:`check_mode_conflicts`: one GPU never serves both compute modes.

Single-GPU claims: one namespace ``c_<uid>`` on the GPU's shared server ``gpu_<index>``; several
devices of the claim on that GPU share it (requests and limits summed, limit capped at the card;
thread percentages summed, capped at 100).

Multi-GPU claims (MPS devices on several GPUs): a client connects to one pipe directory, so the
claim gets its own server ``m_<uid>`` whose ``--allowed-devices`` are all its GPUs, in the
daemon of its compute mode, with one namespace ``claim`` (short, so that its socket path fits
the kernel's limit, :mod:`dra_driver.app.sockets`). A namespace has one pinned memory
limit, applied to each GPU, and one thread percentage, and the hook's
``NVIDIA_GPU_MEMORY_REQUEST``/``_LIMIT`` env is container-wide (``docs/enforcement.md``,
"Multi-device claims", with sources); so every GPU of the
claim must have the same mode, tier, limit and thread percentage, and on ``hard`` GPUs the same
request. Each device still gets the memory-limit hook for its own GPU only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from dra_driver.enforce.rules.base import MpsError
from dra_driver.enforce.rules.hooks import (
    CTK_HOOK_PATH,
    RECORD_SHELL,
)
from dra_driver.enforce.rules.names import (
    CONTROL_BINARY,
    DEDICATED_NAMESPACE,
    dedicated_server_name,
    memory_arg,
    mib,
    namespace_name,
    parse_memory,
    server_name,
)
from dra_driver.enforce.rules.rows import NamespaceRow
from dra_driver.model.gpu import MIB, Gpu
from dra_driver.model.plans import ClaimPlan, ClaimRef
from dra_driver.model.vocabulary import COMPUTE_MODES, TIERS, ComputeMode, Tier

"""Enforcement tiers (``memoryEnforcement`` attribute), strongest first."""

DEFAULT_ROOT = "/run/gpu-fraction"
"""Default host directory for MPS pipe/log directories, markers and cgroup records."""


@dataclass(frozen=True)
class MpsOptions:
    """Node-level settings of the MPS enforcer (defaults documented in docs/enforcement.md).

    Attributes:
        root: host directory for everything the enforcer writes (see ``enforcer`` module).
        control_binary: ``nvidia-cuda-mps-control`` (must run inside the plugin container).
        ctk_hook_path: host path of the toolkit's ``nvidia-cdi-hook``.
        driver_root: ``--driver-root`` for the toolkit hook (host path; ``/`` or e.g.
            ``/run/nvidia/driver`` with a containerised driver).
        record_cgroups: have the consumer gate record the container's cgroup on ``hard`` GPUs.
        record_shell: host shell that runs the consumer gate.
        cgroup_root: cgroup v2 mount as the plugin sees it.
        dmem_backend: whether the driver uses the dmem cgroup backend (drift repair needed).
        default_active_thread_percentage: sm-sharing claims without a value (1..100; 100 =
            no SM ceiling; it is a ceiling, not a reservation).
        time_slicing_compute_mode: NVML compute mode set on time-slicing GPUs while served.
        sm_sharing_compute_mode: NVML compute mode set on sm-sharing GPUs while served.
        service: the MPS node service runs the control daemons (``dra-driver mps-service``);
            the enforcer is its client and never starts or stops one. False: the enforcer
            starts them itself, inside the plugin (they die with the plugin's container).
        command_timeout: seconds per MPS control command.
        server_checks: ``server list`` polls after ``server create`` (stops early at Ready).
        server_check_interval: seconds between those polls.
    """

    root: str = DEFAULT_ROOT
    control_binary: str = CONTROL_BINARY
    ctk_hook_path: str = CTK_HOOK_PATH
    driver_root: str = "/"
    record_cgroups: bool = True
    record_shell: str = RECORD_SHELL
    cgroup_root: str = "/sys/fs/cgroup"
    dmem_backend: bool = True
    default_active_thread_percentage: int = 100
    time_slicing_compute_mode: str = "EXCLUSIVE_PROCESS"
    sm_sharing_compute_mode: str = "EXCLUSIVE_PROCESS"
    service: bool = False
    command_timeout: float = 10.0
    server_checks: int = 10
    server_check_interval: float = 0.5

    @property
    def mps_root(self) -> Path:
        """``<root>/mps``: the daemons' directories."""
        return Path(self.root) / "mps"

    @property
    def record_root(self) -> Path:
        """``<root>/cgroups``: the cgroup records' directory (written by the consumer gate)."""
        return Path(self.root) / "cgroups"

    @property
    def user_record_root(self) -> Path:
        """``<root>/users``: the user hook's directory (``<claim-uid>/<container-id>``)."""
        return Path(self.root) / "users"

    def compute_mode_for(self, mode: str) -> str:
        """The NVML compute mode a GPU of ``mode`` runs while it has claims."""
        return (
            self.sm_sharing_compute_mode
            if mode == ComputeMode.SM_SHARING
            else self.time_slicing_compute_mode
        )


@dataclass(frozen=True)
class FractionTarget:
    """What one claim gets on one GPU (all its devices on that GPU together).

    Attributes:
        claim: the claim.
        gpu: the GPU.
        mode: ``time-slicing`` | ``sm-sharing``.
        tier: ``hard`` | ``cooperative`` | ``none``.
        device_keys: ``DevicePlan.key`` of the claim's devices on this GPU.
        request_bytes: soft limit (guarantee), bytes.
        limit_bytes: ceiling, bytes (MPS gets it in whole MiB, rounded down).
        threads: active thread percentage set on the namespace.
        claim_gpus: every GPU of a multi-GPU MPS claim (its own server's allowed devices,
            by index); empty for a claim on one GPU (served by the GPU's shared server).
        max_consumers: containers that may use the claim at once (the smallest
            ``maxConsumers`` of its devices); each gets 1/max_consumers of the request and
            the ceiling (:attr:`consumer_request_mib`, :attr:`consumer_limit_mib`).
        device_bytes: (request, ceiling) in bytes of each device in :attr:`device_keys`, in
            the same order: what a container that gets that device alone may hold
            (:func:`dra_driver.enforce.rules.edits.device_consumer_mib`); empty: the target's.
    """

    claim: ClaimRef
    gpu: Gpu
    mode: str
    tier: str
    device_keys: tuple[str, ...]
    request_bytes: int
    limit_bytes: int
    threads: int
    claim_gpus: tuple[Gpu, ...] = ()
    max_consumers: int = 1
    device_bytes: tuple[tuple[int, int], ...] = ()

    @property
    def consumer_limit_mib(self) -> int:
        """What one consumer (container) of the claim may hold on this GPU, whole MiB: the
        ceiling divided among :attr:`max_consumers`, rounded down, so that all of them together
        stay within the claim's ceiling."""
        return mib(self.limit_bytes) // self.max_consumers

    @property
    def consumer_request_mib(self) -> int:
        """One consumer's share of the guarantee (soft limit), whole MiB, rounded down."""
        return mib(self.request_bytes) // self.max_consumers

    @property
    def log_fields(self) -> dict[str, str]:
        """What every log line about this target carries: ``claim_uid``, ``namespace``,
        ``name`` (the claim's) and ``gpu`` (its UUID)."""
        claim = self.claim
        return {"claim_uid": claim.uid, "namespace": claim.namespace, "name": claim.name,
                "gpu": self.gpu.uuid}  # fmt: skip

    @property
    def dedicated(self) -> bool:
        """Whether the claim has its own MPS server (it spans several GPUs)."""
        return len(self.claim_gpus) > 1

    @property
    def server(self) -> str:
        """The MPS server: the claim's own ``m_<uid>`` or the GPU's shared ``gpu_<index>``."""
        return (
            dedicated_server_name(self.claim.uid) if self.dedicated else server_name(self.gpu.index)
        )

    @property
    def server_gpus(self) -> tuple[Gpu, ...]:
        """The GPUs the server is created for (``--allowed-devices``)."""
        return self.claim_gpus if self.dedicated else (self.gpu,)

    @property
    def namespace(self) -> str:
        """The claim's MPS namespace: ``c_<uid>`` on a shared server, ``claim`` on its own."""
        return DEDICATED_NAMESPACE if self.dedicated else namespace_name(self.claim.uid)

    @property
    def uses_mps(self) -> bool:
        """Whether this target has an MPS namespace (tier hard or cooperative)."""
        return self.tier != Tier.NONE


def gpus_text(gpus: Sequence[Gpu]) -> str:
    """``GPU 0 (GPU-...)`` or ``GPUs 0 (GPU-...), 1 (GPU-...)`` for messages."""
    listed = ", ".join(f"{g.index} ({g.uuid})" for g in gpus)
    return f"GPU{'s' if len(gpus) > 1 else ''} {listed}"


def targets_for_claim(
    plan: ClaimPlan, tiers: Mapping[str, str], default_threads: int = 100
) -> tuple[FractionTarget, ...]:
    """Pure: the per-GPU targets of a claim, validated. Admin-access devices have none.

    Args:
        plan: the claim's plan.
        tiers: GPU UUID -> tier (missing = ``none``).
        default_threads: active thread percentage of sm-sharing claims without one.

    Raises:
        MpsError: devices of one GPU with different modes, an SM percentage on a time-slicing
            GPU or outside 1..100, request above limit, a limit below 1 MiB, sm-sharing on a GPU
            without MPS; for MPS devices on several GPUs: GPUs that differ in compute mode,
            tier, memory limit or thread percentage (or request, on ``hard`` GPUs).
    """
    ref = plan.claim
    who = f"claim {ref.namespace}/{ref.name}"
    consumers = min((d.max_consumers for d in plan.devices if not d.admin_access), default=1)
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(plan.devices):
        if not d.admin_access:  # monitoring access: no namespace, nothing to enforce
            groups.setdefault(d.gpu.uuid, []).append(i)
    targets = []
    for uuid, indexes in groups.items():
        devs = [plan.devices[i] for i in indexes]
        gpu = devs[0].gpu
        where = f"{who}, GPU {gpu.index} ({uuid})"
        modes = {d.compute_mode for d in devs}
        if len(modes) != 1:
            raise MpsError(f"{where}: devices ask for different compute modes {sorted(modes)}")
        mode = modes.pop()
        if mode not in COMPUTE_MODES:
            raise MpsError(f"{where}: unknown compute mode {mode!r}")
        tier = tiers.get(uuid, Tier.NONE)
        if tier not in TIERS:
            raise MpsError(f"{where}: unknown enforcement tier {tier!r}")
        threads_sum = 0
        for d in devs:
            atp = d.active_thread_percentage
            if atp is not None and mode != ComputeMode.SM_SHARING:
                raise MpsError(
                    f"{where}: device {d.device} sets activeThreadPercentage on a {mode} GPU; "
                    "only sm-sharing GPUs take an SM ceiling"
                )
            if atp is not None and not 1 <= atp <= 100:
                raise MpsError(f"{where}: activeThreadPercentage {atp} is not in 1..100")
            if d.memory_request_bytes > d.memory_limit_bytes:
                raise MpsError(
                    f"{where}: device {d.device} requests {d.memory_request_bytes} bytes above "
                    f"its limit {d.memory_limit_bytes} bytes"
                )
            if d.memory_request_bytes < 0:
                raise MpsError(f"{where}: device {d.device} has a negative memory request")
            threads_sum += atp if atp is not None else default_threads
        limit = min(sum(d.memory_limit_bytes for d in devs), gpu.memory_bytes)
        request = min(sum(d.memory_request_bytes for d in devs), limit)
        threads = 100 if mode == ComputeMode.TIME_SLICING else min(100, threads_sum)
        if tier == Tier.NONE and mode == ComputeMode.SM_SHARING:
            raise MpsError(f"{where}: sm-sharing needs MPS, and this GPU has no usable MPS")
        if tier != Tier.NONE and limit < MIB:
            raise MpsError(f"{where}: memory limit {limit} bytes is below 1 MiB")
        if tier != Tier.NONE and mib(limit) < consumers:
            raise MpsError(
                f"{where}: memory limit {mib(limit)} MiB cannot be divided among maxConsumers "
                f"{consumers} (at least 1 MiB each); lower maxConsumers"
            )
        targets.append(
            FractionTarget(
                claim=ref,
                gpu=gpu,
                mode=mode,
                tier=tier,
                device_keys=tuple(d.key for d in devs),
                device_bytes=tuple((d.memory_request_bytes, d.memory_limit_bytes) for d in devs),
                request_bytes=request,
                limit_bytes=limit,
                threads=threads,
                max_consumers=consumers,
            )
        )
    return _join_gpus(who, targets)


def _join_gpus(who: str, targets: list[FractionTarget]) -> tuple[FractionTarget, ...]:
    """Validate a claim's GPUs as one dedicated server and mark its targets (``claim_gpus``)."""
    if len(targets) < 2 or not any(t.uses_mps for t in targets):
        return tuple(targets)

    def same(what: str, value: Callable[[FractionTarget], object], why: str, hint: str) -> None:
        if len({value(t) for t in targets}) == 1:
            return
        each = "; ".join(
            f"{', '.join(t.device_keys)} on GPU {t.gpu.index} ({t.gpu.uuid}): {value(t)}"
            for t in targets
        )
        raise MpsError(
            f"{who} spans {len(targets)} GPUs with different {what} ({each}); {why}. {hint}"
        )

    same(
        "enforcement tiers",
        lambda t: t.tier,
        "a multi-GPU claim is served by one MPS server, so its GPUs need one tier",
        "Select GPUs of one memoryEnforcement tier, or use one claim per GPU",
    )
    same(
        "compute modes",
        lambda t: t.mode,
        "a multi-GPU claim gets one MPS server in the daemon of one compute mode",
        "Select GPUs of one computeMode (e.g. a matchAttribute constraint on computeMode)",
    )
    same(
        "memory limits (MiB)",
        lambda t: mib(t.limit_bytes),
        "an MPS namespace has one pinned memory limit, which applies to each GPU (not summed)",
        "Ask for the same product/memory and limit on every GPU, or use one claim per GPU",
    )
    same(
        "active thread percentages",
        lambda t: t.threads,
        "an MPS namespace has one active thread percentage for all its GPUs",
        "Give every device the same activeThreadPercentage, or use one claim per GPU",
    )
    if targets[0].tier == Tier.HARD:
        same(
            "memory requests (MiB)",
            lambda t: mib(t.request_bytes),
            "the memory-limit hook reads one NVIDIA_GPU_MEMORY_REQUEST for the whole container",
            "Ask for the same product/memory on every GPU, or use one claim per GPU",
        )
    gpus = tuple(sorted((t.gpu for t in targets), key=lambda g: g.index))
    return tuple(replace(t, claim_gpus=gpus) for t in targets)


def namespace_drift(row: NamespaceRow, target: FractionTarget) -> list[str]:
    """Pure: how the namespace as ``namespace list`` shows it differs from ``target``'s limits
    (pinned memory limit in whole MiB, active thread percentage); ``[]`` when it matches.

    Each entry reads ``pinned memory limit '7G', expected 2048M``.
    """
    out = []
    want = memory_arg(target.limit_bytes)
    try:
        limit = parse_memory(row.pinned_memory_limit)
    except MpsError:
        limit = None
    if limit != mib(target.limit_bytes) * MIB:
        out.append(f"pinned memory limit {row.pinned_memory_limit!r}, expected {want}")
    if row.active_thread_percentage.strip() != str(target.threads):
        out.append(
            f"active thread percentage {row.active_thread_percentage!r}, expected {target.threads}"
        )
    return out


def check_mode_conflicts(
    claim_uid: str,
    targets: Sequence[FractionTarget],
    others: Iterable[tuple[str, Sequence[FractionTarget]]],
) -> None:
    """Refuse ``targets`` when another claim uses one of their GPUs in the other mode.

    Args:
        claim_uid: the claim being applied (its own earlier targets do not count).
        targets: its targets.
        others: (claim UID, targets) of the claims already applied.

    Raises:
        MpsError: naming the GPU, its current mode and one claim holding it.
    """
    modes = {t.gpu.uuid: t for t in targets}
    for other_uid, other in others:
        if other_uid == claim_uid:
            continue
        for o in other:
            t = modes.get(o.gpu.uuid)
            if t is not None and o.mode != t.mode:
                raise MpsError(
                    f"claim {t.claim.namespace}/{t.claim.name}: GPU {t.gpu.index} "
                    f"({t.gpu.uuid}) serves {o.mode} claims (e.g. {other_uid}); this "
                    f"claim asks for {t.mode}. One GPU never carries both modes; "
                    "change a GPU's mode only while it has no claims"
                )
