"""The emulator's control-socket protocol: a JSON line in, a framed reply out, bounded and
timed.

A client of ``<pipe>/control`` sends one line, ``{"args": ["server", "list", ...]}`` or
``{"quit": true}``; the daemon answers ``<rc> <stdout bytes> <stderr bytes>\n`` followed by
stdout and stderr (UTF-8), then closes. Requests are at most :data:`MAX_REQUEST` bytes, the
output of a reply :data:`MAX_REPLY`. The reply is framed, not JSON, so that the compiled client
(``control_client.c``) needs no JSON parser; its request encoder escapes ``"``, ``\\`` and
control characters only.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass

from dra_driver.model.commands import Completed
from dra_driver.model.errors import DriverError

CONTROL_SOCKET = "control"
"""Name of the socket of a daemon, a server and a namespace in its directory."""
MAX_REQUEST = 64 * 1024
"""Longest request line, bytes."""
MAX_REPLY = 8 * 1024 * 1024
"""Most bytes of a reply's stdout and stderr together."""
HEADER_LIMIT = 64
"""Most bytes of a reply's header line."""


class WireError(DriverError, ValueError):
    """A line that is too long, cut off, late or not the expected JSON; says which."""


@dataclass(frozen=True)
class Request:
    """One control request: ``quit`` (``-q``) or the v3 command ``args``."""

    quit: bool = False
    args: tuple[str, ...] = ()


def read_line(sock: socket.socket, limit: int, timeout: float) -> bytes:
    """Read one ``\\n``-terminated line (without it) from ``sock``.

    Args:
        sock: a connected stream socket.
        limit: most bytes the line may have.
        timeout: seconds each receive may wait.

    Raises:
        WireError: the peer closed before the newline, the line is longer than ``limit``, or a
            receive timed out.
        OSError: the connection failed.
    """
    sock.settimeout(timeout)
    data = bytearray()
    while True:
        try:
            chunk = sock.recv(min(65536, limit + 1 - len(data)))
        except TimeoutError as exc:
            raise WireError(f"no complete line within {timeout:g} s") from exc
        if not chunk:
            raise WireError("connection closed before the end of the line")
        end = chunk.find(b"\n")
        if end >= 0:
            data += chunk[:end]
            if len(data) > limit:
                break
            return bytes(data)
        data += chunk
        if len(data) > limit:
            break
    raise WireError(f"line longer than {limit} bytes")


def encode_request(request: Request) -> bytes:
    """The request's line, newline included."""
    body: dict[str, object] = {"quit": True} if request.quit else {"args": list(request.args)}
    return json.dumps(body).encode() + b"\n"


def decode_request(line: bytes) -> Request:
    """Parse a request line.

    Raises:
        WireError: not a JSON object with ``quit: true`` or ``args``: a list of strings.
    """
    try:
        body = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"request is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise WireError("request is not a JSON object")
    if body.get("quit") is True:
        return Request(quit=True)
    args = body.get("args")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise WireError("request needs 'args': a list of strings, or 'quit': true")
    return Request(args=tuple(args))


def encode_reply(done: Completed) -> bytes:
    """The reply of ``done``: its header line, then stdout and stderr."""
    out = done.stdout.encode("utf-8", "surrogateescape")
    err = done.stderr.encode("utf-8", "surrogateescape")
    return b"%d %d %d\n" % (done.rc, len(out), len(err)) + out + err


def decode_reply(data: bytes) -> Completed:
    """Parse a whole reply (header line, stdout, stderr).

    Raises:
        WireError: no header of three integers (sizes not negative), or the bytes after it are
            not exactly the sizes it gives.
    """
    header, newline, body = data.partition(b"\n")
    if not newline:
        raise WireError(f"reply has no header line: {header[:80]!r}")
    rc, n_out, n_err = _header(header)
    if len(body) != n_out + n_err:
        raise WireError(f"reply has {len(body)} bytes after its header, not {n_out} + {n_err}")
    out, err = body[:n_out], body[n_out:]
    return Completed(rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


def _header(header: bytes) -> tuple[int, int, int]:
    """``(rc, stdout bytes, stderr bytes)`` of a reply's header line (without its newline).

    Raises:
        WireError: not three integers, or a size negative.
    """
    fields = header.split(b" ")
    if len(fields) != 3 or not all(f.lstrip(b"-").isdigit() for f in fields):
        shape = "'<rc> <stdout bytes> <stderr bytes>'"
        raise WireError(f"reply header is not {shape}: {header[:80]!r}")
    rc, n_out, n_err = (int(f) for f in fields)
    if n_out < 0 or n_err < 0:
        raise WireError(f"reply header gives a negative size: {header[:80]!r}")
    return rc, n_out, n_err


def read_reply(sock: socket.socket, timeout: float) -> Completed:
    """Read one reply: its header line, then as many bytes as it gives (what the peer does
    after them, e.g. closing with a reset, is not waited for).

    Args:
        sock: a connected stream socket.
        timeout: seconds each receive may wait.

    Raises:
        WireError: a header longer than :data:`HEADER_LIMIT` or malformed, output longer than
            :data:`MAX_REPLY`, the peer closed early, or a receive timed out.
        OSError: the connection failed.
    """
    sock.settimeout(timeout)
    data = bytearray()
    need: int | None = None
    while need is None or len(data) < need:
        try:
            chunk = sock.recv(65536)
        except TimeoutError as exc:
            raise WireError(f"no complete reply within {timeout:g} s") from exc
        if not chunk:
            break
        data += chunk
        if need is None:
            end = data.find(b"\n", 0, HEADER_LIMIT + 1)
            if end < 0:
                if len(data) > HEADER_LIMIT:
                    raise WireError(f"reply header longer than {HEADER_LIMIT} bytes")
                continue
            _, n_out, n_err = _header(bytes(data[:end]))
            if n_out + n_err > MAX_REPLY:
                raise WireError(f"reply longer than {MAX_REPLY} bytes")
            need = end + 1 + n_out + n_err
    return decode_reply(bytes(data))


def call(path: str, request: Request, timeout: float) -> Completed:
    """Send ``request`` to the daemon listening at ``path`` and return its answer.

    Raises:
        ConnectionError, FileNotFoundError: nothing listens there (no daemon).
        WireError: the daemon's answer is late, cut off or malformed.
        OSError: another failure of the connection.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(encode_request(request))
        return read_reply(sock, timeout)
