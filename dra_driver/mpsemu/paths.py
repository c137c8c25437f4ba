"""Where the emulator's programs are: launcher files inside the package (not console scripts,
so that nothing with NVIDIA's names lands on ``PATH`` of a machine with the real ones)."""

from __future__ import annotations

from pathlib import Path

BIN = Path(__file__).resolve().parent / "bin"
"""The launchers' directory."""


def emulator_path() -> Path:
    """The emulated ``nvidia-cuda-mps-control`` (an executable Python launcher)."""
    return BIN / "nvidia-cuda-mps-control"


def server_launcher() -> Path:
    """The emulated ``nvidia-cuda-mps-server`` (started by the emulated daemon only)."""
    return BIN / "nvidia-cuda-mps-server"
