"""MPS objects on the node: control daemons, servers and namespaces. Ensuring them (servers
created and verified for their GPUs, namespaces with their limits, drifted limits re-set);
removing them is :mod:`dra_driver.enforce.mps.removal`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import structlog

from dra_driver.enforce.mps.computemode import ComputeModes
from dra_driver.enforce.mps.control import MpsCommandError, MpsControl, MpsTimeout
from dra_driver.enforce.mps.daemon import MpsDaemon
from dra_driver.enforce.mps.nvmlcontrol import NvmlError, NvmlFacade
from dra_driver.enforce.mps.removal import terminate_clients
from dra_driver.enforce.rules.base import MpsError
from dra_driver.enforce.rules.edits import namespace_pipe_dir
from dra_driver.enforce.rules.names import (
    CONTROL_SOCKET,
    DEFAULT_NAMESPACE,
    DEFAULT_NAMESPACE_LIMIT,
    DEFAULT_NAMESPACE_THREADS,
    PIPE_DIR_MODE,
    memory_arg,
)
from dra_driver.enforce.rules.outages import server_pid
from dra_driver.enforce.rules.rows import NamespaceRow, ServerRow
from dra_driver.enforce.rules.targets import FractionTarget, MpsOptions, gpus_text, namespace_drift
from dra_driver.gpus import Gpu
from dra_driver.infra.atomicfile import ensure_dir, owner_only, private_dir

log = structlog.get_logger(__name__)

EFFECT_ERRORS = (MpsError, NvmlError, OSError)
"""What :meth:`MpsObjects.ensure` and the removals may raise: an MPS command, NVML, the disk."""

EARLY_CLIENT_TRIES = 3
"""Attempts to set a new namespace's limits when clients attached before them."""

_BAD_STATUS = ("fail", "error", "exit", "fault", "dead", "terminat", "stop")
_READY = "ready"
RECENT_S = 30.0
"""Seconds a server this process saw Ready is trusted to run without listing it again: a new
claim's namespace is then created at once, and a refused create falls back to the full check."""


class MpsObjects:
    """Creates, checks and removes the MPS daemons, servers and namespaces claims use.

    Not locked: its owner, the enforcer, serializes every call.

    Args:
        daemons: the control daemon of each compute mode (``time-slicing``, ``sm-sharing``).
        options: paths and defaults.
        nvml: tells whether a GPU is present.
        modes: sets a GPU's compute mode before a server is created on it.
        sleep: injectable ``time.sleep``, between server checks.
    """

    def __init__(
        self,
        daemons: Mapping[str, MpsDaemon],
        options: MpsOptions,
        nvml: NvmlFacade,
        modes: ComputeModes,
        sleep: Callable[[float], None],
    ) -> None:
        self.daemons = daemons
        self.options = options
        self.nvml = nvml
        self.modes = modes
        self.sleep = sleep
        self._pids: dict[tuple[str, str], int | None] = {}
        self._seen: dict[tuple[str, str], float] = {}
        self._joined: set[tuple[str, str]] = set()
        self.clock: Callable[[], float] = time.monotonic
        self.created: set[tuple[str, str, str]] = set()
        """``(mode, server, namespace)`` of each namespace created, ``(mode, server, "")`` of
        each server :meth:`ensure_server` created (its owner clears it when it wants to know
        which a call created)."""

    def server_pid(self, mode: str, name: str) -> int | None:
        """The PID of server ``name`` of ``mode``'s daemon when :meth:`ensure_server` last saw
        it (None: not seen, ``server list`` shows no PID, or a namespace was created on it
        without listing since: another may have replaced the server in between, and a PID
        recorded then would report an outage that did not happen)."""
        if (mode, name) in self._joined:
            return None
        return self._pids.get((mode, name))

    def servers(self) -> Iterator[tuple[str, MpsDaemon, ServerRow]]:
        """``(mode, daemon, server row)`` of every server of every daemon that answers
        ``server list`` (a daemon that does not is skipped)."""
        for mode, daemon in self.daemons.items():
            try:
                rows = daemon.control.server_list()
            except MpsCommandError:
                continue
            for row in rows:
                yield mode, daemon, row

    def ensure(self, t: FractionTarget, fresh: bool = False) -> str:
        """Make ``t``'s daemon run, its server exist and its namespace exist with its limits;
        return the namespace's pipe directory.

        ``fresh`` (a kubelet's Prepare of a claim new to this process): when this process saw
        ``t``'s server Ready less than :data:`RECENT_S` seconds ago, the namespace is created
        at once (``namespace create``, ``set``, the read-back: 3 commands, no ``server list``
        or ``namespace list``); a refused create (the server gone, the namespace there) takes
        the full path below.

        Raises:
            MpsError: a command failed or a check after it did (see :meth:`ensure_server`,
                :meth:`ensure_namespace`).
            NvmlError: the GPU's compute mode cannot be set.
            OSError: a marker or pipe directory cannot be written.
        """
        daemon = self.daemons[t.mode]
        if fresh and self.clock() - self._seen.get((t.mode, t.server), -RECENT_S) < RECENT_S:
            pipe = self._join(daemon, t)
            if pipe is not None:
                return pipe
        rows = daemon.ensure_answering()
        self.ensure_server(daemon, t.server, t.server_gpus, rows)
        return self.ensure_namespace(daemon, t)

    def _join(self, daemon: MpsDaemon, t: FractionTarget) -> str | None:
        """Create ``t``'s namespace on its server without listing first; None when the create
        is refused (the server is not seen as running any more).

        Raises:
            MpsTimeout: the daemon does not answer.
            MpsError: as :meth:`first_limits`.
        """
        try:
            daemon.control.namespace_create(t.namespace, t.server)
        except MpsTimeout:
            raise
        except MpsCommandError:
            self._seen.pop((t.mode, t.server), None)
            return None
        self.created.add((daemon.mode, t.server, t.namespace))
        self._joined.add((t.mode, t.server))
        return self._pipe(daemon, t, self.first_limits(daemon.control, t, blind=True))

    def ensure_server(
        self,
        daemon: MpsDaemon,
        name: str,
        gpus: Sequence[Gpu],
        rows: Sequence[ServerRow] | None = None,
    ) -> None:
        """Make server ``name`` exist for ``gpus`` (compute mode set first) and verified; a
        failed one, or one for other GPUs, is deleted and re-created. ``rows``: the daemon's
        ``server list`` read just before (None: listed here).

        Raises:
            MpsError: a command failed, a GPU is not present (NVML), or the new server failed
                its checks (:meth:`verify_server`).
        """
        ctl = daemon.control
        row = _row(ctl, name) if rows is None else next((r for r in rows if r.name == name), None)
        self._joined.discard((daemon.mode, name))
        if row is not None and server_ok(row, gpus):
            self._pids[(daemon.mode, name)] = server_pid(row.pid)
            seal_server(daemon, name)  # one declared in the -a file has the default modes
            if row.status.lower() == _READY:
                self._seen[(daemon.mode, name)] = self.clock()
            return
        if row is not None:
            log.warning(
                "replacing failed MPS server",
                mps_server=name,
                status=row.status,
                allowed_devices=list(row.allowed_devices),
                gpus=[g.uuid for g in gpus],
            )
            with contextlib.suppress(MpsCommandError):
                terminate_clients(ctl, name)
            ctl.server_delete(name, force=True)
        for gpu in gpus:
            if not self.nvml.has_gpu(gpu.uuid):
                raise MpsError(f"GPU {gpu.index} ({gpu.uuid}) is not present on this node (NVML)")
        for gpu in gpus:
            self.modes.set(gpu, self.options.compute_mode_for(daemon.mode))
        ctl.server_create(name, [g.uuid for g in gpus])
        self.created.add((daemon.mode, name, ""))
        self.verify_server(daemon, name, gpus)
        ctl.server_set(name, DEFAULT_NAMESPACE_LIMIT, DEFAULT_NAMESPACE_THREADS)
        seal_server(daemon, name)
        log.info(
            "MPS server created",
            mps_server=name,
            gpus=[g.uuid for g in gpus],
            gpu_indexes=[g.index for g in gpus],
            mode=daemon.mode,
        )

    def verify_server(self, daemon: MpsDaemon, name: str, gpus: Sequence[Gpu]) -> None:
        """Check the new server ``options.server_checks`` times, ``server_check_interval``
        seconds apart, until it is Ready; still not Ready: accepted with a warning.

        Raises:
            MpsError: the server vanished or failed (then deleted); the message has the tail of
                its ``server.log``.
        """
        status = ""
        for attempt in range(max(1, self.options.server_checks)):
            if attempt:
                self.sleep(self.options.server_check_interval)
            row = _row(daemon.control, name)
            if row is None or not server_ok(row, gpus):
                state = (
                    "vanished" if row is None else f"is {row.status!r} for {row.allowed_devices}"
                )
                if row is not None:
                    with contextlib.suppress(MpsCommandError):
                        daemon.control.server_delete(name, force=True)
                tail = daemon.server_log_tail(name)
                raise MpsError(
                    f"MPS server {name} for {gpus_text(gpus)} {state} after create; "
                    "clients would run without MPS limits"
                    + (f"; server.log: {tail}" if tail else "")
                )
            status = row.status
            self._pids[(daemon.mode, name)] = server_pid(row.pid)
            if status.lower() == _READY:
                self._seen[(daemon.mode, name)] = self.clock()
                return
        log.warning(
            "MPS server not Ready yet; accepting",
            mps_server=name,
            status=status,
            gpus=[g.uuid for g in gpus],
        )

    def ensure_namespace(self, daemon: MpsDaemon, t: FractionTarget) -> str:
        """Make ``t``'s namespace exist with its limits; return its pipe directory.

        Read-only when the namespace is there with the right limits: ``namespace set`` runs
        only on a namespace just created or one whose limits drifted, and never while clients
        are attached (on r615 drivers it then fails; ``docs/enforcement.md``, "Lifecycle").

        Raises:
            MpsError: a command failed, the limits read back wrong, or they drifted while
                clients are attached (the GPU is then reported unhealthy).
        """
        ctl = daemon.control
        ns, srv = t.namespace, t.server
        row = next((r for r in ctl.namespace_list(srv) if r.name == ns), None)
        if row is None:
            ctl.namespace_create(ns, srv)
            self.created.add((daemon.mode, srv, ns))
            row = self.first_limits(ctl, t)
        elif not row.has_memory_limit:
            # never given its limits (made by a call that failed before them): its clients
            # run uncapped and are terminated as early ones are, whoever they are
            row = self.first_limits(ctl, t)
        else:
            drift = namespace_drift(row, t)
            if drift:
                row = self.repair_limits(ctl, t, drift)
        return self._pipe(daemon, t, row)

    def _pipe(self, daemon: MpsDaemon, t: FractionTarget, row: NamespaceRow) -> str:
        """The namespace's pipe directory (from its row), checked to be under the daemon's
        and made.

        Raises:
            MpsError: it is outside the daemon's pipe directory.
        """
        ns = t.namespace
        pipe = Path(row.pipe_directory or namespace_pipe_dir(t, self.options))
        root = daemon.pipe_dir.resolve()
        if not pipe.resolve().is_relative_to(root):
            raise MpsError(f"MPS namespace {ns} pipe directory {pipe} is outside {root}")
        ensure_dir(pipe, 0o755)
        return str(pipe)

    def first_limits(self, ctl: MpsControl, t: FractionTarget, blind: bool = False) -> NamespaceRow:
        """:meth:`set_limits` of a namespace just created. Until then it has no limits, and a
        tenant that keeps retrying (its pod restarted, or after a repair) can attach in that
        moment; ``namespace set`` then fails. Such clients are terminated, so that no process
        runs without the claim's limits (they may attach again, under the limits), and the
        limits set; up to :data:`EARLY_CLIENT_TRIES` times.

        ``blind``: created without listing first. Should MPS accept creating a namespace that
        exists (not seen with the emulator; not verified on hardware), its clients are those
        of a running pod, not early ones. Only a namespace without a memory limit (one just
        made) has its clients terminated; one that has limits is taken as it is when they
        are the claim's, else refused as a drift with clients attached (:meth:`repair_limits`),
        and nothing is terminated.

        Raises:
            MpsError: as :meth:`set_limits`, also when clients keep attaching.
        """
        ns, srv = t.namespace, t.server
        for _ in range(EARLY_CLIENT_TRIES - 1):
            try:
                return self.set_limits(ctl, t)
            except MpsCommandError:
                early = [c.pid for c in ctl.client_list(srv) if c.namespace == ns]
                if not early:
                    raise
                if blind:
                    row = next((r for r in ctl.namespace_list(srv, ns) if r.name == ns), None)
                    if row is not None and row.has_memory_limit:  # not made just now
                        self.created.discard((t.mode, srv, ns))  # a rollback keeps it
                        drift = namespace_drift(row, t)
                        return self.repair_limits(ctl, t, drift) if drift else row
                log.warning(
                    "clients attached to a new MPS namespace before its limits were set; "
                    "terminating them so that no process runs without the claim's limits",
                    **t.log_fields,
                    mps_server=srv,
                    mps_namespace=ns,
                    pids=early,
                )
                terminate_clients(ctl, srv, ns)
        return self.set_limits(ctl, t)

    def set_limits(self, ctl: MpsControl, t: FractionTarget) -> NamespaceRow:
        """``namespace set`` both limits, read them back and check them."""
        ns, srv = t.namespace, t.server
        ctl.namespace_set(ns, srv, memory_arg(t.limit_bytes), t.threads)
        row = next((r for r in ctl.namespace_list(srv, ns) if r.name == ns), None)
        if row is None:
            raise MpsError(f"MPS namespace {ns} missing on server {srv} right after create")
        drift = namespace_drift(row, t)
        if drift:
            raise MpsError(f"MPS namespace {ns} on {srv} reports {'; '.join(drift)}")
        return row

    def repair_limits(self, ctl: MpsControl, t: FractionTarget, drift: list[str]) -> NamespaceRow:
        """Re-set a namespace whose limits drifted, unless clients are attached."""
        ns, srv = t.namespace, t.server
        clients = [c for c in ctl.client_list(srv) if c.namespace == ns]
        if clients:
            raise MpsError(
                f"MPS namespace {ns} on {srv} has {'; '.join(drift)}, and {len(clients)} "
                f"client(s) attached (PIDs {', '.join(str(c.pid) for c in clients)}): not "
                "re-set, as namespace set fails while clients are attached; restart the "
                "claim's pods to have the limits applied"
            )
        log.warning(
            "MPS namespace limits drifted; re-setting them",
            **t.log_fields,
            mps_server=srv,
            mps_namespace=ns,
            drift=drift,
        )
        return self.set_limits(ctl, t)


def seal_server(daemon: MpsDaemon, name: str) -> None:
    """Close the side doors of server ``name``'s files: its directory traversable but not
    listable, its own sockets (``control``, the ``default`` namespace's) root-only; clients
    attach through their namespace's socket below it, ``<server>/<namespace>/control`` (NVIDIA
    MPS docs, "MPS v3 Namespaces"). Its ``default`` namespace, which no claim uses, gets the
    smallest limits where the server is made (:data:`DEFAULT_NAMESPACE_LIMIT`: after ``server
    create``, and in the declared servers of the ``-a`` file,
    :mod:`dra_driver.enforce.rules.declared`),
    so a process that reaches it holds nothing worth having (KAI caps it at 10% for the same
    reason).

    Raises:
        OSError: the directory's or a socket's mode cannot be set.
    """
    where = daemon.pipe_dir / name
    if where.is_dir():
        private_dir(where, PIPE_DIR_MODE)
    for socket in (where / CONTROL_SOCKET, where / DEFAULT_NAMESPACE / CONTROL_SOCKET):
        owner_only(socket)


def server_ok(row: ServerRow, gpus: Sequence[Gpu]) -> bool:
    """Whether server ``row`` is usable for ``gpus``: no failure in its status, and its allowed
    devices (when listed) are those GPUs (by UUID or index)."""
    status = row.status.lower()
    if any(bad in status for bad in _BAD_STATUS):
        return False
    devices = row.allowed_devices
    if not devices:
        return True
    if len(gpus) > 1 and len(devices) != len(gpus):
        return False  # a claim's server made for another set of GPUs
    return all(g.uuid in devices or str(g.index) in devices for g in gpus)


def _row(ctl: MpsControl, name: str) -> ServerRow | None:
    """Server ``name``'s row of ``server list``, or None.

    Raises:
        MpsCommandError: the daemon did not answer (:class:`MpsTimeout`: it is hung).
    """
    return next((r for r in ctl.server_list() if r.name == name), None)
