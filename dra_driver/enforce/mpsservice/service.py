"""The MPS node service: runs the node's MPS control daemons, outside the kubelet plugin's life.

A daemon started by the plugin dies with the plugin's container (a ``helm upgrade``, a crash,
an eviction), and every MPS server it started with it: every tenant process on the node loses
its server. So the daemons belong to a component of their own, ``dra-driver mps-service``, run
as its own DaemonSet whose pods are replaced only when an admin deletes them
(``updateStrategy: OnDelete``). The plugin is its client through the pipe directories and never
starts or kills a daemon (:class:`~dra_driver.enforce.mpsservice.servicedaemon.ServiceDaemon`).

The service:

- probes what the node's ``nvidia-cuda-mps-control`` offers
(:func:`dra_driver.enforce.mps.control.probe_mps`);
- runs one control daemon per compute mode in the foreground (``-p 3 -m -f -a <toml>``, the
  same directories and start-up TOML as :class:`~dra_driver.enforce.mps.daemon.MpsDaemon`, written
  again at every start with the prepared claims' servers and namespaces that the plugin keeps in
  ``<root>/mps/<mode>/claims.toml``, :mod:`dra_driver.enforce.rules.declared`), each a child process
  whose stdin it holds open (EOF makes a foreground daemon quit);
- supervises them: a daemon that exits is started again (back-off 1 s doubling to 30 s) and a
  daemon that stops answering ``server list`` for three checks in a row is killed and started
  again; every start raises the generation;
- publishes its state in the readiness file (:mod:`dra_driver.enforce.mpsservice.readiness`)
  after every change; on SIGTERM it marks itself stopping, closes the daemons' stdin (they quit
  with their servers), kills what is left after 10 s and writes the file without daemons.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import structlog

from dra_driver.enforce.mps.control import probe_mps
from dra_driver.enforce.mps.daemon import MpsDaemon
from dra_driver.enforce.mpsservice.readiness import (
    DaemonState,
    ServiceState,
    process_start_time,
    state_path,
    write_state,
)
from dra_driver.enforce.rules.names import CONTROL_SOCKET, PIPE_DIR_MODE
from dra_driver.infra.atomicfile import owner_only, private_dir
from dra_driver.infra.runner import Runner, SubprocessRunner
from dra_driver.model.vocabulary import COMPUTE_MODES

log = structlog.get_logger(__name__)

FAILED_CHECKS_BEFORE_KILL = 3
"""Consecutive unanswered ``server list`` checks after which a running daemon is replaced."""

MAX_BACKOFF_S = 30.0
STOP_GRACE_S = 10.0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ServiceOptions:
    """Settings of ``dra-driver mps-service``.

    Attributes:
        node: the node's name (recorded in the readiness file).
        root: the enforcer's run directory (``/run/gpu-fraction``); daemons use
            ``<root>/mps/<mode>/{pipe,log}``, the readiness file is ``<root>/mps/service.json``.
        binary: the MPS control program (the emulator on simulated nodes).
        modes: the compute modes that get a daemon (both by default).
        env: extra environment of the daemons (e.g. the emulator's visible GPUs).
        interval: seconds between two supervision rounds.
        start_timeout: seconds a new daemon has to answer ``server list``.
        command_timeout: seconds per control command (checks).
    """

    node: str
    root: Path
    binary: str
    modes: tuple[str, ...] = COMPUTE_MODES
    env: Mapping[str, str] = field(default_factory=dict)
    interval: float = 2.0
    start_timeout: float = 20.0
    command_timeout: float = 10.0

    @property
    def mps_root(self) -> Path:
        return self.root / "mps"


@dataclass
class _Child:
    """A daemon process the service started, and what it knows about it."""

    daemon: MpsDaemon
    proc: subprocess.Popen[bytes] | None = None
    state: DaemonState | None = None
    restarts: int = 0
    failed_checks: int = 0
    next_start: float = 0.0
    backoff: float = 1.0


class MpsService:
    """Runs and supervises the control daemons (see the module); call :meth:`run`.

    Args:
        opts: the settings.
        runner: runs the control program's probes and checks (not the daemons).
        popen: starts a daemon (``subprocess.Popen``; tests pass their own).
        clock: ``time.monotonic``.
    """

    def __init__(
        self,
        opts: ServiceOptions,
        runner: Runner | None = None,
        popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.opts = opts
        self.runner = runner or SubprocessRunner()
        self.popen = popen
        self.clock = clock
        self.generation = 0
        self.protocol = "absent"
        self.started_at = _now()
        self.children = {
            mode: _Child(
                MpsDaemon(mode, opts.mps_root, self.runner, opts.binary, opts.command_timeout)
            )
            for mode in opts.modes
        }
        self._written: dict[str, Any] | None = None

    @property
    def state_file(self) -> Path:
        return state_path(self.opts.mps_root)

    def state(self, stopping: bool = False) -> ServiceState:
        """The service's current state (what the readiness file says)."""
        pid = os.getpid()
        return ServiceState(
            generation=self.generation,
            node=self.opts.node,
            protocol=self.protocol,
            pid=pid,
            start_time=process_start_time(pid) or 0,
            started_at=self.started_at,
            daemons={
                m: c.state for m, c in self.children.items() if c.state is not None and not stopping
            },
            stopping=stopping,
        )

    def publish(self, stopping: bool = False) -> None:
        """Write the readiness file when the state changed."""
        state = self.state(stopping)
        doc = state.to_json()
        if doc != self._written:
            write_state(self.state_file, state)
            self._written = doc
            log.info(
                "MPS service state",
                generation=state.generation,
                protocol=state.protocol,
                daemons={m: d.pid for m, d in state.daemons.items()},
                stopping=stopping,
            )

    def run(self, stop: threading.Event) -> None:
        """Probe MPS, start the daemons, supervise them until ``stop`` is set, then stop them."""
        private_dir(self.opts.mps_root, PIPE_DIR_MODE)
        self.protocol = probe_mps(self.runner, self.opts.binary)
        if self.protocol != "v3":
            log.error(
                "MPS v3 not available: no control daemons run; GPUs are enforced at tier none",
                protocol=self.protocol,
                binary=self.opts.binary,
            )
        self.publish()
        try:
            while not stop.is_set():
                if self.protocol == "v3":
                    for mode in self.children:
                        self._supervise(mode)
                self.publish()
                stop.wait(self.opts.interval)
        finally:
            self.shutdown()

    def _supervise(self, mode: str) -> None:
        child = self.children[mode]
        if child.proc is not None and child.proc.poll() is not None:
            log.error(
                "MPS control daemon exited; starting it again",
                mode=mode,
                pid=child.proc.pid,
                exit_code=child.proc.returncode,
                log_dir=str(child.daemon.log_dir),
            )
            self._lost(child)
        elif child.proc is not None:
            if child.daemon.alive():
                child.failed_checks = 0
                child.backoff = 1.0
            else:
                child.failed_checks += 1
                if child.failed_checks >= FAILED_CHECKS_BEFORE_KILL:
                    log.error(
                        "MPS control daemon does not answer; replacing it",
                        mode=mode,
                        pid=child.proc.pid,
                        checks=child.failed_checks,
                    )
                    self._kill(child.proc)
                    self._lost(child)
        if child.proc is None and self.clock() >= child.next_start:
            self._start(child)

    def _lost(self, child: _Child) -> None:
        child.proc = None
        child.state = None
        child.failed_checks = 0
        child.restarts += 1
        child.next_start = self.clock() + child.backoff
        child.backoff = min(MAX_BACKOFF_S, child.backoff * 2)

    def _start(self, child: _Child) -> None:
        daemon = child.daemon
        daemon.prepare_start()
        env = {**os.environ, **daemon.control.env, **self.opts.env}
        argv = [self.opts.binary, "-p", "3", "-m", "-f", "-a", str(daemon.config_file)]
        try:
            proc = self.popen(argv, env=env, stdin=subprocess.PIPE)
        except OSError as exc:
            log.error("MPS control daemon could not be started", mode=daemon.mode, error=str(exc))
            self._lost(child)
            return
        deadline = self.clock() + self.opts.start_timeout
        while self.clock() < deadline and proc.poll() is None and not daemon.alive():
            time.sleep(0.1)
        if proc.poll() is not None or not daemon.alive():
            log.error(
                "MPS control daemon did not come up",
                mode=daemon.mode,
                exit_code=proc.poll(),
                log_dir=str(daemon.log_dir),
            )
            self._kill(proc)
            child.proc = proc
            self._lost(child)
            return
        owner_only(daemon.pipe_dir / CONTROL_SOCKET)  # root (the plugin) only: no side door
        self.generation += 1
        child.proc = proc
        child.state = DaemonState(
            pid=proc.pid,
            start_time=process_start_time(proc.pid) or 0,
            generation=self.generation,
            restarts=child.restarts,
            started_at=_now(),
            pipe_dir=str(daemon.pipe_dir),
            log_dir=str(daemon.log_dir),
        )
        log.info(
            "MPS control daemon running",
            mode=daemon.mode,
            pid=proc.pid,
            generation=self.generation,
            restarts=child.restarts,
            pipe_dir=str(daemon.pipe_dir),
        )

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        _close(proc.stdin)

    def shutdown(self) -> None:
        """Mark the service stopping, let every daemon quit (stdin EOF), kill what is left
        after :data:`STOP_GRACE_S`, and write the file without daemons."""
        self.publish(stopping=True)
        running = [c.proc for c in self.children.values() if c.proc is not None]
        for proc in running:
            _close(proc.stdin)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for child in self.children.values():
            child.proc, child.state = None, None
        self.publish(stopping=True)
        log.info("MPS service stopped", daemons_stopped=len(running))


def _close(stream: IO[bytes] | None) -> None:
    if stream is not None:
        with contextlib.suppress(OSError):
            stream.close()


def run_service(opts: ServiceOptions, stop: threading.Event | None = None) -> int:
    """``dra-driver mps-service``: run :class:`MpsService` until SIGTERM/SIGINT; returns 0."""
    stop = stop or threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info("signal received; stopping the MPS control daemons", signal=signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    MpsService(opts).run(stop)
    return 0


__all__: Sequence[str] = ["MpsService", "ServiceOptions", "run_service"]
