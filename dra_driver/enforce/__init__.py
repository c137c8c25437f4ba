"""enforce: a claim's fraction held on the node (MPS memory ceilings and compute mode, the
tier of each GPU), behind one interface. Its folders: ``rules/`` (pure decisions), ``mps/``
(the MPS client: control daemons, servers, namespaces, NVML) and ``mpsservice/`` (the MPS node
service, a program of its own, and the plugin's handle on its daemons).
May import: model, infra, gpus, enforce.rules, enforce.mps, enforce.mpsservice.

The plugin calls a :class:`FractionEnforcer` during Prepare/Unprepare. Implementations:
:class:`RecordingEnforcer` (simulated GPUs: records what it was asked and returns the CDI
edits a real node would get, from the same pure functions) and :class:`MpsEnforcer` (real GPUs:
MPS v3 namespaces plus the driver's per-container memory limits on ``hard`` GPUs; see
``docs/enforcement.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dra_driver.faces import lazy_face

if TYPE_CHECKING:
    from dra_driver.enforce.enforcer import MpsEnforcer
    from dra_driver.enforce.mps.nvmlcontrol import UNLIMITED, NvmlError, NvmlFacade, PynvmlFacade
    from dra_driver.enforce.mps.simnvml import SimulatedNvml
    from dra_driver.enforce.mpsservice.readiness import state_path
    from dra_driver.enforce.mpsservice.service import ServiceOptions, run_service
    from dra_driver.enforce.recording import RecordingEnforcer
    from dra_driver.enforce.rules.base import FractionEnforcer, GpuHealth, MpsError
    from dra_driver.enforce.rules.hooks import consumer_gate_hook
    from dra_driver.enforce.rules.names import (
        DEDICATED_NAMESPACE,
        daemon_pipe_dir,
        dedicated_server_name,
        namespace_name,
        server_name,
    )
    from dra_driver.enforce.rules.targets import FractionTarget, MpsOptions
    from dra_driver.enforce.tiers import EnforcementReport, detect_enforcement

__all__ = [
    "DEDICATED_NAMESPACE",
    "EnforcementReport",
    "FractionEnforcer",
    "FractionTarget",
    "GpuHealth",
    "MpsEnforcer",
    "MpsError",
    "MpsOptions",
    "NvmlError",
    "NvmlFacade",
    "PynvmlFacade",
    "RecordingEnforcer",
    "ServiceOptions",
    "SimulatedNvml",
    "UNLIMITED",
    "consumer_gate_hook",
    "daemon_pipe_dir",
    "dedicated_server_name",
    "detect_enforcement",
    "namespace_name",
    "run_service",
    "server_name",
    "state_path",
]

__getattr__ = lazy_face(__name__, __file__)
