"""The emulated MPS server process (``nvidia-cuda-mps-server``): one event loop, one thread.

It listens on ``<dir>/control`` (the ``default`` namespace) and ``<dir>/<namespace>/control``
for each namespace, and takes orders from its daemon on stdin, one line each, answering each
on stdout:

- ``<seq> NS <name> <bytes|-> <percent|->``: create the namespace's socket (if new) and set
  the limits later clients get; ``<seq> NSDEL <name>``: close it, terminating its clients;
- ``<seq> TERM <pid>``: terminate that client; ``<seq> CLIENTS``: list attached clients,
  answered as ``<seq> OK [[pid, namespace, cmd], ...]``;
- ``<seq> STOP``: terminate every client and exit.

Answers are ``<seq> OK <payload>`` or ``<seq> ERR <text>``. At EOF on stdin (the daemon is
gone) the server closes every connection without a word and exits; its socket files stay.

Clients (:mod:`dra_driver.mpsemu.probe` is one) speak lines of at most 4 KiB: ``HELLO <pid>
<cmd>`` first (within 5 s), answered ``WELCOME server=<name> server_pid=<pid>
namespace=<ns> pinned_memory_limit=<4G|unlimited> active_thread_percentage=<p|->``; then
``PING``, answered ``PONG <server pid>``, or ``USE <bytes> <percent>`` (what it allocates and
computes, held to its namespace's limits: :func:`dra_driver.model.simusage.grant`), answered
``USING <bytes> <percent>`` or ``REFUSED <error>``; every client's use is in
``<dir>/usage.json`` for the simulated NVML. The server may send ``TERMINATED <reason>`` and
close; a malformed line is answered ``ERROR <text>`` and closed. A client's PID is its peer
credential (the host's view), else the one it sent.

The client table: a server takes at most :data:`CLIENT_TABLE` attached clients, over all its
namespaces. A real MPS server holds 60 client CUDA contexts per device (48 on CUDA 13.0 and
before; NVIDIA MPS docs, "When to Use MPS"), and a client of a server with several devices
holds a context on each of them, so 60 clients per server, whatever its devices, is the same
limit. A ``HELLO`` past it is answered ``ERROR CUDA_ERROR_MPS_MAX_CLIENTS_REACHED ...`` and
closed, and the server logs it: a real client's context creation fails then (the docs say it
fails and the server logs it; the error name is the CUDA driver API's for that case,
[INFERRED] as what the client sees). Apart from that, at most :data:`MAX_PENDING`
connections may wait for their ``HELLO``; more are answered ``ERROR ...`` and closed at once.
That is the emulator's own protection against a flood of silent connections (one event loop,
one process), not an MPS feature.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from dra_driver.model import simusage
from dra_driver.mpsemu.model import DEFAULT_NAMESPACE, mem_text
from dra_driver.mpsemu.proc import peer_pid, set_process_name
from dra_driver.mpsemu.wire import CONTROL_SOCKET

SERVER_PROGRAM = "nvidia-cuda-mps-server"
"""The server program's name (its argv[0] and, cut to 15 characters, its process name)."""
NO_DEVICE = "no CUDA-capable device is detected"
"""What a server that cannot open its GPU writes to its log before it exits (rc 1)."""

HELLO_TIMEOUT_S = 5.0
"""Seconds a new connection has to say ``HELLO``."""
MAX_LINE = 4096
"""Longest client line, bytes."""
MAX_ORDER = 64 * 1024
"""Longest line from the daemon, bytes."""
CLIENT_TABLE = 60
"""Attached clients one server takes, over all its namespaces: MPS's client CUDA contexts per
device (NVIDIA MPS docs, "When to Use MPS": 60 since r590 with the default
``CUDA_DEVICE_MAX_CONNECTIONS=2``, 48 on CUDA 13.0 and before); see the module docstring."""
MAX_PENDING = 64
"""Connections that may wait for their ``HELLO`` at once; more are refused at once (the
emulator's own protection, not an MPS feature)."""
MAX_CLIENTS_REACHED = "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"
"""The error a client past the table is answered with (CUDA driver API error 808, "the
hardware resources required to create MPS client have been exhausted")."""


@dataclass
class _Space:
    name: str
    listener: socket.socket
    threads: str = "-"
    pinned_bytes: int | None = None


@dataclass
class _Conn:
    sock: socket.socket
    space: str
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    pid: int = 0
    cmd: str = ""
    attached: bool = False
    use: tuple[int, float] = (0, 0.0)


class ServerLoop:
    """One server's sockets, clients and orders.

    Args:
        name: the server's MPS name.
        directory: ``<pipe>/<name>``.
        log: its ``server.log``, open for appending text.
    """

    def __init__(self, name: str, directory: Path, log: TextIO, gpus: tuple[str, ...] = ()) -> None:
        self.name = name
        self.gpus = gpus
        self.directory = directory
        self.log = log
        self.pid = os.getpid()
        self.sel = selectors.DefaultSelector()
        self.spaces: dict[str, _Space] = {}
        self.conns: dict[socket.socket, _Conn] = {}
        self.orders = bytearray()
        self.running = True

    def say(self, text: str) -> None:
        """Append one time-stamped line to the server log."""
        self.log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {text}\n")
        self.log.flush()

    def listen(self, space: str) -> None:
        """Open the socket of namespace ``space`` (``default``: the server's own)."""
        where = self.directory if space == DEFAULT_NAMESPACE else self.directory / space
        where.mkdir(parents=True, exist_ok=True)
        path = where / CONTROL_SOCKET
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        os.chmod(path, 0o666)
        listener.listen(64)
        listener.setblocking(False)
        self.sel.register(listener, selectors.EVENT_READ, ("listen", space))
        self.spaces[space] = _Space(space, listener)

    def run(self) -> None:
        """Serve until STOP or EOF on stdin."""
        os.set_blocking(0, False)
        self.sel.register(0, selectors.EVENT_READ, ("orders", ""))
        while self.running:
            for key, _ in self.sel.select(timeout=0.5):
                kind, space = key.data
                if kind == "orders":
                    self._read_orders()
                elif kind == "listen":
                    self._accept(space)
                elif key.fileobj in self.conns:  # not dropped earlier in this round
                    self._read_client(self.conns[key.fileobj])
                if not self.running:
                    break
            now = time.monotonic()
            for conn in [c for c in self.conns.values() if not c.attached and c.deadline < now]:
                self._drop(conn, "ERROR no HELLO in time")
        for space in list(self.spaces.values()):
            space.listener.close()
        self.sel.close()

    # orders from the daemon -------------------------------------------------------------
    def _read_orders(self) -> None:
        try:
            data = os.read(0, 65536)
        except BlockingIOError:
            return
        if not data:
            self.say("control daemon gone (stdin closed); exiting")
            for conn in list(self.conns.values()):
                self._drop(conn, None)
            self.running = False
            return
        self.orders += data
        while b"\n" in self.orders:
            line, _, rest = bytes(self.orders).partition(b"\n")
            self.orders = bytearray(rest)
            self._order(line.decode(errors="replace").split())
        if len(self.orders) > MAX_ORDER:
            self.say("order line too long; dropped")
            self.orders.clear()

    def _order(self, words: list[str]) -> None:
        if len(words) < 2:
            self.say(f"malformed order {' '.join(words)!r}")
            return
        seq, verb, args = words[0], words[1], words[2:]
        try:
            payload = self._obey(verb, args)
        except (OSError, ValueError, KeyError) as exc:
            self.answer(f"{seq} ERR {verb} {' '.join(args)}: {exc}")
            return
        self.answer(f"{seq} OK {payload}")
        if verb == "STOP":
            self.running = False

    def _obey(self, verb: str, args: list[str]) -> str:
        if verb == "NS" and len(args) == 3:
            name, pinned, threads = args
            if name not in self.spaces:
                self.listen(name)
            self.spaces[name].pinned_bytes = None if pinned == "-" else int(pinned)
            self.spaces[name].threads = threads
            pinned_text = mem_text(self.spaces[name].pinned_bytes)
            self.say(f"namespace {name}: pinned {pinned_text}, threads {threads}")
            return ""
        if verb == "NSDEL" and len(args) == 1:
            space = self.spaces.pop(args[0])
            self.sel.unregister(space.listener)
            space.listener.close()
            for conn in [c for c in self.conns.values() if c.space == args[0]]:
                self._drop(conn, f"TERMINATED namespace {args[0]} deleted by MPS control")
            self.say(f"namespace {args[0]} deleted")
            return ""
        if verb == "TERM" and len(args) == 1:
            pid = int(args[0])
            for conn in [c for c in self.conns.values() if c.attached and c.pid == pid]:
                self._drop(conn, f"TERMINATED client {pid} terminated by MPS control")
            return ""
        if verb == "CLIENTS" and not args:
            return json.dumps([[c.pid, c.space, c.cmd] for c in self.conns.values() if c.attached])
        if verb == "STOP" and not args:
            for conn in list(self.conns.values()):
                self._drop(conn, f"TERMINATED server {self.name} stopped by MPS control")
            self.say("stopped by the control daemon")
            return ""
        raise ValueError("unknown order")

    def answer(self, line: str) -> None:
        """Write ``line`` to the daemon (stdout); a daemon that is gone ends the loop."""
        data = (line + "\n").encode()
        try:
            while data:
                data = data[os.write(1, data) :]
        except OSError as exc:
            self.say(f"cannot answer the control daemon ({exc}); exiting")
            self.running = False

    # clients ----------------------------------------------------------------------------
    def _accept(self, space: str) -> None:
        try:
            sock, _ = self.spaces[space].listener.accept()
        except (BlockingIOError, KeyError):
            return
        sock.setblocking(False)
        if sum(1 for c in self.conns.values() if not c.attached) >= MAX_PENDING:
            with contextlib.suppress(OSError):
                sock.send(
                    f"ERROR emulator: {MAX_PENDING} connections already wait for their "
                    "HELLO; try again\n".encode()
                )
            sock.close()
            return
        self.conns[sock] = _Conn(sock, space, time.monotonic() + HELLO_TIMEOUT_S)
        self.sel.register(sock, selectors.EVENT_READ, ("client", space))

    def _read_client(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(MAX_LINE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn, None)
            return
        conn.buf += data
        while b"\n" in conn.buf and conn.sock in self.conns:
            line, _, rest = bytes(conn.buf).partition(b"\n")
            conn.buf = bytearray(rest)
            self._client_line(conn, line.decode(errors="replace").strip())
        if len(conn.buf) > MAX_LINE and conn.sock in self.conns:
            self._drop(conn, "ERROR line too long")

    def _client_line(self, conn: _Conn, line: str) -> None:
        words = line.split(" ", 2)
        if not conn.attached:
            if len(words) < 2 or words[0] != "HELLO" or not words[1].isdigit():
                self._drop(conn, "ERROR expected: HELLO <pid> <cmd>")
                return
            conn.pid = peer_pid(conn.sock) or int(words[1])
            conn.cmd = words[2] if len(words) > 2 else "-"
            attached = sum(1 for c in self.conns.values() if c.attached)
            if attached >= CLIENT_TABLE:
                self.say(
                    f"client {conn.pid} ({conn.cmd}) refused on namespace {conn.space}: "
                    f"{attached} clients attached, the most a server takes ({MAX_CLIENTS_REACHED})"
                )
                self._drop(
                    conn,
                    f"ERROR {MAX_CLIENTS_REACHED}: server {self.name} has {attached} clients, "
                    "the most it takes",
                )
                return
            conn.attached = True
            self.write_usage()
            space = self.spaces[conn.space]
            self.say(f"client {conn.pid} ({conn.cmd}) attached to namespace {conn.space}")
            self._send(
                conn,
                f"WELCOME server={self.name} server_pid={self.pid} namespace={conn.space} "
                f"pinned_memory_limit={mem_text(space.pinned_bytes)} "
                f"active_thread_percentage={space.threads}",
            )
        elif line == "PING":
            self._send(conn, f"PONG {self.pid}")
        elif words[0] == "USE" and len(words) == 3 and words[1].isdigit():
            self._use(conn, int(words[1]), words[2])
        else:
            self._drop(conn, "ERROR expected: PING or USE <bytes> <percent>")

    def _use(self, conn: _Conn, want_bytes: int, want_sm: str) -> None:
        space = self.spaces[conn.space]
        threads = int(space.threads) if space.threads.isdigit() else None
        try:
            got = simusage.grant(want_bytes, float(want_sm), space.pinned_bytes, threads)
        except ValueError:
            got = f"invalid percentage {want_sm!r}"
        if isinstance(got, str):
            self.say(f"client {conn.pid} on namespace {conn.space}: {got}")
            self._send(conn, f"REFUSED {got}")
            return
        conn.use = got
        self._send(conn, f"USING {got[0]} {got[1]:g}")
        self.write_usage()

    def write_usage(self) -> None:
        """Rewrite ``<dir>/usage.json``: every attached client's use (0 until it says)."""
        clients = tuple(
            simusage.ClientUse(c.pid, c.space, *c.use) for c in self.conns.values() if c.attached
        )
        body = simusage.render(simusage.ServerUse(self.gpus, clients))
        path = self.directory / simusage.USAGE_FILE
        with contextlib.suppress(OSError):  # the directory may be gone at shutdown
            fd = os.open(f"{path}.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(body)
            os.replace(f"{path}.tmp", path)  # readers see the old or the new file, whole

    def _send(self, conn: _Conn, line: str) -> None:
        data = (line + "\n").encode()
        try:
            sent = conn.sock.send(data)
        except OSError:
            sent = -1
        if sent != len(data):
            self._drop(conn, None)

    def _drop(self, conn: _Conn, last_words: str | None) -> None:
        if conn.sock not in self.conns:
            return
        if last_words is not None:
            with contextlib.suppress(OSError):
                conn.sock.send((last_words + "\n").encode())
        del self.conns[conn.sock]
        self.sel.unregister(conn.sock)
        conn.sock.close()
        if conn.attached:
            self.say(f"client {conn.pid} detached from namespace {conn.space}")
            self.write_usage()


def server_main(argv: list[str]) -> int:
    """Run one server: ``--name <server> --dir <pipe>/<server> --log <file> [--no-device]
    [--gpus <uuid,...>]``.

    Writes ``READY <pid>`` on stdout once ``<dir>/control`` listens, then serves (see the
    module docstring). With ``--no-device`` it only logs :data:`NO_DEVICE` and returns 1.
    """
    parser = argparse.ArgumentParser(prog=SERVER_PROGRAM)
    parser.add_argument("--name", required=True)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--no-device", action="store_true")
    parser.add_argument("--gpus", default="", help="comma-separated UUIDs it serves")
    args = parser.parse_args(argv)
    set_process_name(SERVER_PROGRAM)
    args.log.parent.mkdir(parents=True, exist_ok=True)
    with args.log.open("a") as log:
        gpus = tuple(g for g in args.gpus.split(",") if g)
        loop = ServerLoop(args.name, args.dir, log, gpus)
        if args.no_device:
            loop.say(f"server {args.name}: {NO_DEVICE}")
            return 1
        loop.listen(DEFAULT_NAMESPACE)
        loop.say(f"server {args.name} started (pid {loop.pid})")
        loop.answer(f"READY {loop.pid}")
        loop.run()
        loop.say(f"server {args.name} exited")
    return 0
