"""Entry points of the launcher files in ``dra_driver/mpsemu/bin`` (see
:mod:`dra_driver.mpsemu.paths`)."""

from __future__ import annotations

from collections.abc import Sequence

from dra_driver.mpsemu.cli import control_main
from dra_driver.mpsemu.server import server_main


def control(argv: Sequence[str]) -> int:
    """``nvidia-cuda-mps-control <argv>``; returns the exit status."""
    return control_main(argv)


def server(argv: Sequence[str]) -> int:
    """``nvidia-cuda-mps-server <argv>`` (started by the emulated daemon); returns the exit
    status."""
    return server_main(list(argv))
