"""The emulated MPS control daemon process: the state machine behind ``<pipe>/control``.

One :class:`ControlDaemon` serves one pipe directory. Requests (:mod:`dra_driver.mpsemu.wire`)
are handled on their own threads (at most :data:`MAX_HANDLERS` at once), one at a time against
the state under a lock; each read waits at most :data:`REQUEST_TIMEOUT_S`. A malformed request
gets an error answer; a client that goes away mid-request is dropped. ``-q``, SIGTERM, or
(``-f``) EOF on stdin stop the servers, remove ``control`` and the PID file and end the
process. A SIGKILL leaves them (stale) and ends the servers through their stdin.

Environment: :data:`VISIBLE_GPUS_ENV` (comma-separated GPU UUIDs the servers can open; unset:
all) and the ``CUDA_MPS_*`` variables of :mod:`dra_driver.mpsemu.grammar`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from dra_driver.model.commands import Completed
from dra_driver.mpsemu.grammar import Invocation
from dra_driver.mpsemu.model import WorldError
from dra_driver.mpsemu.proc import set_process_name
from dra_driver.mpsemu.processes import ProcessWorld
from dra_driver.mpsemu.state import MpsState
from dra_driver.mpsemu.wire import (
    MAX_REQUEST,
    Request,
    WireError,
    decode_request,
    encode_reply,
    read_line,
)

VISIBLE_GPUS_ENV = "MPS_EMULATOR_VISIBLE_GPUS"
"""Comma-separated UUIDs of the GPUs the emulated servers can open; unset: every UUID; empty:
none."""
MAX_HANDLERS = 16
"""Requests handled at once; more are answered "busy"."""
REQUEST_TIMEOUT_S = 5.0
"""Seconds a client has to send its request line."""
POLL_S = 0.25
"""Seconds between checks for a stop while waiting for connections."""


def visible_gpus(env: Mapping[str, str]) -> set[str] | None:
    """The UUIDs :data:`VISIBLE_GPUS_ENV` names (None when it is unset)."""
    raw = env.get(VISIBLE_GPUS_ENV)
    if raw is None:
        return None
    return {u.strip() for u in raw.split(",") if u.strip()}


class ControlDaemon:
    """The daemon of ``inv.pipe``.

    Args:
        inv: the ``-d``/``-f`` invocation that starts it.
        env: environment (for :data:`VISIBLE_GPUS_ENV`).
    """

    def __init__(self, inv: Invocation, env: Mapping[str, str]) -> None:
        self.inv = inv
        self.log_file = Path(inv.log) / "control.log"
        self.world = ProcessWorld(self.say)
        self.state = MpsState(self.world, visible_gpus(env), vanish_after_lists=None)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.term = threading.Event()
        self.slots = threading.BoundedSemaphore(MAX_HANDLERS)
        self.threads: set[threading.Thread] = set()

    def say(self, text: str) -> None:
        """Append one time-stamped line to ``<log>/control.log`` (dropped if it cannot)."""
        try:
            with self.log_file.open("a") as log:
                log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {text}\n")
        except OSError:
            return

    def start(self) -> Completed:
        """Start the daemon (socket, PID file); the answer ``-d`` reports."""
        with self.lock:
            done = self.state.start(self.inv)
        if not done.ok:
            self.say(f"start refused: {done.stderr}")
        return done

    def handle(self, request: Request) -> Completed:
        """Answer one request against the state."""
        with self.lock:
            if request.quit:
                done = self.state.quit(self.inv.pipe)
                self.done.set()
            else:
                args = request.args
                done = self.state.precheck(args) or self.state.command(self.inv.pipe, args)
        what = "quit" if request.quit else " ".join(request.args)
        self.say(f"{what} -> rc {done.rc}{': ' + done.stderr.strip() if done.stderr else ''}")
        return done

    def serve(self) -> None:
        """Accept requests until the daemon quits (``-q``, SIGTERM via :meth:`terminate`)."""
        listener = self.world.listener
        if listener is None:
            raise WorldError("the daemon has no control socket")
        listener.settimeout(POLL_S)
        while not self.done.is_set():
            if self.term.is_set():
                self.handle(Request(quit=True))
                break
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                self.say(f"accept failed: {exc}")
                continue
            self._dispatch(conn)
        listener.close()
        for thread in list(self.threads):
            thread.join(REQUEST_TIMEOUT_S * 2)
        self.say("daemon exited")

    def terminate(self, signum: int, frame: FrameType | None) -> None:
        """Signal handler: quit at the next poll of :meth:`serve`."""
        self.term.set()

    def _dispatch(self, conn: socket.socket) -> None:
        if not self.slots.acquire(blocking=False):
            conn.settimeout(REQUEST_TIMEOUT_S)
            with contextlib.suppress(OSError):
                conn.sendall(encode_reply(Completed(1, "", "MPS control daemon busy; retry")))
            conn.close()
            return
        thread = threading.Thread(target=self._connection, args=(conn,), daemon=True)
        self.threads.add(thread)
        thread.start()

    def _connection(self, conn: socket.socket) -> None:
        try:
            try:
                request = decode_request(read_line(conn, MAX_REQUEST, REQUEST_TIMEOUT_S))
            except WireError as exc:
                conn.sendall(encode_reply(Completed(1, "", f"malformed request: {exc}")))
                return
            conn.sendall(encode_reply(self.handle(request)))
        except OSError as exc:
            self.say(f"client connection failed: {exc}")
        finally:
            conn.close()
            self.slots.release()
            self.threads.discard(threading.current_thread())


def run_detached(inv: Invocation, ready_fd: int) -> int:
    """The ``-d`` daemon process: start, report the answer on ``ready_fd``, then serve."""
    set_process_name("nvidia-cuda-mps-control")
    daemon = ControlDaemon(inv, os.environ)
    signal.signal(signal.SIGTERM, daemon.terminate)
    done = daemon.start()
    try:
        with contextlib.suppress(OSError):
            os.write(ready_fd, encode_reply(done))
    finally:
        os.close(ready_fd)
    if done.ok:
        daemon.serve()
    return done.rc


def run_foreground(inv: Invocation) -> int:
    """``-f``: start and serve in this process; also answer commands read from stdin (one per
    line; ``quit`` or EOF quits)."""
    daemon = ControlDaemon(inv, os.environ)
    done = daemon.start()
    if not done.ok:
        print(done.stderr.strip(), file=sys.stderr)
        return done.rc
    signal.signal(signal.SIGTERM, daemon.terminate)
    reader = threading.Thread(target=_read_stdin, args=(daemon,), daemon=True)
    reader.start()
    daemon.serve()
    return 0


def _read_stdin(daemon: ControlDaemon) -> None:
    for line in sys.stdin:
        try:
            args = shlex.split(line)
        except ValueError as exc:
            print(f"malformed command: {exc}", flush=True)
            continue
        if not args:
            continue
        if args == ["quit"]:
            break
        done = daemon.handle(Request(args=tuple(args)))
        print(done.stdout, end="", flush=True)
        if done.stderr:
            print(done.stderr.strip(), file=sys.stderr, flush=True)
    daemon.term.set()
