"""The emulator daemon's world: a real ``control`` socket and PID file, and one real server
process per MPS server, driven over its stdin/stdout (:mod:`dra_driver.mpsemu.server`
describes the orders)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from dra_driver.mpsemu.model import (
    PID_FILE,
    Client,
    Daemon,
    Namespace,
    Observation,
    Server,
    WorldError,
)
from dra_driver.mpsemu.paths import server_launcher
from dra_driver.mpsemu.proc import write_pid_file
from dra_driver.mpsemu.wire import CONTROL_SOCKET

ORDER_TIMEOUT_S = 5.0
"""Seconds a server has to answer an order (or to say READY after its start)."""
STOP_TIMEOUT_S = 3.0
"""Seconds a stopping server has to exit before it is killed."""
MAX_ANSWER = 4 * 1024 * 1024
"""Longest answer line of a server, bytes."""


class ServerGone(WorldError):
    """The server process ended (its pipes are closed)."""


class ServerLink:
    """The daemon's end of one server process's stdin/stdout.

    Args:
        name: the server's MPS name (for messages).
        proc: the process, started with pipes for stdin and stdout.
        timeout: seconds per answer.
    """

    def __init__(self, name: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.name = name
        self.proc = proc
        self.timeout = timeout
        self._stdin = proc.stdin.fileno()
        self._stdout = proc.stdout.fileno()
        os.set_blocking(self._stdin, False)
        self._buf = bytearray()
        self._seq = 0

    def exited(self) -> bool:
        """Whether the process has ended (and is reaped)."""
        return self.proc.poll() is not None

    def read_line(self) -> str | None:
        """The next line from the server; None at EOF.

        Raises:
            WorldError: no line within the timeout, or one longer than :data:`MAX_ANSWER`.
        """
        deadline = time.monotonic() + self.timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorldError(f"server {self.name} did not answer within {self.timeout:g} s")
            ready, _, _ = select.select([self._stdout], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._stdout, 65536)
            if not chunk:
                return None
            self._buf += chunk
            if len(self._buf) > MAX_ANSWER:
                raise WorldError(f"server {self.name} sent a line over {MAX_ANSWER} bytes")
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf = bytearray(rest)
        return line.decode(errors="replace")

    def order(self, *words: str) -> str:
        """Send one order and return the payload of its ``OK`` answer.

        Raises:
            ServerGone: the process ended.
            WorldError: it answered ``ERR`` (the message has its text) or not in time.
        """
        self._seq += 1
        try:
            os.write(self._stdin, (" ".join((str(self._seq), *words)) + "\n").encode())
        except BlockingIOError as exc:
            raise WorldError(f"server {self.name} does not read its orders") from exc
        except OSError as exc:
            raise ServerGone(f"server {self.name} is gone ({exc})") from exc
        while True:
            line = self.read_line()
            if line is None:
                raise ServerGone(f"server {self.name} is gone")
            seq, _, rest = line.partition(" ")
            status, _, payload = rest.partition(" ")
            if seq != str(self._seq):
                continue  # a late answer to an order that timed out
            if status == "OK":
                return payload
            raise WorldError(f"server {self.name}: {payload}")

    def stop(self, graceful: bool) -> None:
        """End the process: ``STOP`` first when ``graceful`` (clients are told), then close
        its stdin, wait :data:`STOP_TIMEOUT_S` and kill it if it still runs."""
        if graceful and not self.exited():
            with contextlib.suppress(WorldError):
                self.order("STOP")
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _clients(server: str, payload: str) -> list[Client]:
    """The clients in a ``CLIENTS`` answer (``[[pid, namespace, cmd], ...]``).

    Raises:
        ValueError, TypeError: the answer has another shape.
    """
    return [Client(int(pid), server, str(ns), str(cmd)) for pid, ns, cmd in json.loads(payload)]


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


class ProcessWorld:
    """The :class:`~dra_driver.mpsemu.model.World` of the emulator daemon process.

    Args:
        say: writes one line to the daemon's log.
        timeout: seconds per server order.
    """

    def __init__(self, say: Callable[[str], None], timeout: float = ORDER_TIMEOUT_S) -> None:
        self.say = say
        self.timeout = timeout
        self.listener: socket.socket | None = None
        self.links: dict[str, ServerLink] = {}

    def daemon_started(self, daemon: Daemon) -> None:
        daemon.pipe.mkdir(parents=True, exist_ok=True)
        daemon.log.mkdir(parents=True, exist_ok=True)
        path = daemon.pipe / CONTROL_SOCKET
        path.unlink(missing_ok=True)  # stale: the state machine refused a live daemon's
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(path))
            listener.listen(64)
            write_pid_file(daemon.pipe / PID_FILE)
        except OSError:
            listener.close()
            raise
        self.listener = listener
        self.say(f"daemon started: pid {os.getpid()}, protocol {daemon.protocol}")

    def daemon_stopped(self, daemon: Daemon) -> None:
        for link in self.links.values():
            link.stop(graceful=True)
        self.links.clear()
        (daemon.pipe / CONTROL_SOCKET).unlink(missing_ok=True)
        (daemon.pipe / PID_FILE).unlink(missing_ok=True)
        self.say("daemon quit")

    def server_started(self, daemon: Daemon, server: Server, device_visible: bool) -> int:
        directory = daemon.pipe / server.name
        directory.mkdir(parents=True, exist_ok=True)
        log = daemon.log / server.name / "server.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, str(server_launcher()), "--name", server.name]
        argv += ["--dir", str(directory), "--log", str(log), "--gpus", ",".join(server.allowed)]
        with log.open("ab") as errors:
            proc = subprocess.Popen(
                [*argv, *([] if device_visible else ["--no-device"])],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
            )
        link = ServerLink(server.name, proc, self.timeout)
        try:
            first = link.read_line()
        except WorldError:
            link.stop(graceful=False)
            raise
        if first is None and device_visible:
            link.stop(graceful=False)
            raise WorldError(f"server {server.name} exited at start; see {log}")
        self.links[server.name] = link
        self.say(f"server {server.name} started: pid {proc.pid}, devices {server.allowed}")
        return proc.pid

    def server_stopped(self, daemon: Daemon, server: Server) -> None:
        link = self.links.pop(server.name, None)
        if link is not None:
            link.stop(graceful=True)
        shutil.rmtree(daemon.pipe / server.name, ignore_errors=True)
        self.say(f"server {server.name} removed")

    def _link(self, server: Server) -> ServerLink:
        link = self.links.get(server.name)
        if link is None:
            raise WorldError(f"server {server.name} has no process")
        return link

    def namespace_created(self, daemon: Daemon, server: Server, namespace: Namespace) -> None:
        self.namespace_set(daemon, server, namespace)

    def namespace_set(self, daemon: Daemon, server: Server, namespace: Namespace) -> None:
        limits = (_limit(namespace.pinned), _limit(namespace.threads))
        self._link(server).order("NS", namespace.name, *limits)

    def namespace_removed(self, daemon: Daemon, server: Server, namespace: Namespace) -> None:
        self._link(server).order("NSDEL", namespace.name)
        where = daemon.pipe / server.name / namespace.name
        (where / CONTROL_SOCKET).unlink(missing_ok=True)
        shutil.rmtree(where, ignore_errors=True)

    def client_terminated(self, daemon: Daemon, client: Client) -> None:
        link = self.links.get(client.server)
        if link is not None:
            link.order("TERM", str(client.pid))

    def observe(self, daemon: Daemon) -> Observation:
        exited: list[str] = []
        clients: list[Client] = []
        for name, link in self.links.items():
            if link.exited():
                exited.append(name)
                continue
            try:
                clients += _clients(name, link.order("CLIENTS"))
            except ServerGone:
                exited.append(name)
            except (WorldError, ValueError, TypeError) as exc:
                self.say(f"clients of server {name} unknown: {exc}")
                clients += [c for c in daemon.clients if c.server == name]
        for name in exited:
            self.say(f"server {name} exited on its own")
        return Observation(tuple(exited), tuple(clients))
