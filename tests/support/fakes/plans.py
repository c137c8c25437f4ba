"""Builders of GPUs and claim plans for enforcement tests."""

from __future__ import annotations

import uuid as uuidlib
from pathlib import Path

from dra_driver.enforce.enforcer import MpsEnforcer, MpsOptions
from dra_driver.gpus import MIB, Gpu
from dra_driver.model.plans import ClaimPlan, ClaimRef, DevicePlan
from tests.support.fakes.mps_control import FakeMpsControl, FakeNvml

GIB = 1024 * MIB
H200_MIB = 143771


def gpu(
    index: int = 0, memory_mib: int = H200_MIB, driver: str = "615.71.09", mig: bool = False
) -> Gpu:
    return Gpu(
        index=index,
        minor=index,
        uuid=f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'test-gpu/{index}')}",
        name="NVIDIA H200",
        memory_bytes=memory_mib * MIB,
        sm_count=132,
        compute_capability="9.0",
        architecture="hopper",
        pci_bus_id=f"0000:{0x18 + index:02x}:00.0",
        mig_enabled=mig,
        driver_version=driver,
        cuda_driver_version="13.4" if driver.startswith("6") else "13.0",
    )


def device(
    g: Gpu,
    request: int,
    limit: int | None = None,
    mode: str = "time-slicing",
    threads: int | None = None,
    name: str | None = None,
    share_id: str | None = None,
) -> DevicePlan:
    return DevicePlan(
        request_names=("gpu",),
        pool="node-a",
        device=name or f"gpu-{g.index}-quarter-0",
        share_id=share_id,
        gpu=g,
        compute_mode=mode,
        memory_request_bytes=request,
        memory_limit_bytes=limit if limit is not None else request,
        active_thread_percentage=threads,
    )


def plan(*devices: DevicePlan, uid: str | None = None, name: str = "train") -> ClaimPlan:
    uid = uid or str(uuidlib.uuid4())
    return ClaimPlan(claim=ClaimRef("team-a", name, uid), devices=tuple(devices))


class Node:
    """A fake node: GPUs, fake NVML, fake MPS program, and an enforcer over them."""

    def __init__(
        self,
        tmp: Path,
        tiers: dict[int, str] | None = None,
        count: int = 2,
        mps_visible: list[int] | None = None,
        **fake_kwargs: object,
    ) -> None:
        self.gpus = [gpu(i) for i in range(count)]
        self.tmp = tmp
        visible = [
            self.gpus[i].uuid for i in (range(count) if mps_visible is None else mps_visible)
        ]
        self.mps = FakeMpsControl(visible, **fake_kwargs)  # type: ignore[arg-type]
        self.nvml = FakeNvml({g.uuid: g.memory_bytes for g in self.gpus})
        self.tiers = {g.uuid: (tiers or {}).get(g.index, "hard") for g in self.gpus}
        self.options = MpsOptions(
            root=str(tmp / "run"),
            cgroup_root=str(tmp / "cgroup"),
            server_checks=3,
            server_check_interval=0.0,
        )
        self.sleeps: list[float] = []
        self.enforcer = self.new_enforcer()

    def new_enforcer(self) -> MpsEnforcer:
        return MpsEnforcer(self.tiers, self.nvml, self.mps, self.options, sleep=self.sleeps.append)

    def pipe(self, mode: str) -> Path:
        return self.tmp / "run" / "mps" / mode / "pipe"
