"""gpus: the node's GPU inventory from two sources (NVML and simulated) and a simulated
node's device nodes and hook.
May import: model, infra."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dra_driver.faces import lazy_face
from dra_driver.gpus.simulated import SimulatedGpuSource, SimulatedSpecError
from dra_driver.model.gpu import (
    MIB,
    Gpu,
    GpuSource,
    GpuSourceError,
    Inventory,
    SkippedGpu,
    pre_volta_reason,
)

if TYPE_CHECKING:
    from dra_driver.gpus import simnode
    from dra_driver.gpus.nvml import NvmlGpuSource


def open_source(
    spec: str,
    seed: str = "sim",
    lost_file: Path | None = None,
    unloaded_file: Path | None = None,
    reloaded_file: Path | None = None,
) -> GpuSource:
    """Return the GPU source for a ``--gpus`` value: ``nvml`` or ``simulated:<...>``.

    ``lost_file`` (simulated only): a file listing GPU indexes to report as gone;
    ``unloaded_file`` (simulated only): while it exists, discovery fails as NVML does without
    the NVIDIA driver; ``reloaded_file`` (simulated only): an integer that the GPUs' device
    minors start from (a reloaded driver's numbering).

    Raises:
        SimulatedSpecError: for an invalid ``simulated:`` spec or an unknown source name.
    """
    if spec == "nvml":
        from dra_driver.gpus.nvml import NvmlGpuSource

        return NvmlGpuSource()
    if spec.startswith("simulated:"):
        return SimulatedGpuSource(
            spec,
            seed=seed,
            lost_file=lost_file,
            unloaded_file=unloaded_file,
            reloaded_file=reloaded_file,
        )
    raise SimulatedSpecError(f"unknown GPU source {spec!r}: use 'nvml' or 'simulated:H200x8'")


__all__ = [
    "simnode",
    "Gpu",
    "GpuSource",
    "GpuSourceError",
    "Inventory",
    "MIB",
    "NvmlGpuSource",
    "SimulatedGpuSource",
    "SimulatedSpecError",
    "SkippedGpu",
    "open_source",
    "pre_volta_reason",
]

__getattr__ = lazy_face(__name__, __file__)
