"""Tier detection: the pure decision, fact gathering on a fake root, simulated inventories."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from dra_driver.enforce.tiers import (
    GpuFacts,
    NodeFacts,
    decide_tier,
    detect_enforcement,
    gather_node_facts,
    probe_mps,
)
from dra_driver.gpus import Inventory, SimulatedGpuSource, SimulatedSpecError
from dra_driver.model.commands import Completed
from tests.support.fakes.mps_control import FakeMpsControl

HARD = GpuFacts(
    uuid="GPU-x",
    driver_version="615.71.09",
    cuda_version="13.4",
    cgroup_v2=True,
    mig_enabled=False,
    mps="v3",
    compute_capability="9.0",
    memory_limit_hook=True,
)


@pytest.mark.parametrize(
    ("change", "tier", "reason"),
    [
        ({}, "hard", None),
        ({"driver_version": "620.10"}, "hard", None),
        ({"cuda_version": "13.10"}, "hard", None),
        ({"driver_version": "580.95.05", "cuda_version": "13.0"}, "cooperative", "r615"),
        ({"cuda_version": "13.3"}, "cooperative", "13.4"),
        ({"driver_version": "garbage"}, "cooperative", "r615"),
        ({"cgroup_v2": False}, "cooperative", "cgroup v2"),
        ({"memory_limit_hook": False}, "cooperative", "nvidia-cdi-hook"),
        ({"mps": "v2"}, "none", "v2"),
        ({"mps": "absent"}, "none", "not found"),
        ({"mig_enabled": True}, "none", "MIG"),
        ({"mig_enabled": True, "mps": "v2"}, "none", "MIG"),
    ],
)
def test_decide_tier(change: dict[str, object], tier: str, reason: str | None) -> None:
    decision = decide_tier(replace(HARD, **change))  # type: ignore[arg-type]
    assert decision.tier == tier
    if reason is None:
        assert decision.reasons == ()
    else:
        assert any(reason in r for r in decision.reasons)


def test_decide_tier_rejects_unknown_mps() -> None:
    with pytest.raises(ValueError):
        decide_tier(replace(HARD, mps="v4"))


class ScriptedRunner:
    def __init__(self, completed: Completed) -> None:
        self.completed = completed
        self.argv: list[str] = []
        self.env: dict[str, str] = {}

    def run(self, argv, env=None, input=None, timeout=None):  # type: ignore[no-untyped-def]
        self.argv, self.env = list(argv), dict(env or {})
        return self.completed


def test_probe_mps_protocols() -> None:
    assert probe_mps(FakeMpsControl([])) == "v3"
    assert probe_mps(FakeMpsControl([], v2_only=True)) == "v2"
    assert probe_mps(FakeMpsControl([], missing=True)) == "absent"
    scripted = ScriptedRunner(Completed(1, "", "Modules: server namespace client"))
    assert probe_mps(scripted, "/opt/mps-control") == "v3"
    assert scripted.argv == ["/opt/mps-control", "-p", "3", "-h"]
    assert scripted.env["CUDA_MPS_PROTOCOL_VERSION"] == "3"
    assert not Path(scripted.env["CUDA_MPS_PIPE_DIRECTORY"]).exists()  # private, removed
    assert probe_mps(ScriptedRunner(Completed(126, "", "denied"))) == "absent"
    assert probe_mps(ScriptedRunner(Completed(0, "", ""))) == "absent"


def _host(tmp_path: Path, cgroup_v2: bool, dmem: bool, hook: bool) -> Path:
    cg = tmp_path / "sys/fs/cgroup"
    cg.mkdir(parents=True)
    if cgroup_v2:
        (cg / "cgroup.controllers").write_text("cpu memory pids dmem\n")
    if dmem:
        (cg / "dmem.capacity").write_text("nvidia/0000:19:00.0/vidmem 150754820096\n")
    if hook:
        (tmp_path / "usr/bin").mkdir(parents=True)
        (tmp_path / "usr/bin/nvidia-cdi-hook").write_text("")
    return tmp_path


def test_gather_node_facts_from_root(tmp_path: Path) -> None:
    root = _host(tmp_path / "a", cgroup_v2=True, dmem=True, hook=True)
    assert gather_node_facts(root, FakeMpsControl([])) == NodeFacts(True, True, "v3", True)
    root = _host(tmp_path / "b", cgroup_v2=False, dmem=False, hook=False)
    assert gather_node_facts(root, FakeMpsControl([], v2_only=True)) == NodeFacts(
        False, False, "v2", False
    )


def test_detect_on_real_node_facts(tmp_path: Path) -> None:
    inventory = SimulatedGpuSource("simulated:H200x1,A100-80GB-MIGx1").discover()
    root = _host(tmp_path, cgroup_v2=True, dmem=False, hook=True)
    report = detect_enforcement(inventory, simulated=False, root=root, runner=FakeMpsControl([]))
    h200, mig = inventory.gpus
    assert report.tiers == {h200.uuid: "hard", mig.uuid: "none"}
    no_hook = detect_enforcement(
        inventory, simulated=False, root=root, runner=FakeMpsControl([]), hook_path="/nowhere/hook"
    )
    assert no_hook.tiers[h200.uuid] == "cooperative"


@pytest.mark.parametrize(
    ("spec", "tier"),
    [
        ("simulated:H200x2", "hard"),
        ("simulated:H200x2@615.71.09", "hard"),
        ("simulated:H200x2@580.95.05", "cooperative"),
        ("simulated:A100-80GB-MIGx1", "none"),
    ],
)
def test_simulated_inventory_tiers(spec: str, tier: str) -> None:
    inventory = SimulatedGpuSource(spec).discover()
    with capture_logs() as logs:
        report = detect_enforcement(inventory, simulated=True)
    assert set(report.tiers.values()) == {tier}
    assert report.node.mps == "v3" and report.node.cgroup_v2
    assert {e["gpu"] for e in logs if e["event"] == "memory enforcement tier"} == {
        g.uuid for g in inventory.gpus
    }


def test_simulated_v100_runs_its_last_driver_branch() -> None:
    """CUDA 13.x after 13.0 and driver r615 do not exist for Volta: R580 is its last branch."""
    [v100] = SimulatedGpuSource("simulated:V100-32GBx1").discover().gpus
    assert v100.driver_version.split(".")[0] == "580"
    assert v100.cuda_driver_version == "13.0"
    assert set(detect_enforcement(Inventory((v100,)), simulated=True).tiers.values()) == {
        "cooperative"
    }
    # A node runs one driver: a V100 beside an H200 holds the whole node at R580.
    mixed = SimulatedGpuSource("simulated:H200x1,V100-32GBx1").discover().gpus
    assert {g.driver_version.split(".")[0] for g in mixed} == {"580"}


def test_simulated_v100_with_r615_is_refused() -> None:
    with pytest.raises(SimulatedSpecError, match=r"V100-32GB.*R580.*615\.71\.09"):
        SimulatedGpuSource("simulated:V100-32GBx1@615.71.09")


def test_pre_volta_gpu_gets_tier_none() -> None:
    decision = decide_tier(replace(HARD, compute_capability="6.0"))
    assert decision.tier == "none"
    assert any("compute capability 6.0 < 7.0" in r for r in decision.reasons)
    assert decide_tier(replace(HARD, compute_capability="7.0")).tier == "hard"
