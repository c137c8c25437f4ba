"""What each GPU can enforce: the ``memoryEnforcement`` tier, detected at plugin start-up.

Tiers (``docs/enforcement.md``, "Tiers"; sources listed there):

- ``hard``: MPS v3 plus the driver's per-container memory limits: driver r615+ / CUDA >= 13.4
  (NVIDIA MPS docs, "MPS v3 Memory Partitioning"), cgroup v2 mounted at ``/sys/fs/cgroup``,
  MIG off, the toolkit's ``nvidia-cdi-hook`` on the host (NVIDIA Container Toolkit,
  ``apply-cuda-memory-limits``), and an ``nvidia-cuda-mps-control`` whose ``-p 3 -h`` lists
  the ``namespace`` module (the check NVIDIA's Dynamo MPS guide gives).
- ``cooperative``: MPS v3 is there but the driver-enforced per-container limit is not (old
  driver/CUDA, no cgroup v2, no hook): only the namespace's pinned memory limit applies,
  which the MPS client runtime enforces and which a tenant can defeat (a bad
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` entry drops it; ``docs/enforcement.md``).
- ``none``: no usable MPS: the program is missing, only protocol v2 exists (this driver
  enforces through v3 namespaces; a v2 path would need one daemon per claim), MIG is on, or
  the GPU is older than Volta (compute capability < 7.0: pre-Volta MPS has no per-client
  memory limits; such GPUs are not offered at all, see :func:`dra_driver.publish.offer.offer`).
  Memory is not capped; never present it as capped.

:func:`decide_tier` is pure; :func:`gather_node_facts` reads the node through an injectable
filesystem root and :class:`~dra_driver.infra.runner.Runner`; :func:`detect_enforcement` ties them
together. Simulated inventories get :func:`simulated_node_facts`: cgroup v2, the hook and MPS
v3 are assumed present, so the tier follows the simulated driver version (``@580.95.05`` ->
``cooperative``, the default 615 -> ``hard``, a MIG profile -> ``none``; a V100 runs R580, its
last branch, so it is ``cooperative``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from dra_driver.enforce.mps.control import probe_mps
from dra_driver.enforce.rules.hooks import CTK_HOOK_PATH
from dra_driver.enforce.rules.names import CONTROL_BINARY
from dra_driver.gpus import Gpu, Inventory, pre_volta_reason
from dra_driver.infra.runner import Runner, SubprocessRunner
from dra_driver.model.vocabulary import Tier

log = structlog.get_logger(__name__)

"""Tier names, strongest first (the slice attribute values)."""
MPS_PROTOCOLS = ("v3", "v2", "absent")
"""What the MPS probe can find."""
HARD_MIN_DRIVER = (615,)
"""First driver branch with MPS v3 and per-container memory limits (r615)."""
HARD_MIN_CUDA = (13, 4)
"""First CUDA driver API version with per-container memory limits (CUDA 13.4)."""


@dataclass(frozen=True)
class NodeFacts:
    """Node-wide facts.

    Attributes:
        cgroup_v2: cgroup v2 is mounted at ``/sys/fs/cgroup`` (``cgroup.controllers`` exists).
        dmem_backend: ``/sys/fs/cgroup/dmem.capacity`` exists (dmem backend; else misc).
        mps: ``v3`` | ``v2`` | ``absent``.
        memory_limit_hook: the toolkit hook binary exists on the host.
    """

    cgroup_v2: bool
    dmem_backend: bool
    mps: str
    memory_limit_hook: bool


@dataclass(frozen=True)
class GpuFacts:
    """Everything the tier decision needs about one GPU.

    Attributes:
        uuid: NVML UUID.
        driver_version: e.g. ``615.71.09``.
        cuda_version: CUDA driver API version, e.g. ``13.4``.
        cgroup_v2: see :class:`NodeFacts`.
        mig_enabled: MIG mode on.
        mps: ``v3`` | ``v2`` | ``absent``.
        compute_capability: ``"<major>.<minor>"``, e.g. ``"9.0"``.
        memory_limit_hook: see :class:`NodeFacts`.
    """

    uuid: str
    driver_version: str
    cuda_version: str
    cgroup_v2: bool
    mig_enabled: bool
    mps: str
    compute_capability: str
    memory_limit_hook: bool = True


@dataclass(frozen=True)
class TierDecision:
    """A GPU's tier and why (reasons name what is missing for a stronger tier)."""

    tier: str
    reasons: tuple[str, ...] = ()


def _version(text: str) -> tuple[int, ...] | None:
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", text.strip()):
        return None
    return tuple(int(p) for p in text.strip().split("."))


def decide_tier(facts: GpuFacts) -> TierDecision:
    """Pure: the tier ``facts`` allow (see the module docstring for the rules)."""
    if facts.mps not in MPS_PROTOCOLS:
        raise ValueError(f"mps must be one of {MPS_PROTOCOLS}, not {facts.mps!r}")
    if facts.mig_enabled:
        return TierDecision(
            Tier.NONE, ("MIG is enabled (MPS fractions and memory limits need MIG off)",)
        )
    too_old = pre_volta_reason(facts.compute_capability)
    if too_old:
        return TierDecision(Tier.NONE, (too_old,))
    if facts.mps == "absent":
        return TierDecision(Tier.NONE, ("nvidia-cuda-mps-control not found",))
    if facts.mps == "v2":
        return TierDecision(
            Tier.NONE, ("only MPS protocol v2 (no namespaces; needs driver r615+)",)
        )
    missing = []
    driver = _version(facts.driver_version)
    if driver is None or driver[: len(HARD_MIN_DRIVER)] < HARD_MIN_DRIVER:
        missing.append(f"driver {facts.driver_version} < r615")
    cuda = _version(facts.cuda_version)
    if cuda is None or cuda[:2] < HARD_MIN_CUDA:
        missing.append(f"CUDA {facts.cuda_version} < 13.4")
    if not facts.cgroup_v2:
        missing.append("no cgroup v2 at /sys/fs/cgroup")
    if not facts.memory_limit_hook:
        missing.append("nvidia-cdi-hook (apply-cuda-memory-limits) not found on the host")
    if missing:
        return TierDecision(Tier.COOPERATIVE, tuple(missing))
    return TierDecision(Tier.HARD)


def gather_node_facts(
    root: str | Path = "/",
    runner: Runner | None = None,
    control_binary: str = CONTROL_BINARY,
    hook_path: str = CTK_HOOK_PATH,
) -> NodeFacts:
    """Read the node-wide facts.

    Args:
        root: where the host filesystem is visible (``/``, or e.g. ``/host`` in a container);
            ``sys/fs/cgroup`` and ``hook_path`` are looked up under it.
        runner: runs the MPS probe (default: :class:`SubprocessRunner`).
        control_binary: the MPS control program as the plugin runs it.
        hook_path: host path of ``nvidia-cdi-hook``.
    """
    base = Path(root)
    cgroup = base / "sys/fs/cgroup"
    return NodeFacts(
        cgroup_v2=(cgroup / "cgroup.controllers").is_file(),
        dmem_backend=(cgroup / "dmem.capacity").is_file(),
        mps=probe_mps(runner or SubprocessRunner(), control_binary),
        memory_limit_hook=(base / hook_path.lstrip("/")).is_file(),
    )


def simulated_node_facts() -> NodeFacts:
    """Facts assumed for a simulated inventory: cgroup v2 (misc backend), MPS v3, the hook."""
    return NodeFacts(cgroup_v2=True, dmem_backend=False, mps="v3", memory_limit_hook=True)


def gpu_facts(gpu: Gpu, node: NodeFacts) -> GpuFacts:
    """Combine a GPU record with the node facts."""
    return GpuFacts(
        uuid=gpu.uuid,
        driver_version=gpu.driver_version,
        cuda_version=gpu.cuda_driver_version,
        cgroup_v2=node.cgroup_v2,
        mig_enabled=gpu.mig_enabled,
        mps=node.mps,
        compute_capability=gpu.compute_capability,
        memory_limit_hook=node.memory_limit_hook,
    )


@dataclass(frozen=True)
class EnforcementReport:
    """The node facts and each GPU's decision."""

    node: NodeFacts
    decisions: Mapping[str, TierDecision]

    @property
    def tiers(self) -> dict[str, str]:
        """GPU UUID -> tier (what the slice builder publishes as ``memoryEnforcement``)."""
        return {uuid: d.tier for uuid, d in self.decisions.items()}


def detect_enforcement(
    inventory: Inventory,
    *,
    simulated: bool,
    root: str | Path = "/",
    runner: Runner | None = None,
    control_binary: str = CONTROL_BINARY,
    hook_path: str = CTK_HOOK_PATH,
) -> EnforcementReport:
    """Decide every GPU's tier and log each decision (GPU, tier, reasons).

    Args:
        inventory: the node's GPUs.
        simulated: the inventory is simulated (use :func:`simulated_node_facts`).
        root, runner, control_binary, hook_path: see :func:`gather_node_facts`.
    """
    node = (
        simulated_node_facts()
        if simulated
        else gather_node_facts(root, runner, control_binary, hook_path)
    )
    decisions = {}
    for gpu in inventory.gpus:
        decision = decide_tier(gpu_facts(gpu, node))
        decisions[gpu.uuid] = decision
        log.info(
            "memory enforcement tier",
            gpu=gpu.uuid,
            gpu_index=gpu.index,
            tier=decision.tier,
            reasons=list(decision.reasons),
            simulated=simulated,
        )
    return EnforcementReport(node=node, decisions=decisions)
