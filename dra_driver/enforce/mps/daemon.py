"""One MPS v3 control daemon: its directories, its start-up TOML, start, health and stop.

The enforcer runs one daemon per compute mode that has claims on the node (so at most two):

- ``sm-sharing``: ``[features.context-share] enabled = true, default_socket = "off"`` — clients
  of a named server share one GPU context and run concurrently on the SMs (the KAI/NVIDIA
  arrangement; ``docs/enforcement.md``, "Compute modes");
- ``time-slicing``: ``[features.context-share] enabled = false`` — [INFERRED] each client keeps
  its own context, so the GPU time-slices between them while MPS still applies the namespace's
  memory and thread limits. ``hack/gpu-check`` measures whether clients really run
  concurrently.

The TOML is applied once at start-up (NVIDIA MPS docs, "MPS v3 Configuration File"), hence
one daemon per mode rather than one per node. Both have ``memacct`` on (the default). Every
start appends the prepared claims' servers and namespaces, which the enforcer keeps in
``<root>/<mode>/claims.toml`` (:mod:`dra_driver.enforce.rules.declared`), so that a restarted daemon
serves them with their limits from its start.
Directories: ``<root>/<mode>/pipe`` (the ``CUDA_MPS_PIPE_DIRECTORY``; node-local, as it holds
the sockets) and ``<root>/<mode>/log``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from dra_driver.enforce.mps.control import MpsCommandError, MpsControl, MpsTimeout
from dra_driver.enforce.rules.base import MpsError
from dra_driver.enforce.rules.declared import CLAIMS_FILE, DeclaredError, claims_toml, merged_config
from dra_driver.enforce.rules.names import (
    CONTROL_BINARY,
    CONTROL_SOCKET,
    PIPE_DIR_MODE,
    daemon_pipe_dir,
)
from dra_driver.enforce.rules.rows import ServerRow
from dra_driver.enforce.rules.targets import FractionTarget
from dra_driver.infra import budget
from dra_driver.infra.atomicfile import owner_only, private_dir, write_atomic
from dra_driver.infra.runner import Runner
from dra_driver.model.vocabulary import COMPUTE_MODES, ComputeMode

log = structlog.get_logger(__name__)

"""Compute modes, each served by its own daemon."""


def config_toml(mode: str) -> str:
    """The daemon's ``-a`` configuration for ``mode`` (only keys of the Release 615 "MPS v3
    Configuration File" page)."""
    if mode not in COMPUTE_MODES:
        raise MpsError(f"unknown compute mode {mode!r}")
    share = (
        'enabled = true\ndefault_socket = "off"\n'
        if mode == ComputeMode.SM_SHARING
        else "enabled = false\n"
    )
    return (
        'schema_version = "1.0"\n\n'
        "[features.memacct]\nenabled = true\n\n"
        f"[features.context-share]\n{share}"
    )


class MpsDaemon:
    """The control daemon serving one compute mode.

    Args:
        mode: ``time-slicing`` or ``sm-sharing``.
        root: enforcer root; the daemon uses ``<root>/<mode>/{pipe,log,mps.toml}``.
        runner: runs the control program.
        binary: the control program.
        timeout: seconds per control command.
        start_checks: how many times to poll ``server list`` after starting the daemon.
        check_interval: seconds between those polls.
        sleep: injectable ``time.sleep``.
    """

    def __init__(
        self,
        mode: str,
        root: Path,
        runner: Runner,
        binary: str = CONTROL_BINARY,
        timeout: float = 10.0,
        start_checks: int = 20,
        check_interval: float = 0.25,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if mode not in COMPUTE_MODES:
            raise MpsError(f"unknown compute mode {mode!r}")
        self.mode = mode
        self.dir = root / mode
        self.pipe_dir = daemon_pipe_dir(root, mode)
        self.log_dir = self.dir / "log"
        self.config_file = self.dir / "mps.toml"
        self.claims_file = self.dir / CLAIMS_FILE
        self.control = MpsControl(runner, self.pipe_dir, self.log_dir, binary, timeout)
        self.start_checks = start_checks
        self.check_interval = check_interval
        self.sleep = sleep
        self.starts = 0
        """How many times this object started the daemon (first start plus restarts)."""

    def service_problem(self) -> str | None:
        """Why the MPS node service cannot serve this daemon now; None: no service involved
        (this daemon is the plugin's own) or it is ready."""
        return None

    def prepare_start(self) -> None:
        """Before a start: the pipe directory traversable but not listable by others (tenants
        of any UID reach their namespace below it by its path; the names of the servers and
        of other claims' namespaces stay hidden), the log directory and the ``-a`` file
        owner-only, stale files of a crashed daemon removed."""
        private_dir(self.pipe_dir, PIPE_DIR_MODE)
        private_dir(self.log_dir, 0o700)
        self.write_config()
        for stale in (CONTROL_SOCKET, "nvidia-cuda-mps-control.pid"):
            (self.pipe_dir / stale).unlink(missing_ok=True)

    def alive(self) -> bool:
        """Whether the daemon answers ``server list`` (False also when it is hung)."""
        return self._answer() is not None

    def _answer(self) -> list[ServerRow] | None:
        """The daemon's ``server list``; None when it does not answer (hung or not running)."""
        try:
            return self.control.server_list()
        except MpsCommandError:
            return None

    def _rows(self) -> list[ServerRow] | None:
        """The daemon's ``server list``; None when it is not running.

        Raises:
            MpsTimeout: it does not answer in time (hung: its sockets must stay).
        """
        try:
            return self.control.server_list()
        except MpsTimeout:
            raise
        except MpsCommandError:
            return None

    def _running(self) -> bool:
        """Whether the daemon answers ``server list``; False when it is not running.

        Raises:
            MpsTimeout: it does not answer in time (hung: its sockets must stay).
        """
        return self._rows() is not None

    def ensure_answering(self) -> list[ServerRow]:
        """:meth:`ensure_running`, returning the ``server list`` that showed the daemon answers
        (one command when it runs, so that a Prepare does not list the servers twice).

        Raises:
            MpsTimeout: the daemon runs but does not answer in time.
            MpsError: when the daemon does not start or does not answer afterwards.
        """
        rows = self._rows()
        return self._start() if rows is None else rows

    def ensure_running(self) -> bool:
        """Start the daemon unless it answers already; return True when it was (re)started.

        A stale ``control`` socket left by a crashed daemon is removed first
        (``docs/enforcement.md``, "Lifecycle"); a hung daemon is left alone.

        Raises:
            MpsTimeout: the daemon runs but does not answer in time.
            MpsError: when the daemon does not start or does not answer afterwards.
        """
        if self._running():
            return False
        self._start()
        return True

    def _start(self) -> list[ServerRow]:
        """Start the daemon and wait until it answers; return the ``server list`` it answered.

        Raises:
            MpsError: when the daemon does not start or does not answer afterwards.
        """
        self.prepare_start()
        log.info("starting MPS control daemon", mode=self.mode, pipe_dir=str(self.pipe_dir))
        self.control.start_daemon(self.config_file)
        call = budget.current()
        for _ in range(max(1, self.start_checks)):
            rows = self._answer()
            if rows is not None:
                self.starts += 1
                owner_only(self.pipe_dir / CONTROL_SOCKET)
                return rows
            if call is not None and call.spent():
                break
            self.sleep(self.check_interval)
        raise MpsError(
            f"MPS control daemon ({self.mode}) did not answer after starting; "
            f"see {self.log_dir / 'control.log'}"
        )

    def write_claims(self, targets: Sequence[FractionTarget]) -> bool:
        """Write the servers and namespaces of ``targets`` (this mode's MPS targets of every
        claim to enforce) into :attr:`claims_file` atomically, unless it says that already;
        True when written.

        Raises:
            OSError: the file cannot be written.
            MpsError: a limit below 1 MiB.
        """
        text = claims_toml(targets).encode()
        try:
            if self.claims_file.read_bytes() == text:
                return False
        except FileNotFoundError:
            pass
        private_dir(self.dir, PIPE_DIR_MODE)
        write_atomic(self.claims_file, text, 0o600, durable=False)
        return True

    def write_config(self) -> None:
        """Write :attr:`config_file`, the ``-a`` file of a daemon start: :func:`config_toml`
        with the claims' servers and namespaces of :attr:`claims_file` (left out, with an
        error logged, when that file cannot be read or is not a servers part).

        Raises:
            OSError: the file cannot be written.
        """
        base = config_toml(self.mode)
        try:
            text = merged_config(base, self.claims_file.read_text())
        except FileNotFoundError:
            text = base
        except (OSError, UnicodeDecodeError, DeclaredError) as exc:
            log.error(
                "prepared claims not declared to the MPS control daemon: it starts without "
                "their servers and namespaces (the plugin's health check creates them)",
                mode=self.mode,
                claims_file=str(self.claims_file),
                error=str(exc),
            )
            text = base
        write_atomic(self.config_file, text.encode(), 0o600, durable=False)

    def stop(self, only_idle: bool = False) -> None:
        """Quit the daemon (and its servers) and remove its pipe directory; logs are kept.

        A daemon that does not answer in time is left running with its directory (removing
        the sockets of a live daemon would orphan it and its clients). ``only_idle`` (when no
        claim of this process needs the daemon, after its servers were deleted): one that
        still lists servers is left running too: they serve claims this process does not
        hold (the other plugin pod of a rolling update prepared them), and quitting would end
        their clients.
        """
        try:
            rows = self._rows()
        except MpsTimeout as exc:
            log.warning("MPS daemon not answering; not stopped", mode=self.mode, error=str(exc))
            return
        if rows and only_idle:
            log.warning(
                "MPS control daemon kept: it serves servers no claim of this process needs",
                mode=self.mode,
                servers=[r.name for r in rows],
            )
            return
        if rows is not None:
            log.info("stopping MPS control daemon", mode=self.mode)
            try:
                self.control.quit()
            except MpsTimeout as exc:
                log.warning("MPS daemon not answering; not stopped", mode=self.mode, error=str(exc))
                return
            except MpsCommandError as exc:
                log.warning("MPS daemon quit failed", mode=self.mode, error=str(exc))
        shutil.rmtree(self.pipe_dir, ignore_errors=True)
        self.config_file.unlink(missing_ok=True)

    def server_log_tail(self, server: str, lines: int = 5) -> str:
        """The last lines of ``<log>/<server>/server.log`` ("" when absent)."""
        path = self.log_dir / server / "server.log"
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text.strip().splitlines()[-lines:])
