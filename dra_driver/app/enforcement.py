"""The node's enforcer: MPS with NVML on real GPUs, MPS with simulated NVML and the MPS
emulator on simulated ones, or the recording enforcer where a test asks for it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dra_driver.app.nodestate import NodeState
from dra_driver.enforce import (
    EnforcementReport,
    FractionEnforcer,
    MpsEnforcer,
    MpsOptions,
    NvmlFacade,
    PynvmlFacade,
    RecordingEnforcer,
    SimulatedNvml,
    daemon_pipe_dir,
)
from dra_driver.infra import SubprocessRunner
from dra_driver.model.vocabulary import ComputeMode
from dra_driver.observe import MpsUsageSource, UsageSource


def make_enforcer(
    mps: MpsOptions,
    report: EnforcementReport,
    state: NodeState,
    sim_root: Path | None,
    recording: bool = False,
) -> tuple[FractionEnforcer, UsageSource | None]:
    """The enforcer for this node and its usage source for accounting.

    The MPS enforcer: with NVML on real GPUs (``sim_root`` None); on simulated ones with
    simulated NVML under ``sim_root`` (:mod:`dra_driver.enforce.mps.simnvml`) and the MPS emulator
    as the control program. Simulated GPUs with ``recording`` (``--simulated-enforcer
    recording``) get the :class:`RecordingEnforcer` instead (no MPS at all; it creates the pipe
    directories its specs mount).
    """
    if sim_root is not None and recording:
        return RecordingEnforcer(tiers=report.tiers, options=mps, make_dirs=True), None
    nvml: NvmlFacade
    if sim_root is not None:
        pipes = [daemon_pipe_dir(mps.mps_root, mode) for mode in ComputeMode]
        nvml = SimulatedNvml(sim_root / "nvml", state.present_uuids, pipes)
    else:
        nvml = PynvmlFacade()
    options = replace(mps, dmem_backend=report.node.dmem_backend)
    enforcer = MpsEnforcer(report.tiers, nvml, SubprocessRunner(), options)
    return enforcer, MpsUsageSource(enforcer, nvml)
