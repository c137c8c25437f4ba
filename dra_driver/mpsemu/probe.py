"""Tenant probe: attach to an MPS namespace as a CUDA client would and report what it got.

Standard library only; runs as a single file in a workload container (``python3 probe.py``).
It connects through ``$CUDA_MPS_PIPE_DIRECTORY/control`` (default ``/tmp/nvidia-mps``) to an
emulated MPS server (:mod:`dra_driver.mpsemu.server`: ``HELLO <pid> <cmd>`` / ``WELCOME ...``,
then ``PING`` / ``PONG <server pid>``), holds the connection and prints one line a second::

    tenant-probe: t=2026-01-01T00:00:00+00:00 server=gpu_0 server_pid=1234 namespace=c_x
      pinned_memory_limit=4G active_thread_percentage=50 state=connected

(one line each time, ``state`` last). ``state`` is ``connected`` (just attached), ``same``
(still attached to the same server process), ``terminated`` (the server ended the connection
and said why: ``reason=``), ``lost`` (the connection ended or went quiet), ``rejected`` (the
server refused the greeting: ``reason=``, e.g. ``ERROR CUDA_ERROR_MPS_MAX_CLIENTS_REACHED ...``
when its client table is full, where a CUDA client's context creation fails), ``unreachable``
(cannot connect: ``error=``) or ``stopped`` (SIGTERM: exit status 0); after all but
``stopped`` it tries again a second later. Values with spaces are quoted as a POSIX shell
would; :func:`parse_line` reads a line back into a dict.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import select
import shlex
import signal
import socket
import sys
import time
from types import FrameType

PREFIX = "tenant-probe:"
"""First word of every line the probe prints."""
INTERVAL_S = 1.0
"""Seconds between reports (and between connection attempts)."""
ANSWER_TIMEOUT_S = 3.0
"""Seconds the server has to answer a greeting or a ping."""
MAX_LINE = 4096
"""Longest line read from the server, bytes."""
WELCOME_KEYS = (
    "server",
    "server_pid",
    "namespace",
    "pinned_memory_limit",
    "active_thread_percentage",
)
"""What the ``connected`` line reports, from the server's greeting."""


def parse_line(line: str) -> dict[str, str]:
    """The ``key=value`` fields of a probe line ({} for a line that is not one)."""
    words = shlex.split(line)
    if not words or words[0] != PREFIX:
        return {}
    return dict(w.split("=", 1) for w in words[1:] if "=" in w)


def _quote(value: str) -> str:
    return value if value and not any(c in value for c in " \"'\\") else shlex.quote(value)


def report(state: str, **fields: str) -> None:
    """Print one probe line: time, ``fields`` in the order given, then ``state``."""
    utc = datetime.timezone.utc  # noqa: UP017 (datetime.UTC is new in 3.11; tenants may be older)
    now = datetime.datetime.now(utc).isoformat(timespec="seconds")
    pairs = [f"t={now}", *(f"{k}={_quote(v)}" for k, v in fields.items()), f"state={state}"]
    print(PREFIX, " ".join(pairs), flush=True)


class _Link:
    """One connection to the server, read line by line with a timeout."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.buf = b""
        try:
            self.sock.settimeout(ANSWER_TIMEOUT_S)
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise

    def send(self, line: str) -> None:
        self.sock.sendall((line + "\n").encode())

    def read(self) -> str | None:
        """The next line; None when the server closed or did not answer in time."""
        while b"\n" not in self.buf:
            try:
                chunk = self.sock.recv(MAX_LINE)
            except OSError:
                return None
            if not chunk or len(self.buf) > MAX_LINE:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace").strip()

    def close(self) -> None:
        self.sock.close()


def _welcome(text: str) -> dict[str, str]:
    words = text.split()
    if not words or words[0] != "WELCOME":
        return {}
    return dict(w.split("=", 1) for w in words[1:] if "=" in w)


def _hold(link: _Link, info: dict[str, str]) -> None:
    """Report once a second while the server answers; return when it does not (at once when
    it closes or says it terminated the client)."""
    fields = {k: info.get(k, "?") for k in ("server", "server_pid", "namespace")}
    while True:
        if not link.buf and not select.select([link.sock], [], [], INTERVAL_S)[0]:
            with contextlib.suppress(OSError):  # a server that closed: read its last word
                link.send("PING")
        answer = link.read()
        if answer is None:
            report("lost", **fields)
            return
        if answer.startswith("TERMINATED"):
            report("terminated", **fields, reason=answer.partition(" ")[2])
            return
        if answer != f"PONG {info.get('server_pid')}":
            report("lost", **fields, answer=answer)
            return
        report("same", **fields)


def _attach(path: str) -> None:
    """One connection's life: greet, report, hold; raises OSError when it cannot connect."""
    link = _Link(path)
    try:
        link.send(f"HELLO {os.getpid()} tenant-probe")
        answer = link.read()
        info = _welcome(answer or "")
        if not info:
            report("rejected", reason=answer or "no answer")
            return
        report("connected", **{k: info.get(k, "?") for k in WELCOME_KEYS})
        _hold(link, info)
    except OSError as exc:
        report("lost", error=str(exc))
    finally:
        link.close()


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main() -> int:
    """Probe until SIGTERM; returns 0."""
    signal.signal(signal.SIGTERM, _stop)
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    path = os.path.join(pipe, "control")
    try:
        while True:
            try:
                _attach(path)
            except OSError as exc:
                report("unreachable", pipe=pipe, error=exc.strerror or str(exc))
            time.sleep(INTERVAL_S)
    except (SystemExit, KeyboardInterrupt):
        report("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
