"""Tenant probe: attach to an MPS namespace as a CUDA client would and report what it got.

Standard library only; runs as a single file in a workload container (``python3 probe.py``).
It connects through ``$CUDA_MPS_PIPE_DIRECTORY/control`` (default ``/tmp/nvidia-mps``) to an
emulated MPS server (:mod:`dra_driver.mpsemu.server`: ``HELLO <pid> <cmd>`` / ``WELCOME ...``,
then ``PING`` / ``PONG <server pid>``), holds the connection and prints one line a second::

    tenant-probe: t=2026-01-01T00:00:00+00:00 server=gpu_0 server_pid=1234 namespace=c_x
      pinned_memory_limit=4G active_thread_percentage=50 state=connected

(one line each time, ``state`` last). With ``--use-memory <quantity>`` (``2Gi``, ``512Mi``,
bytes) and ``--use-sm <percent>`` it then tells the server what it allocates and computes
(``USE <bytes> <percent>``) and reports ``using`` (``used_memory=`` bytes, ``sm=`` percent: what
the server granted) or ``use-refused`` (``reason=``, e.g. ``CUDA_ERROR_OUT_OF_MEMORY ...`` past
the namespace's pinned memory limit), as a CUDA program's allocation succeeds or fails; the
simulated NVML reports the granted use. ``state`` is ``connected`` (just attached), ``same``
(still attached to the same server process), ``terminated`` (the server ended the connection
and said why: ``reason=``), ``lost`` (the connection ended or went quiet), ``rejected`` (the
server refused the greeting: ``reason=``, e.g. ``ERROR CUDA_ERROR_MPS_MAX_CLIENTS_REACHED ...``
when its client table is full, where a CUDA client's context creation fails), ``unreachable``
(cannot connect: ``error=``) or ``stopped`` (SIGTERM: exit status 0); after all but
``stopped`` it tries again a second later. Values with spaces are quoted as a POSIX shell
would; :func:`parse_line` reads a line back into a dict.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import re
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


_QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti)?$")
_UNITS = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def quantity_bytes(text: str) -> int:
    """Bytes of a Kubernetes binary quantity (``2Gi``, ``512Mi``, ``1024``).

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    m = _QUANTITY.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: want bytes or <n>Ki|Mi|Gi|Ti")
    return int(m.group(1)) * _UNITS[m.group(2)]


def _use(link: _Link, use: tuple[int, float], info: dict[str, str]) -> None:
    """Tell the server what this client uses and report what it granted."""
    fields = {k: info.get(k, "?") for k in ("server", "namespace")}
    link.send(f"USE {use[0]} {use[1]:g}")
    answer = link.read() or "no answer"
    words = answer.split()
    if words[0] == "USING" and len(words) == 3:
        report("using", **fields, used_memory=words[1], sm=words[2])
    else:
        report("use-refused", **fields, reason=answer.partition(" ")[2] or answer)


def _attach(path: str, use: tuple[int, float] | None = None) -> None:
    """One connection's life: greet, report, tell the use, hold; raises OSError when it
    cannot connect."""
    link = _Link(path)
    try:
        link.send(f"HELLO {os.getpid()} tenant-probe")
        answer = link.read()
        info = _welcome(answer or "")
        if not info:
            report("rejected", reason=answer or "no answer")
            return
        report("connected", **{k: info.get(k, "?") for k in WELCOME_KEYS})
        if use is not None:
            _use(link, use, info)
        _hold(link, info)
    except OSError as exc:
        report("lost", error=str(exc))
    finally:
        link.close()


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    """Probe until SIGTERM; returns 0 (2 for bad arguments)."""
    parser = argparse.ArgumentParser(prog="tenant-probe")
    parser.add_argument("--use-memory", type=quantity_bytes, default=None)
    parser.add_argument("--use-sm", type=float, default=0.0)
    args = parser.parse_args(argv)
    if not 0 <= args.use_sm <= 100:
        parser.error("--use-sm: a percentage 0..100")
    use = None
    if args.use_memory is not None or args.use_sm:
        use = (args.use_memory or 0, args.use_sm)
    signal.signal(signal.SIGTERM, _stop)
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    path = os.path.join(pipe, "control")
    try:
        while True:
            try:
                _attach(path, use)
            except OSError as exc:
                report("unreachable", pipe=pipe, error=exc.strerror or str(exc))
            time.sleep(INTERVAL_S)
    except (SystemExit, KeyboardInterrupt):
        report("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
