"""Undo the soft-limit reservation a container leaves behind (dmem backend).

With the dmem backend the driver raises every ancestor cgroup's ``dmem.min`` by a leaf's soft
limit; when the runtime deletes the leaf directly (normal exit), the ancestors keep that
reservation (NVIDIA MPS docs, "MPS v3 Memory Partitioning"; ``docs/enforcement.md``,
"Soft-limit reservation drift"). NVIDIA's advice is to zero the soft limit before the cgroup
goes, which no OCI hook can do (see :mod:`dra_driver.enforce.rules.hooks`). What we do instead, at
Unprepare (the kubelet calls it after every container of the pod has stopped):

- for each container whose cgroup the consumer gate recorded: if its cgroup still exists, set
  soft 0 / hard max on it (covered);
- else if its parent (the pod cgroup) still exists and has dmem files: set the parent's soft
  limit to the sum of its live children's soft limits, if it is higher (covered; [INFERRED]
  that NVML then lowers the ancestors above by the same amount, as it raised them);
- else log a warning with the amount that may stay reserved (not covered).

The misc backend is flat (no ancestor bookkeeping), so records are just removed. Containers
created without the cgroup record (or whose gate could not write it) are not covered either.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from dra_driver.enforce.mps.nvmlcontrol import UNLIMITED, NvmlError, NvmlFacade

log = structlog.get_logger(__name__)


@dataclass
class JanitorReport:
    """What one release did: cgroups zeroed, parents repaired, leftovers not covered."""

    zeroed: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    uncovered: list[str] = field(default_factory=list)


class SoftLimitJanitor:
    """Reads the cgroup records and repairs soft-limit reservations at release.

    Args:
        record_root: host directory of the records (``<record_root>/<claim-uid>/<id>``).
        nvml: NVML facade (limits are set through NVML, never by writing ``dmem.*``).
        cgroup_root: the cgroup v2 mount (``/sys/fs/cgroup``).
        dmem_backend: whether the driver uses the dmem backend (``dmem.capacity`` exists).
    """

    def __init__(
        self,
        record_root: Path,
        nvml: NvmlFacade,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        dmem_backend: bool = True,
    ) -> None:
        self.record_root = record_root
        self.nvml = nvml
        self.cgroup_root = cgroup_root
        self.dmem_backend = dmem_backend

    def claim_dir(self, claim_uid: str) -> Path:
        """Where the consumer gate records the claim's containers' cgroups (host path)."""
        return self.record_root / claim_uid

    def containers(self, claim_uid: str) -> dict[str, Path]:
        """Recorded containers of the claim: container ID -> cgroup directory."""
        out: dict[str, Path] = {}
        d = self.claim_dir(claim_uid)
        if not d.is_dir():
            return out
        for f in sorted(d.iterdir()):
            try:
                rel = f.read_text().strip()
            except OSError:
                continue
            if rel.startswith("/") and ".." not in rel.split("/"):
                out[f.name] = self.cgroup_root / rel.lstrip("/")
        return out

    def release(self, claim_uid: str, gpu_uuids: Iterable[str], soft_bytes: int) -> JanitorReport:
        """Repair what the claim's containers left on the GPUs, then drop the records.

        Args:
            claim_uid: the claim.
            gpu_uuids: GPUs the claim's hook set limits on.
            soft_bytes: the soft limit the hook set (for the "not covered" warning).
        """
        report = JanitorReport()
        gpus = list(gpu_uuids)
        bound = log.bind(claim_uid=claim_uid)
        if self.dmem_backend and gpus:
            for cid, leaf in self.containers(claim_uid).items():
                self._repair(leaf, gpus, report)
                if str(leaf) in report.uncovered:
                    bound.warning(
                        "container cgroup and its parent are gone; ancestors may keep the "
                        "soft-limit reservation (dmem drift)",
                        container=cid,
                        cgroup=str(leaf),
                        reserved_mib=soft_bytes // (1024 * 1024),
                        gpus=gpus,
                    )
        shutil.rmtree(self.claim_dir(claim_uid), ignore_errors=True)
        if report.zeroed or report.repaired:
            bound.info(
                "soft-limit reservations undone", zeroed=report.zeroed, repaired=report.repaired
            )
        return report

    def _repair(self, leaf: Path, gpus: list[str], report: JanitorReport) -> None:
        if leaf.is_dir():
            for gpu in gpus:
                self._set(gpu, leaf, 0, UNLIMITED)
            report.zeroed.append(str(leaf))
            return
        parent = leaf.parent
        if parent == self.cgroup_root or not (parent / "dmem.min").exists():
            report.uncovered.append(str(leaf))
            return
        changed = False
        for gpu in gpus:
            try:
                current = self.nvml.cgroup_memory(gpu, str(parent))
                live = sum(
                    self.nvml.cgroup_memory(gpu, str(child)).soft_bytes
                    for child in sorted(parent.iterdir())
                    if child.is_dir() and (child / "dmem.min").exists()
                )
            except NvmlError as exc:
                log.warning(
                    "cannot read cgroup memory limits", cgroup=str(parent), gpu=gpu, error=str(exc)
                )
                continue
            if current.soft_bytes > live:
                self._set(gpu, parent, live, current.hard_bytes)
                changed = True
        if changed and str(parent) not in report.repaired:
            report.repaired.append(str(parent))

    def _set(self, gpu: str, cgroup: Path, soft: int, hard: int) -> None:
        try:
            self.nvml.set_cgroup_limits(gpu, str(cgroup), soft, hard)
        except NvmlError as exc:
            log.warning(
                "cannot reset cgroup memory limits", cgroup=str(cgroup), gpu=gpu, error=str(exc)
            )
