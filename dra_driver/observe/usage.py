"""The usage source for :mod:`dra_driver.observe.accounting` on real nodes (MPS + NVML).

- clients: ``client list --server=<s>`` rows whose namespace is the claim's (MPS v3 Interface), by
  PID; a multi-GPU claim's clients (on its own server ``m_<uid>``) count under each of its GPUs;
- used memory, ``hard`` tier: the sum of ``currentUsed`` from ``nvmlDeviceGetMemoryLimits_v1``
  over the claim's recorded container cgroups that still exist (NVIDIA MPS docs, "MPS v3
  Memory Partitioning");
- used memory otherwise (or when no cgroup is recorded): the sum of ``usedGpuMemory`` of the
  claim's client PIDs in ``nvmlDeviceGetMPSComputeRunningProcesses_v3`` ([INFERRED] that it
  reports per-client memory under MPS; verify on hardware). No clients -> 0 bytes. For a
  multi-GPU claim a client missing from one GPU's list uses none of that GPU.
- SM utilization: the sum over the claim's client PIDs of their mean ``smUtil`` since the last
  sample (``nvmlDeviceGetProcessUtilization``, percent of the whole GPU; a PID without samples
  used none); unknown when NVML fails ([INFERRED] that NVML attributes utilization to MPS
  client PIDs; ``hack/gpu-check`` verifies it on a GPU node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dra_driver.enforce.enforcer import MpsEnforcer
from dra_driver.enforce.mps.nvmlcontrol import NvmlError, NvmlFacade
from dra_driver.infra import budget
from dra_driver.infra.budget import SCRAPE_BUDGET_S, Budget
from dra_driver.model.plans import ClaimPlan
from dra_driver.model.vocabulary import Tier
from dra_driver.observe.accounting import FractionUsage


class MpsUsageSource:
    """:class:`~dra_driver.observe.accounting.UsageSource` backed by the enforcer's MPS daemons and
    NVML.

    Args:
        enforcer: the node's MPS enforcer (targets, clients, cgroup records).
        nvml: NVML facade.
    """

    def __init__(self, enforcer: MpsEnforcer, nvml: NvmlFacade) -> None:
        self.enforcer = enforcer
        self.nvml = nvml

    def snapshot(self, plans: Sequence[ClaimPlan]) -> Mapping[tuple[str, str], FractionUsage]:
        """Usage of every applied claim in ``plans``; raises when MPS cannot be asked within
        :data:`~dra_driver.infra.budget.SCRAPE_BUDGET_S` (it holds the enforcer meanwhile)."""
        uids = {p.claim.uid for p in plans}
        with budget.within(Budget.of(SCRAPE_BUDGET_S)):
            clients = self.enforcer.clients()
        procs: dict[str, dict[int, int | None]] = {}
        sm: dict[str, dict[int, float] | None] = {}
        out: dict[tuple[str, str], FractionUsage] = {}
        for t in self.enforcer.targets():
            key = (t.claim.uid, t.gpu.uuid)
            if t.claim.uid not in uids or not t.uses_mps:
                continue
            pids = sorted({c.pid for c in clients.get(key, [])})
            used: int | None = None
            if t.tier == Tier.HARD:
                used = self._cgroup_used(t.claim.uid, t.gpu.uuid)
            if used is None:
                if t.gpu.uuid not in procs:
                    try:
                        procs[t.gpu.uuid] = {
                            p.pid: p.used_bytes for p in self.nvml.mps_processes(t.gpu.uuid)
                        }
                    except NvmlError:
                        procs[t.gpu.uuid] = {}
                # A multi-GPU claim's client need not use every GPU of its server: absent
                # from this GPU's list means none here; on one GPU it means "unknown".
                absent = 0 if t.dedicated else None
                known = [procs[t.gpu.uuid].get(pid, absent) for pid in pids]
                if all(v is not None for v in known):
                    used = sum(v for v in known if v is not None)
            if t.gpu.uuid not in sm:
                sm[t.gpu.uuid] = self._sm(t.gpu.uuid)
            per_pid = sm[t.gpu.uuid]
            sm_percent = None if per_pid is None else sum(per_pid.get(pid, 0.0) for pid in pids)
            out[key] = FractionUsage(used_bytes=used, clients=len(pids), sm_percent=sm_percent)
        return out

    def _sm(self, gpu_uuid: str) -> dict[int, float] | None:
        try:
            return self.nvml.process_sm_utilization(gpu_uuid)
        except NvmlError:
            return None

    def _cgroup_used(self, claim_uid: str, gpu_uuid: str) -> int | None:
        cgroups = [p for p in self.enforcer.janitor.containers(claim_uid).values() if p.is_dir()]
        if not cgroups:
            return None
        try:
            return sum(self.nvml.cgroup_memory(gpu_uuid, str(p)).used_bytes for p in cgroups)
        except NvmlError:
            return None
