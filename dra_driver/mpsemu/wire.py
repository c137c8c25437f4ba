"""The emulator's control-socket protocol: one JSON line each way, bounded and timed.

A client of ``<pipe>/control`` sends one line, ``{"args": ["server", "list", ...]}`` or
``{"quit": true}``, and reads one line back, ``{"rc": 0, "stdout": "...", "stderr": "..."}``;
then both close. Requests are at most :data:`MAX_REQUEST` bytes, replies :data:`MAX_REPLY`.
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
"""Longest reply line, bytes."""


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
    """The reply line of ``done``, newline included."""
    body = {"rc": done.rc, "stdout": done.stdout, "stderr": done.stderr}
    return json.dumps(body).encode() + b"\n"


def decode_reply(line: bytes) -> Completed:
    """Parse a reply line.

    Raises:
        WireError: not a JSON object with an integer ``rc`` and string ``stdout``/``stderr``.
    """
    try:
        body = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"reply is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise WireError("reply is not a JSON object")
    rc, out, err = body.get("rc"), body.get("stdout", ""), body.get("stderr", "")
    if not isinstance(rc, int) or not isinstance(out, str) or not isinstance(err, str):
        raise WireError("reply needs an integer 'rc' and string 'stdout'/'stderr'")
    return Completed(rc, out, err)


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
        return decode_reply(read_line(sock, MAX_REPLY, timeout))
