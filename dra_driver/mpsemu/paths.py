"""Where the emulator's programs are: files inside the package (not console scripts, so that
nothing with NVIDIA's names lands on ``PATH`` of a machine with the real ones).

``bin/nvidia-cuda-mps-control`` is compiled from ``control_client.c`` on first use (and again
when the source is newer), with the system's C compiler (``$CC``, default ``cc``), statically
linked so that the same file runs in the image. Where the source is absent (the image carries
the compiled program only), the program is used as it is.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from dra_driver.model.errors import StartupError

BIN = Path(__file__).resolve().parent / "bin"
"""The launchers' directory."""
CLIENT_SOURCE = Path(__file__).resolve().parent / "control_client.c"
"""Source of the compiled ``nvidia-cuda-mps-control``."""
CFLAGS = ("-O2", "-static", "-Wall", "-Wextra")
"""Compiler options of the compiled program."""


class EmulatorBuildError(StartupError):
    """The compiled control program could not be built; says why and what to install."""


def emulator_path() -> Path:
    """The emulated ``nvidia-cuda-mps-control``: the compiled client (built if missing or older
    than its source, unless its directory cannot be written and it is there), which hands
    anything but a plain command to :func:`python_program`.

    Raises:
        EmulatorBuildError: no C compiler, or the compiler failed (its output included).
    """
    program = BIN / "nvidia-cuda-mps-control"
    if CLIENT_SOURCE.exists() and (
        not program.exists() or program.stat().st_mtime < CLIENT_SOURCE.stat().st_mtime
    ):
        if program.exists() and not os.access(BIN, os.W_OK):
            return program  # an installed tree that cannot be written: the program it has
        build_client(program)
    return program


def build_client(program: Path) -> None:
    """Compile :data:`CLIENT_SOURCE` into ``program`` (written whole, then renamed into place).

    Raises:
        EmulatorBuildError: as :func:`emulator_path`.
    """
    compiler = os.environ.get("CC", "cc")
    try:
        fd, tmp = tempfile.mkstemp(dir=program.parent, prefix=".build-")
    except OSError as exc:
        raise EmulatorBuildError(f"cannot build the MPS emulator's control program: {exc}") from exc
    os.close(fd)
    try:
        try:
            done = subprocess.run(
                [compiler, *CFLAGS, "-o", tmp, str(CLIENT_SOURCE)],
                capture_output=True,
                text=True,
                timeout=120,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EmulatorBuildError(
                f"cannot compile the MPS emulator's control program with {compiler!r} ({exc}); "
                "install a C compiler and static C library (Debian: gcc libc6-dev)"
            ) from exc
        if done.returncode != 0:
            raise EmulatorBuildError(
                f"compiling {CLIENT_SOURCE} failed (rc {done.returncode}):\n{done.stderr[-2000:]}"
            )
        os.chmod(tmp, 0o755)
        os.replace(tmp, program)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def python_program() -> Path:
    """The emulated ``nvidia-cuda-mps-control`` in Python (an executable launcher): daemons
    (``-d``, ``-f``), ``-q``, ``-h`` and every answer the compiled client does not send itself."""
    return BIN / "nvidia-cuda-mps-control-py"


def server_launcher() -> Path:
    """The emulated ``nvidia-cuda-mps-server`` (started by the emulated daemon only)."""
    return BIN / "nvidia-cuda-mps-server"
