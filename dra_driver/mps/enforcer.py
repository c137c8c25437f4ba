"""The real :class:`~dra_driver.mps.base.FractionEnforcer`: MPS v3 namespaces plus, on ``hard``
GPUs, the driver's per-container memory limits. Design and sources: ``docs/enforcement.md``
and ``shared/reference/mps-notes.md``.

Layout on the node (host paths; the plugin sees them at the same paths):

- ``<root>/mps/<mode>/pipe``: pipe directory of the control daemon serving ``mode``
  (``time-slicing`` or ``sm-sharing``, see :mod:`dra_driver.mps.daemon`), started lazily;
- per GPU one server ``gpu_<index>`` with ``--allowed-devices=<UUID>``, created in the daemon
  of the GPU's mode after the GPU's compute mode is set (EXCLUSIVE_PROCESS by default);
- per claim one namespace ``c_<uid>`` on that server, ALWAYS with both a pinned memory limit
  (the claim's limit, whole MiB) and an active thread percentage (time-slicing: 100;
  sm-sharing: the claim's value or ``default_active_thread_percentage``), because named
  namespaces inherit nothing from the server (notes 2.4);
- the claim's container gets only its namespace's pipe directory, bind-mounted at
  ``/tmp/nvidia-mps``, and ``CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps``;
- ``hard`` GPUs add the toolkit's ``createRuntime`` memory-limit hook with
  ``NVIDIA_GPU_MEMORY_REQUEST``/``_LIMIT`` and our cgroup record hook (:mod:`.hooks`);
- ``<root>/mps/compute-mode/<uuid>``: marker of a GPU whose compute mode we changed (so a
  restarted plugin puts it back to DEFAULT when no claim needs it);
- ``<root>/cgroups/<claim-uid>/``: the record hook's files (:mod:`.janitor`).

Multi-device rule: all devices of a claim that use MPS must be on ONE GPU (a client connects to
one pipe directory, hence one per-GPU server; and the hook env is container-wide). Devices of
one claim on the same GPU share the claim's namespace: request and limit are summed (limit
capped at the card), thread percentages summed (capped at 100).
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from dra_driver.cdi import ContainerEdits, Mount
from dra_driver.gpus import MIB, Gpu
from dra_driver.mps.base import MpsError
from dra_driver.mps.control import CONTROL_BINARY, ClientRow, MpsCommandError, ServerRow
from dra_driver.mps.daemon import MODES, MpsDaemon
from dra_driver.mps.hooks import (
    CTK_HOOK_PATH,
    RECORD_SHELL,
    memory_env,
    memory_limit_hook,
    record_cgroup_hook,
)
from dra_driver.mps.janitor import SoftLimitJanitor
from dra_driver.mps.names import (
    claim_uid_of,
    memory_arg,
    mib,
    namespace_name,
    parse_memory,
    server_name,
)
from dra_driver.mps.nvml import NvmlError, NvmlFacade
from dra_driver.mps.recording import CONTAINER_PIPE_DIR
from dra_driver.prepare import ClaimPlan, ClaimRef
from dra_driver.runner import Runner

log = structlog.get_logger(__name__)

TIERS = ("hard", "cooperative", "none")
"""Enforcement tiers (``memoryEnforcement`` attribute), strongest first."""

DEFAULT_ROOT = "/run/gpu-fraction"
"""Default host directory for MPS pipe/log directories, markers and cgroup records."""

_BAD_STATUS = ("fail", "error", "exit", "fault", "dead", "terminat", "stop")
_READY = "ready"
_EFFECT_ERRORS = (MpsError, NvmlError, OSError)


@dataclass(frozen=True)
class MpsOptions:
    """Node-level settings of the MPS enforcer (defaults documented in docs/enforcement.md).

    Attributes:
        root: host directory for everything the enforcer writes (see module docstring).
        control_binary: ``nvidia-cuda-mps-control`` (must run inside the plugin container).
        ctk_hook_path: host path of the toolkit's ``nvidia-cdi-hook``.
        driver_root: ``--driver-root`` for the toolkit hook (host path; ``/`` or e.g.
            ``/run/nvidia/driver`` with a containerised driver).
        record_cgroups: add our cgroup record hook on ``hard`` GPUs.
        record_shell: host shell that runs the record hook.
        cgroup_root: cgroup v2 mount as the plugin sees it.
        dmem_backend: whether the driver uses the dmem cgroup backend (drift repair needed).
        default_active_thread_percentage: sm-sharing claims without a value (1..100; 100 =
            no SM ceiling; it is a ceiling, not a reservation).
        time_slicing_compute_mode: NVML compute mode set on time-slicing GPUs while served.
        sm_sharing_compute_mode: NVML compute mode set on sm-sharing GPUs while served.
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
    command_timeout: float = 10.0
    server_checks: int = 10
    server_check_interval: float = 0.5

    @property
    def mps_root(self) -> Path:
        """``<root>/mps``: the daemons' directories."""
        return Path(self.root) / "mps"

    @property
    def record_root(self) -> Path:
        """``<root>/cgroups``: the record hook's directory."""
        return Path(self.root) / "cgroups"

    def compute_mode_for(self, mode: str) -> str:
        """The NVML compute mode a GPU of ``mode`` runs while it has claims."""
        return (
            self.sm_sharing_compute_mode if mode == "sm-sharing" else self.time_slicing_compute_mode
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
    """

    claim: ClaimRef
    gpu: Gpu
    mode: str
    tier: str
    device_keys: tuple[str, ...]
    request_bytes: int
    limit_bytes: int
    threads: int

    @property
    def server(self) -> str:
        """The GPU's MPS server name."""
        return server_name(self.gpu.index)

    @property
    def namespace(self) -> str:
        """The claim's MPS namespace name."""
        return namespace_name(self.claim.uid)

    @property
    def uses_mps(self) -> bool:
        """Whether this target has an MPS namespace (tier hard or cooperative)."""
        return self.tier != "none"


@dataclass(frozen=True)
class GpuHealth:
    """Health of MPS enforcement on one GPU (from :meth:`MpsEnforcer.check_health`)."""

    gpu_uuid: str
    healthy: bool
    detail: str = ""


def plan_targets(
    plan: ClaimPlan, tiers: Mapping[str, str], default_threads: int = 100
) -> tuple[FractionTarget, ...]:
    """Pure: the per-GPU targets of a claim, validated.

    Args:
        plan: the claim's plan.
        tiers: GPU UUID -> tier (missing = ``none``).
        default_threads: active thread percentage of sm-sharing claims without one.

    Raises:
        MpsError: devices of one GPU with different modes, an SM percentage on a time-slicing
            GPU or outside 1..100, request above limit, a limit below 1 MiB, sm-sharing on a GPU
            without MPS, or MPS devices on more than one GPU.
    """
    ref = plan.claim
    who = f"claim {ref.namespace}/{ref.name}"
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(plan.devices):
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
        if mode not in MODES:
            raise MpsError(f"{where}: unknown compute mode {mode!r}")
        tier = tiers.get(uuid, "none")
        if tier not in TIERS:
            raise MpsError(f"{where}: unknown enforcement tier {tier!r}")
        threads_sum = 0
        for d in devs:
            atp = d.active_thread_percentage
            if atp is not None and mode != "sm-sharing":
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
        threads = 100 if mode == "time-slicing" else min(100, threads_sum)
        if tier == "none" and mode == "sm-sharing":
            raise MpsError(f"{where}: sm-sharing needs MPS, and this GPU has no usable MPS")
        if tier != "none" and limit < MIB:
            raise MpsError(f"{where}: memory limit {limit} bytes is below 1 MiB")
        targets.append(
            FractionTarget(
                claim=ref,
                gpu=gpu,
                mode=mode,
                tier=tier,
                device_keys=tuple(d.key for d in devs),
                request_bytes=request,
                limit_bytes=limit,
                threads=threads,
            )
        )
    if len(targets) > 1 and any(t.uses_mps for t in targets):
        gpus = ", ".join(f"{t.gpu.index} ({t.gpu.uuid})" for t in targets)
        raise MpsError(
            f"{who} has devices on several GPUs ({gpus}); an MPS client reaches one per-GPU "
            "server, so a claim's MPS fractions must all be on one GPU. Use one claim per GPU, "
            "or a matchAttribute constraint on 'uuid' for multi-device requests"
        )
    return tuple(targets)


def target_edits(
    target: FractionTarget, pipe_dir: str | None, options: MpsOptions
) -> ContainerEdits:
    """Pure: the CDI edits of one device of ``target`` (env, the pipe mount, hooks).

    Args:
        target: the claim's target on the device's GPU.
        pipe_dir: host path of the claim's namespace pipe directory (None for tier none).
        options: hook paths and the record directory.
    """
    env = [
        f"GPU_FRACTION_COMPUTE_MODE={target.mode}",
        f"GPU_FRACTION_MEMORY_ENFORCEMENT={target.tier}",
    ]
    if not target.uses_mps or pipe_dir is None:
        return ContainerEdits(env=tuple(env))
    env.insert(0, f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}")
    mounts = (Mount(pipe_dir, CONTAINER_PIPE_DIR),)
    if target.tier != "hard":
        return ContainerEdits(env=tuple(env), mounts=mounts)
    env.extend(memory_env(mib(target.request_bytes), mib(target.limit_bytes)))
    hooks = [memory_limit_hook(target.gpu.uuid, options.driver_root, options.ctk_hook_path)]
    if options.record_cgroups:
        record_dir = str(options.record_root / target.claim.uid)
        hooks.append(record_cgroup_hook(record_dir, options.record_shell))
    return ContainerEdits(env=tuple(env), mounts=mounts, hooks=tuple(hooks))


@dataclass
class _Applied:
    plan: ClaimPlan
    targets: tuple[FractionTarget, ...]
    pipes: dict[str, str] = field(default_factory=dict)
    inodes: dict[str, tuple[int, int]] = field(default_factory=dict)


class MpsEnforcer:
    """Enforces fractions with MPS v3 (and the driver's cgroup limits on ``hard`` GPUs).

    Thread-safe: an internal lock serializes :meth:`apply`, :meth:`release`, :meth:`restore`,
    :meth:`check_health` and the accounting reads.

    Args:
        tiers: GPU UUID -> ``hard`` | ``cooperative`` | ``none`` (from
            :func:`dra_driver.enforcement.detect_enforcement`).
        nvml: NVML facade (compute mode, per-cgroup limits).
        runner: runs ``nvidia-cuda-mps-control``.
        options: paths and defaults.
        sleep: injectable ``time.sleep``.
    """

    def __init__(
        self,
        tiers: Mapping[str, str],
        nvml: NvmlFacade,
        runner: Runner,
        options: MpsOptions | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.options = options or MpsOptions()
        opts = self.options
        if not 1 <= opts.default_active_thread_percentage <= 100:
            raise MpsError("default_active_thread_percentage must be in 1..100")
        self.tiers = dict(tiers)
        self.nvml = nvml
        self._sleep = sleep
        self._lock = threading.RLock()
        self._claims: dict[str, _Applied] = {}
        self._pending: dict[str, ClaimPlan] = {}
        self.daemons: dict[str, MpsDaemon] = {
            mode: MpsDaemon(
                mode,
                opts.mps_root,
                runner,
                opts.control_binary,
                opts.command_timeout,
                sleep=sleep,
            )
            for mode in MODES
        }
        self.janitor = SoftLimitJanitor(
            opts.record_root, nvml, Path(opts.cgroup_root), opts.dmem_backend
        )
        self.daemon_restarts = 0
        """Daemon restarts done by :meth:`check_health` after a crash."""

    # FractionEnforcer -----------------------------------------------------------------
    def apply(self, plan: ClaimPlan) -> Mapping[str, ContainerEdits]:
        """Enforce ``plan`` (idempotent) and return the CDI edits per device key.

        Raises:
            MpsError: invalid plan, a mode conflict on a GPU, or an MPS/NVML failure; the
                claim is then fully rolled back.
        """
        with self._lock:
            ref = plan.claim
            bound = log.bind(claim_uid=ref.uid, namespace=ref.namespace, name=ref.name)
            targets = plan_targets(plan, self.tiers, self.options.default_active_thread_percentage)
            self._check_modes(ref.uid, targets)
            previous = self._claims.pop(ref.uid, None)
            applied = _Applied(plan, targets)
            try:
                for t in targets:
                    if not t.uses_mps:
                        bound.warning(
                            "GPU memory NOT capped: no usable MPS on this GPU (tier none)",
                            gpu=t.gpu.uuid,
                            gpu_index=t.gpu.index,
                        )
                        continue
                    applied.pipes[t.gpu.uuid] = self._ensure(t)
                    applied.inodes[t.gpu.uuid] = _inode(applied.pipes[t.gpu.uuid])
            except _EFFECT_ERRORS as exc:
                bound.error("MPS enforcement failed; claim rolled back", error=str(exc))
                stale = targets + (previous.targets if previous else ())
                self._teardown(stale)
                raise MpsError(f"claim {ref.namespace}/{ref.name}: {exc}") from exc
            self._claims[ref.uid] = applied
            self._pending.pop(ref.uid, None)
            if previous:
                kept = {t.gpu.uuid for t in targets}
                self._teardown(tuple(t for t in previous.targets if t.gpu.uuid not in kept))
            for t in targets:
                self._log_target(bound, t, applied.pipes.get(t.gpu.uuid))
            return {
                key: target_edits(t, applied.pipes.get(t.gpu.uuid), self.options)
                for t in targets
                for key in t.device_keys
            }

    def release(self, claim_uid: str) -> None:
        """Remove the claim's namespaces (clients terminated first), undo its soft-limit
        reservations, and stop servers/daemons nobody needs any more (idempotent).

        Raises:
            MpsError: when a namespace cannot be removed; the claim stays recorded so that a
                retry repeats the release.
        """
        with self._lock:
            ns = namespace_name(claim_uid)
            self._pending.pop(claim_uid, None)
            applied = self._claims.get(claim_uid)
            bound = log.bind(claim_uid=claim_uid, mps_namespace=ns)
            if applied is None:
                self._release_unknown(claim_uid)
                return
            errors = []
            for t in applied.targets:
                if t.uses_mps:
                    try:
                        self._remove_namespace(t)
                    except _EFFECT_ERRORS as exc:
                        errors.append(f"GPU {t.gpu.index}: {exc}")
            if errors:
                bound.error("MPS release failed", errors=errors)
                raise MpsError(f"releasing claim {claim_uid}: " + "; ".join(errors))
            hard = [t for t in applied.targets if t.tier == "hard"]
            self.janitor.release(
                claim_uid,
                [t.gpu.uuid for t in hard],
                max((t.request_bytes for t in hard), default=0),
            )
            del self._claims[claim_uid]
            self._idle(applied.targets)
            bound.info("claim released", gpus=[t.gpu.uuid for t in applied.targets])

    def restore(self, plans: Sequence[ClaimPlan]) -> None:
        """Re-apply every prepared claim after a plugin start: remove MPS namespaces of
        claims not in ``plans``, re-create servers and namespaces, reset compute modes of
        GPUs nobody needs. A claim that fails is logged and retried by :meth:`check_health`.
        """
        with self._lock:
            wanted = {p.claim.uid for p in plans}
            for uid in [u for u in self._claims if u not in wanted]:
                del self._claims[uid]
            self._pending = {u: p for u, p in self._pending.items() if u in wanted}
            self._remove_orphans(wanted)
            for plan in plans:
                try:
                    self.apply(plan)
                except MpsError as exc:
                    self._pending[plan.claim.uid] = plan
                    log.error(
                        "claim not restored; will retry",
                        claim_uid=plan.claim.uid,
                        namespace=plan.claim.namespace,
                        name=plan.claim.name,
                        error=str(exc),
                    )
            self._remove_idle_servers()
            self._reset_compute_modes()
            for mode, daemon in self.daemons.items():
                if not self._mode_targets(mode) and daemon.alive():
                    daemon.stop()
            log.info("MPS state restored", claims=len(self._claims), pending=len(self._pending))

    # supervision ----------------------------------------------------------------------
    def check_health(self) -> dict[str, GpuHealth]:
        """Check every daemon, server and namespace that claims need; repair what is gone.

        A daemon that does not answer is restarted and every claim it served re-applied; a
        missing or failed server is re-created with its namespaces; a missing namespace is
        re-created. Returns the health of each GPU with claims.
        """
        with self._lock:
            for uid, plan in list(self._pending.items()):
                try:
                    self.apply(plan)
                except MpsError as exc:
                    log.warning("pending claim still not restored", claim_uid=uid, error=str(exc))
            health: dict[str, GpuHealth] = {}
            for mode, daemon in self.daemons.items():
                targets = self._mode_targets(mode)
                if not targets:
                    continue
                if not daemon.alive():
                    self.daemon_restarts += 1
                    log.error(
                        "MPS control daemon not answering; restarting and re-applying claims",
                        mode=mode,
                        claims=sorted({t.claim.uid for t in targets}),
                    )
                for t in targets:
                    bound = log.bind(
                        claim_uid=t.claim.uid,
                        namespace=t.claim.namespace,
                        name=t.claim.name,
                        gpu=t.gpu.uuid,
                    )
                    try:
                        pipe = self._ensure(t)
                    except _EFFECT_ERRORS as exc:
                        bound.error("MPS enforcement broken", error=str(exc))
                        health[t.gpu.uuid] = GpuHealth(t.gpu.uuid, False, str(exc))
                        continue
                    self._note_pipe(t, pipe, bound)
                    health.setdefault(t.gpu.uuid, GpuHealth(t.gpu.uuid, True))
            return health

    def supervise(self, stop: threading.Event, interval: float = 10.0) -> None:
        """Run :meth:`check_health` every ``interval`` seconds until ``stop`` is set."""
        while not stop.wait(interval):
            try:
                self.check_health()
            except Exception as exc:  # keep supervising whatever happens
                log.error("MPS health check failed", error=str(exc))

    # accounting -----------------------------------------------------------------------
    def targets(self) -> list[FractionTarget]:
        """Every applied target (all claims, all tiers)."""
        with self._lock:
            return [t for a in self._claims.values() for t in a.targets]

    def clients(self) -> dict[tuple[str, str], list[ClientRow]]:
        """MPS clients per (claim UID, GPU UUID), from ``client list`` of each used server.

        Raises:
            MpsError: when a daemon cannot be asked.
        """
        with self._lock:
            out: dict[tuple[str, str], list[ClientRow]] = {}
            for mode, daemon in self.daemons.items():
                targets = self._mode_targets(mode)
                by_server: dict[str, list[ClientRow]] = {}
                for t in targets:
                    if t.server not in by_server:
                        by_server[t.server] = daemon.control.client_list(t.server)
                    out[(t.claim.uid, t.gpu.uuid)] = [
                        c for c in by_server[t.server] if c.namespace == t.namespace
                    ]
            return out

    # internals ------------------------------------------------------------------------
    def _mode_targets(self, mode: str) -> list[FractionTarget]:
        return [
            t for a in self._claims.values() for t in a.targets if t.uses_mps and t.mode == mode
        ]

    def _check_modes(self, uid: str, targets: Sequence[FractionTarget]) -> None:
        for t in targets:
            for other_uid, other in self._claims.items():
                if other_uid == uid:
                    continue
                for o in other.targets:
                    if o.gpu.uuid == t.gpu.uuid and o.mode != t.mode:
                        raise MpsError(
                            f"claim {t.claim.namespace}/{t.claim.name}: GPU {t.gpu.index} "
                            f"({t.gpu.uuid}) serves {o.mode} claims (e.g. {other_uid}); this "
                            f"claim asks for {t.mode}. One GPU never carries both modes; "
                            "change a GPU's mode only while it has no claims"
                        )

    def _ensure(self, t: FractionTarget) -> str:
        daemon = self.daemons[t.mode]
        daemon.ensure_running()
        self._ensure_server(daemon, t.gpu)
        return self._ensure_namespace(daemon, t)

    def _server_ok(self, row: ServerRow, gpu: Gpu) -> bool:
        status = row.status.lower()
        if any(bad in status for bad in _BAD_STATUS):
            return False
        devices = row.allowed_devices
        return not devices or gpu.uuid in devices or str(gpu.index) in devices

    def _ensure_server(self, daemon: MpsDaemon, gpu: Gpu) -> None:
        name = server_name(gpu.index)
        ctl = daemon.control
        row = next((r for r in ctl.server_list() if r.name == name), None)
        if row is not None and self._server_ok(row, gpu):
            return
        if row is not None:
            log.warning(
                "replacing failed MPS server", mps_server=name, status=row.status, gpu=gpu.uuid
            )
            ctl.server_delete(name, force=True)
        if not self.nvml.has_gpu(gpu.uuid):
            raise MpsError(f"GPU {gpu.index} ({gpu.uuid}) is not present on this node (NVML)")
        self._set_compute_mode(gpu, self.options.compute_mode_for(daemon.mode))
        ctl.server_create(name, [gpu.uuid])
        self._verify_server(daemon, name, gpu)
        log.info(
            "MPS server created",
            mps_server=name,
            gpu=gpu.uuid,
            gpu_index=gpu.index,
            mode=daemon.mode,
        )

    def _verify_server(self, daemon: MpsDaemon, name: str, gpu: Gpu) -> None:
        status = ""
        for attempt in range(max(1, self.options.server_checks)):
            if attempt:
                self._sleep(self.options.server_check_interval)
            row = next((r for r in daemon.control.server_list() if r.name == name), None)
            if row is None or not self._server_ok(row, gpu):
                state = (
                    "vanished" if row is None else f"is {row.status!r} for {row.allowed_devices}"
                )
                if row is not None:
                    with contextlib.suppress(MpsCommandError):
                        daemon.control.server_delete(name, force=True)
                tail = daemon.server_log_tail(name)
                raise MpsError(
                    f"MPS server {name} for GPU {gpu.index} ({gpu.uuid}) {state} after create; "
                    "clients would run without MPS limits"
                    + (f"; server.log: {tail}" if tail else "")
                )
            status = row.status
            if status.lower() == _READY:
                return
        log.warning(
            "MPS server not Ready yet; accepting", mps_server=name, status=status, gpu=gpu.uuid
        )

    def _ensure_namespace(self, daemon: MpsDaemon, t: FractionTarget) -> str:
        ctl = daemon.control
        ns, srv = t.namespace, t.server
        if all(r.name != ns for r in ctl.namespace_list(srv)):
            ctl.namespace_create(ns, srv)
        limit_arg = memory_arg(t.limit_bytes)
        ctl.namespace_set(ns, srv, limit_arg, t.threads)
        rows = [r for r in ctl.namespace_list(srv, ns) if r.name == ns]
        if not rows:
            raise MpsError(f"MPS namespace {ns} missing on server {srv} right after create")
        row = rows[0]
        limit = parse_memory(row.pinned_memory_limit)
        if limit != mib(t.limit_bytes) * MIB:
            raise MpsError(
                f"MPS namespace {ns} on {srv} reports pinned memory limit "
                f"{row.pinned_memory_limit!r}, expected {limit_arg}"
            )
        if row.active_thread_percentage.strip() != str(t.threads):
            raise MpsError(
                f"MPS namespace {ns} on {srv} reports active thread percentage "
                f"{row.active_thread_percentage!r}, expected {t.threads}"
            )
        pipe = Path(row.pipe_directory) if row.pipe_directory else daemon.pipe_dir / srv / ns
        root = daemon.pipe_dir.resolve()
        if not pipe.resolve().is_relative_to(root):
            raise MpsError(f"MPS namespace {ns} pipe directory {pipe} is outside {root}")
        pipe.mkdir(parents=True, exist_ok=True)
        return str(pipe)

    def _remove_namespace(self, t: FractionTarget) -> None:
        daemon = self.daemons[t.mode]
        ctl = daemon.control
        try:
            servers = ctl.server_list()
        except MpsCommandError:
            servers = []  # daemon gone: its namespaces and clients are gone with it
        if any(r.name == t.server for r in servers):
            for client in ctl.client_list(t.server):
                if client.namespace != t.namespace:
                    continue
                try:
                    ctl.client_terminate(client.pid)
                    log.info(
                        "MPS client terminated",
                        claim_uid=t.claim.uid,
                        pid=client.pid,
                        mps_namespace=t.namespace,
                    )
                except MpsCommandError as exc:
                    log.warning("MPS client terminate failed", pid=client.pid, error=str(exc))
            if any(r.name == t.namespace for r in ctl.namespace_list(t.server)):
                ctl.namespace_delete(t.namespace, t.server, force=True)
        shutil.rmtree(daemon.pipe_dir / t.server / t.namespace, ignore_errors=True)

    def _teardown(self, targets: Sequence[FractionTarget]) -> None:
        """Best effort: remove namespaces of ``targets`` and idle what nobody needs."""
        for t in targets:
            if t.uses_mps:
                try:
                    self._remove_namespace(t)
                except _EFFECT_ERRORS as exc:
                    log.warning(
                        "rollback: namespace removal failed", claim_uid=t.claim.uid, error=str(exc)
                    )
        self._idle(targets)

    def _idle(self, targets: Sequence[FractionTarget]) -> None:
        """Delete servers, reset compute modes and stop daemons no claim needs any more."""
        for t in targets:
            if not t.uses_mps:
                continue
            in_use = any(
                o.uses_mps and o.gpu.uuid == t.gpu.uuid
                for a in self._claims.values()
                for o in a.targets
            )
            if not in_use:
                try:
                    self._retire_gpu(t.gpu, t.mode)
                except _EFFECT_ERRORS as exc:
                    log.error("retiring MPS server failed", gpu=t.gpu.uuid, error=str(exc))
        for mode, daemon in self.daemons.items():
            if any(t.mode == mode for t in targets) and not self._mode_targets(mode):
                daemon.stop()

    def _retire_gpu(self, gpu: Gpu, mode: str) -> None:
        daemon = self.daemons[mode]
        ctl = daemon.control
        name = server_name(gpu.index)
        try:
            present = any(r.name == name for r in ctl.server_list())
        except MpsCommandError:
            present = False
        if present:
            try:
                ctl.server_delete(name)
            except MpsCommandError:
                for client in ctl.client_list(name):
                    with contextlib.suppress(MpsCommandError):
                        ctl.client_terminate(client.pid)
                try:
                    ctl.server_delete(name, force=True)
                except MpsCommandError as exc:
                    log.error("MPS server delete failed", mps_server=name, error=str(exc))
        self._restore_compute_mode(gpu.uuid)

    def _marker(self, uuid: str) -> Path:
        return self.options.mps_root / "compute-mode" / uuid

    def _set_compute_mode(self, gpu: Gpu, mode: str) -> None:
        marker = self._marker(gpu.uuid)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(mode + "\n")
        if self.nvml.compute_mode(gpu.uuid) != mode:
            self.nvml.set_compute_mode(gpu.uuid, mode)
            log.info("GPU compute mode set", gpu=gpu.uuid, gpu_index=gpu.index, compute_mode=mode)

    def _restore_compute_mode(self, uuid: str) -> None:
        try:
            if self.nvml.compute_mode(uuid) != "DEFAULT":
                self.nvml.set_compute_mode(uuid, "DEFAULT")
                log.info("GPU compute mode restored", gpu=uuid, compute_mode="DEFAULT")
            self._marker(uuid).unlink(missing_ok=True)
        except NvmlError as exc:
            log.error("cannot restore GPU compute mode; will retry", gpu=uuid, error=str(exc))

    def _reset_compute_modes(self) -> None:
        markers = self.options.mps_root / "compute-mode"
        if not markers.is_dir():
            return
        used = {t.gpu.uuid for t in self.targets() if t.uses_mps}
        for marker in sorted(markers.iterdir()):
            if marker.name not in used:
                self._restore_compute_mode(marker.name)

    def _remove_orphans(self, wanted: set[str]) -> None:
        for daemon in self.daemons.values():
            try:
                servers = daemon.control.server_list()
            except MpsCommandError:
                continue
            for server in servers:
                try:
                    rows = daemon.control.namespace_list(server.name)
                except MpsCommandError:
                    continue
                for row in rows:
                    uid = claim_uid_of(row.name)
                    if uid is None or uid in wanted:
                        continue
                    try:
                        self._delete_orphan(daemon, server.name, row.name, uid)
                    except MpsError as exc:
                        log.error(
                            "orphaned MPS namespace not removed", claim_uid=uid, error=str(exc)
                        )

    def _remove_idle_servers(self) -> None:
        used = {(t.mode, t.server) for t in self.targets() if t.uses_mps}
        for mode, daemon in self.daemons.items():
            try:
                servers = daemon.control.server_list()
            except MpsCommandError:
                continue
            for server in servers:
                if not server.name.startswith("gpu_") or (mode, server.name) in used:
                    continue
                log.info("removing MPS server without claims", mps_server=server.name, mode=mode)
                try:
                    daemon.control.server_delete(server.name, force=True)
                except MpsCommandError as exc:
                    log.warning("MPS server delete failed", mps_server=server.name, error=str(exc))

    def _delete_orphan(self, daemon: MpsDaemon, server: str, ns: str, uid: str) -> None:
        ctl = daemon.control
        for client in ctl.client_list(server):
            if client.namespace == ns:
                try:
                    ctl.client_terminate(client.pid)
                except MpsCommandError as exc:
                    log.warning("MPS client terminate failed", pid=client.pid, error=str(exc))
        ctl.namespace_delete(ns, server, force=True)
        shutil.rmtree(daemon.pipe_dir / server / ns, ignore_errors=True)
        log.info(
            "orphaned MPS namespace removed", claim_uid=uid, mps_namespace=ns, mps_server=server
        )

    def _release_unknown(self, claim_uid: str) -> None:
        ns = namespace_name(claim_uid)
        for daemon in self.daemons.values():
            try:
                servers = daemon.control.server_list()
            except MpsCommandError:
                continue
            for server in servers:
                if any(r.name == ns for r in daemon.control.namespace_list(server.name)):
                    self._delete_orphan(daemon, server.name, ns, claim_uid)
        self.janitor.release(claim_uid, [], 0)

    def _note_pipe(
        self, t: FractionTarget, pipe: str, bound: structlog.typing.FilteringBoundLogger
    ) -> None:
        applied = self._claims.get(t.claim.uid)
        if applied is None:
            return
        before = applied.inodes.get(t.gpu.uuid)
        now = _inode(pipe)
        if before is not None and now != before:
            bound.warning(
                "claim's MPS pipe directory was re-created; running containers still see the "
                "old one and must be restarted to reach MPS",
                pipe_dir=pipe,
            )
        applied.pipes[t.gpu.uuid] = pipe
        applied.inodes[t.gpu.uuid] = now

    def _log_target(
        self, bound: structlog.typing.FilteringBoundLogger, t: FractionTarget, pipe: str | None
    ) -> None:
        fields = {
            "gpu": t.gpu.uuid,
            "gpu_index": t.gpu.index,
            "compute_mode": t.mode,
            "tier": t.tier,
            "request_mib": mib(t.request_bytes),
            "limit_mib": mib(t.limit_bytes),
            "threads": t.threads,
        }
        if t.tier == "cooperative":
            bound.warning(
                "fraction enforced cooperatively: MPS namespace pinned limit only; the driver "
                "does not cap the container's cgroup",
                mps_server=t.server,
                mps_namespace=t.namespace,
                pipe_dir=pipe,
                **fields,
            )
        elif t.tier == "hard":
            bound.info(
                "fraction enforced (hard)",
                mps_server=t.server,
                mps_namespace=t.namespace,
                pipe_dir=pipe,
                **fields,
            )


def _inode(path: str) -> tuple[int, int]:
    try:
        st = Path(path).stat()
    except OSError:
        return (0, 0)
    return (st.st_dev, st.st_ino)
