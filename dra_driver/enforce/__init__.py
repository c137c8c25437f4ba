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

from dra_driver.enforce.enforcer import GpuHealth, MpsEnforcer
from dra_driver.enforce.mps.nvmlcontrol import NvmlError, NvmlFacade, PynvmlFacade
from dra_driver.enforce.recording import RecordingEnforcer
from dra_driver.enforce.rules.base import FractionEnforcer, MpsError
from dra_driver.enforce.rules.targets import FractionTarget, MpsOptions

__all__ = [
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
]
