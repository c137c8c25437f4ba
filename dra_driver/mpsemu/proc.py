"""Small process helpers of the MPS emulator."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path


def set_process_name(name: str) -> None:
    """Set this process's name (``/proc/self/comm``, cut to 15 bytes by the kernel) so that
    ``ps``/``pgrep`` show the emulated program, as they would the real one; ignored where
    that file is missing or read-only."""
    try:
        Path("/proc/self/comm").write_text(name[:15])
    except OSError:
        return


def write_pid_file(path: Path) -> None:
    """Write this process's PID to ``path`` (atomically: a reader sees all of it or none)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(f"{os.getpid()}\n")
    os.replace(tmp, path)


def peer_pid(sock: socket.socket) -> int:
    """The PID of a unix socket's peer (``SO_PEERCRED``), as the host sees it; 0 where the
    platform or the socket cannot tell."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return 0
    try:
        pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, 12))
    except OSError:
        return 0
    return int(pid)
