"""Compute-mode bookkeeping: setting a GPU's compute mode for MPS, with a marker file per GPU
changed, and putting it back to DEFAULT when no claim needs the GPU (also after a restart)."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

import structlog

from dra_driver.enforce.mps.nvmlcontrol import NvmlError, NvmlFacade
from dra_driver.gpus import Gpu
from dra_driver.infra.atomicfile import private_dir

log = structlog.get_logger(__name__)


class ComputeModes:
    """Sets and restores GPU compute modes, remembering every GPU it changed.

    Args:
        mps_root: ``<root>/mps``; a GPU it changed has the marker
            ``<mps_root>/compute-mode/<uuid>`` (its content: the mode set), so a restarted plugin
            knows which GPUs to put back.
        nvml: reads and sets compute modes.
    """

    def __init__(self, mps_root: Path, nvml: NvmlFacade) -> None:
        self.markers = mps_root / "compute-mode"
        self.nvml = nvml

    def set(self, gpu: Gpu, mode: str) -> None:
        """Write ``gpu``'s marker, then set its compute mode to ``mode`` unless it has it.

        Raises:
            OSError: the marker cannot be written.
            NvmlError: NVML refused to read or set the mode.
        """
        marker = self.markers / gpu.uuid
        private_dir(marker.parent)
        marker.write_text(mode + "\n")
        os.chmod(marker, 0o600)
        if self.nvml.compute_mode(gpu.uuid) != mode:
            self.nvml.set_compute_mode(gpu.uuid, mode)
            log.info("GPU compute mode set", gpu=gpu.uuid, gpu_index=gpu.index, compute_mode=mode)

    def restore(self, uuid: str) -> None:
        """Put GPU ``uuid`` back to DEFAULT and drop its marker; an NVML failure is logged and
        the marker kept, so :meth:`reset_unused` retries it."""
        try:
            if self.nvml.compute_mode(uuid) != "DEFAULT":
                self.nvml.set_compute_mode(uuid, "DEFAULT")
                log.info("GPU compute mode restored", gpu=uuid, compute_mode="DEFAULT")
            (self.markers / uuid).unlink(missing_ok=True)
        except NvmlError as exc:
            log.error("cannot restore GPU compute mode; will retry", gpu=uuid, error=str(exc))

    def reset_unused(self, used: Collection[str]) -> None:
        """:meth:`restore` every marked GPU whose UUID is not in ``used``."""
        if not self.markers.is_dir():
            return
        for marker in sorted(self.markers.iterdir()):
            if marker.name not in used:
                self.restore(marker.name)
