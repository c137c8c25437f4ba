"""Small process helpers of the MPS emulator."""

from __future__ import annotations

import os
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
