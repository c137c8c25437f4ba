"""The real :class:`~dra_driver.enforce.rules.base.FractionEnforcer`: MPS v3 namespaces plus, on
``hard`` GPUs, the driver's per-container memory limits. Design and sources: ``docs/enforcement.md``
(its "Sources" section lists the upstream documents). The pure decisions (targets, edits,
validation) live in :mod:`dra_driver.enforce.rules.targets`, shared with the simulated
:class:`RecordingEnforcer`.

Layout on the node (host paths; the plugin sees them at the same paths):

- ``<root>/mps/<mode>/pipe``: pipe directory of the control daemon serving ``mode``
  (``time-slicing`` or ``sm-sharing``, see :mod:`dra_driver.enforce.mps.daemon`), started lazily;
- per GPU one shared server ``gpu_<index>`` with ``--allowed-devices=<UUID>``, created in the
  daemon of the GPU's mode after the GPU's compute mode is set (EXCLUSIVE_PROCESS by default);
- per single-GPU claim one namespace ``c_<uid>`` on that server, ALWAYS with both a pinned
  memory limit (the claim's limit, whole MiB) and an active thread percentage (time-slicing:
  100; sm-sharing: the claim's value or ``default_active_thread_percentage``), because named
  namespaces inherit nothing from the server (``docs/enforcement.md``, "Layout and commands");
- per multi-GPU claim its own server ``m_<uid>`` with ``--allowed-devices=<UUID>,<UUID>...``
  (all its GPUs, one mode) and one namespace ``claim`` on it (same limits rule; the limit
  applies to each GPU, ``docs/enforcement.md``, "Multi-device claims"); deleted with the
  claim (clients terminated first);
- the claim's container gets only its namespace's pipe directory, bind-mounted at
  ``/tmp/nvidia-mps``, and ``CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps``;
- ``hard`` GPUs add the toolkit's ``createRuntime`` memory-limit hook (one per device, for the
  device's GPU) with ``NVIDIA_GPU_MEMORY_REQUEST``/``_LIMIT``; the consumer gate records the
  container's cgroup;
- ``<root>/mps/compute-mode/<uuid>``: marker of a GPU whose compute mode we changed (so a
  restarted plugin puts it back to DEFAULT when no claim needs it);
- ``<root>/cgroups/<claim-uid>/``: the cgroup records the consumer gate writes
  (:mod:`.janitor`).

:class:`MpsEnforcer` is the locked facade over its parts: :mod:`.ledger` (the claims' records),
:mod:`.objects` and :mod:`.removal` (daemons, servers, namespaces), :mod:`.computemode`,
:mod:`.lifecycle` (apply and release one claim), :mod:`.restore` (after a plugin start),
:mod:`.health` (check and repair) and :mod:`.clientguard` (each claim's clients within its cap).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import structlog

from dra_driver.enforce.clientguard import ClientGuard, ClientsTerminated
from dra_driver.enforce.healthcheck import HealthRepair
from dra_driver.enforce.janitor import SoftLimitJanitor
from dra_driver.enforce.ledger import Applied, Ledger
from dra_driver.enforce.lifecycle import ClaimLifecycle
from dra_driver.enforce.mps.computemode import ComputeModes
from dra_driver.enforce.mps.daemon import MpsDaemon
from dra_driver.enforce.mps.nvmlcontrol import NvmlFacade
from dra_driver.enforce.mps.objects import MpsObjects
from dra_driver.enforce.mpsservice.servicedaemon import ServiceDaemon
from dra_driver.enforce.restore import restore_claims
from dra_driver.enforce.rules.base import ClientTermination, GpuHealth, MpsError
from dra_driver.enforce.rules.edits import CONTAINER_PIPE_DIR, target_edits
from dra_driver.enforce.rules.outages import OutageListener
from dra_driver.enforce.rules.rows import ClientRow
from dra_driver.enforce.rules.targets import (
    DEFAULT_ROOT,
    FractionTarget,
    MpsOptions,
    targets_for_claim,
)
from dra_driver.infra import budget
from dra_driver.infra.runner import Runner
from dra_driver.model.cdi import ContainerEdits
from dra_driver.model.plans import ClaimPlan
from dra_driver.model.vocabulary import COMPUTE_MODES

log = structlog.get_logger(__name__)

__all__ = [
    "CONTAINER_PIPE_DIR",
    "DEFAULT_ROOT",
    "FractionTarget",
    "GpuHealth",
    "MpsEnforcer",
    "MpsOptions",
    "targets_for_claim",
    "target_edits",
]


class MpsEnforcer:
    """Enforces fractions with MPS v3 (and the driver's cgroup limits on ``hard`` GPUs).

    Thread-safe: an internal lock serializes :meth:`apply`, :meth:`release`, :meth:`restore`,
    :meth:`check_health` and the accounting reads.

    Args:
        tiers: GPU UUID -> ``hard`` | ``cooperative`` | ``none`` (from
            :func:`dra_driver.enforce.tiers.detect_enforcement`).
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
        self._lock = threading.RLock()
        self._ledger = Ledger(self.tiers, opts.default_active_thread_percentage)
        daemon = ServiceDaemon if opts.service else MpsDaemon
        self.daemons: dict[str, MpsDaemon] = {
            mode: daemon(
                mode,
                opts.mps_root,
                runner,
                opts.control_binary,
                opts.command_timeout,
                sleep=sleep,
            )
            for mode in COMPUTE_MODES
        }
        self.janitor = SoftLimitJanitor(
            opts.record_root, nvml, Path(opts.cgroup_root), opts.dmem_backend
        )
        self._modes = ComputeModes(opts.mps_root, nvml)
        self._objects = MpsObjects(self.daemons, opts, nvml, self._modes, sleep)
        self._life = ClaimLifecycle(
            self.tiers, opts, self._ledger, self._objects, self._modes, self.janitor
        )
        self._health = HealthRepair(self._life)
        self._guard = ClientGuard(self.daemons)

    # FractionEnforcer -----------------------------------------------------------------
    def apply(self, plan: ClaimPlan) -> Mapping[str, ContainerEdits]:
        """Enforce ``plan`` (idempotent) and return the CDI edits per device key.

        Raises:
            MpsError: invalid plan, a mode conflict on a GPU, or an MPS/NVML failure; the
                claim is then fully rolled back.
        """
        with self._held():
            try:
                return self._life.apply(plan, fresh=True)
            finally:
                self._declare()

    def enforced(self, plan: ClaimPlan) -> bool:
        """Whether ``plan`` is applied (not pending a retry) and its namespaces' pipe
        directories exist; no MPS command (:meth:`check_health` checks MPS itself)."""
        with self._lock:
            applied = self._ledger.claims.get(plan.claim.uid)
            return (
                applied is not None
                and plan.claim.uid not in self._ledger.pending
                and applied.plan == plan
                and all(Path(p).is_dir() for p in applied.pipes.values())
            )

    def release(self, claim_uid: str) -> None:
        """Remove the claim's namespaces (clients terminated first) and its own server if it
        has one, undo its soft-limit reservations, and stop servers/daemons nobody needs any
        more (idempotent).

        Raises:
            MpsError: when a namespace or the claim's own server cannot be removed; the claim
                stays recorded so that a retry repeats the release.
        """
        with self._held():
            try:
                self._life.release(claim_uid)
            finally:
                self._declare()

    def restore(self, plans: Sequence[ClaimPlan]) -> None:
        """Re-apply every prepared claim after a plugin start: remove MPS namespaces (and
        claim servers) of claims not in ``plans``, re-create servers and namespaces, reset
        compute modes of GPUs nobody needs. A claim that fails is logged and retried by
        :meth:`check_health`.
        """
        with self._lock:
            restore_claims(self._life, plans)
            self._declare()

    # supervision ----------------------------------------------------------------------
    def check_health(self) -> dict[str, GpuHealth]:
        """Check every daemon, server and namespace that claims need; repair what is gone.

        A daemon that does not answer is restarted and every claim it served re-applied; a
        missing or failed server (shared or a claim's own) is re-created with its namespaces;
        a missing namespace re-created. Claims whose server was replaced (another PID) or whose
        namespace directory was, are reported to the :meth:`report_outages` listener. Returns
        the health of each GPU with claims.
        """
        with self._lock:
            health = self._health.check()
            self._declare()
            return health

    def report_outages(self, listener: OutageListener) -> None:
        """Have every :meth:`check_health` that finds claims cut off their MPS server or
        namespace call ``listener`` with them (:mod:`dra_driver.enforce.rules.outages`); it runs
        with the enforcer's lock held and must return at once."""
        with self._lock:
            self._health.on_outages = listener

    def report_terminations(self, listener: ClientsTerminated) -> None:
        """Have :meth:`check_clients` call ``listener`` for each claim namespace whose clients
        beyond its cap it terminated, as ``(claim, gpu_uuid, pids, cap)``, outside the lock;
        its exceptions are logged."""
        self._guard.on_terminated = listener

    def check_clients(self) -> list[ClientTermination]:
        """Terminate each claim's MPS clients beyond its cap (newest first; the cap is the
        claim's share of the server's client table, :mod:`dra_driver.enforce.rules.clientcap`).

        One ``client list`` per control daemon with claims, then ``client terminate`` per
        excess client. The enforcer's lock is held only to read the applied claims, never
        while a command runs, so Prepare does not wait for a check. Never terminates a client
        of the ``default`` namespace, of another claim, or one also attached elsewhere.

        Returns:
            What was terminated, one entry per claim namespace.
        """
        with self._lock:
            targets = {mode: self._ledger.mode_targets(mode) for mode in self.daemons}
        return self._guard.check(targets)

    @property
    def daemon_restarts(self) -> int:
        """Control daemons :meth:`check_health` found not answering (and restarted) so far."""
        return self._health.daemon_restarts

    # accounting -----------------------------------------------------------------------
    def targets(self) -> list[FractionTarget]:
        """Every applied target (all claims, all tiers)."""
        with self._lock:
            return self._ledger.targets()

    def clients(self) -> dict[tuple[str, str], list[ClientRow]]:
        """MPS clients per (claim UID, GPU UUID), from ``client list`` of each used server.

        A multi-GPU claim's clients are listed under each of its GPUs.

        Raises:
            MpsError: when a daemon cannot be asked.
        """
        with self._lock:
            out: dict[tuple[str, str], list[ClientRow]] = {}
            for mode, daemon in self.daemons.items():
                targets = self._ledger.mode_targets(mode)
                by_server: dict[str, list[ClientRow]] = {}
                for t in targets:
                    if t.server not in by_server:
                        by_server[t.server] = daemon.control.client_list(t.server)
                    out[(t.claim.uid, t.gpu.uuid)] = [
                        c for c in by_server[t.server] if c.namespace == t.namespace
                    ]
            return out

    @property
    def _claims(self) -> dict[str, Applied]:
        """Applied claims by UID (the ledger's; tests read it)."""
        return self._ledger.claims

    @property
    def _pending(self) -> dict[str, ClaimPlan]:
        """Claims waiting for a retry by UID (the ledger's; tests read it)."""
        return self._ledger.pending

    # internals ------------------------------------------------------------------------
    def _declare(self) -> None:
        """Write each daemon's claims file: the servers and namespaces of every claim to
        enforce (applied or pending), which the next start of the daemon creates with their
        limits (:mod:`dra_driver.enforce.rules.declared`). A failure is logged: the claims stay
        enforced, only a restarted daemon would wait for the health check again."""
        wanted = self._ledger.wanted_targets()
        for mode, daemon in self.daemons.items():
            try:
                daemon.write_claims([t for t in wanted if t.mode == mode])
            except (OSError, MpsError) as exc:
                log.warning(
                    "MPS claims file not written; a restarted daemon starts without the "
                    "claims' namespaces until the health check creates them",
                    mode=mode,
                    claims_file=str(daemon.claims_file),
                    error=str(exc),
                )

    @contextlib.contextmanager
    def _held(self) -> Iterator[None]:
        """The enforcer's lock, waited for at most what is left of the running call's budget.

        Raises:
            MpsError: not obtained in time (a health check or a scrape held it throughout).
        """
        call = budget.current()
        if call is None:
            self._lock.acquire()
        elif not self._lock.acquire(timeout=call.remaining()):
            raise MpsError(
                "the MPS enforcer stayed busy (health check or metrics) for the whole "
                f"{call.text()} budget of this call; the kubelet retries"
            )
        try:
            yield
        finally:
            self._lock.release()
