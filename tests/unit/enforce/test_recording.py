"""The simulated enforcer hands out the edits the real MPS enforcer would, and runs nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dra_driver.enforce import MpsError, RecordingEnforcer
from dra_driver.enforce.rules.edits import PIPE_MOUNT_OPTIONS
from dra_driver.model.cdi import Mount
from dra_driver.model.plans import ClaimPlan
from tests.support.fakes.plans import GIB, H200_MIB, Node, device, plan

UID_A = "0a000000-0000-4000-8000-00000000000a"
UID_B = "0b000000-0000-4000-8000-00000000000b"
HALF = H200_MIB // 2 * 1024 * 1024

Make = Callable[[Node], ClaimPlan]

PLANS: dict[str, Make] = {
    "time-slicing quarter": lambda n: plan(device(n.gpus[0], 20 * GIB, 30 * GIB), uid=UID_A),
    "sm-sharing with threads": lambda n: plan(
        device(n.gpus[1], 8 * GIB, mode="sm-sharing", threads=30), uid=UID_A
    ),
    "sm-sharing default threads": lambda n: plan(
        device(n.gpus[1], 8 * GIB, mode="sm-sharing"), uid=UID_A
    ),
    "two devices on one GPU": lambda n: plan(
        device(n.gpus[0], 10 * GIB, 20 * GIB, mode="sm-sharing", threads=30, name="x"),
        device(n.gpus[0], 5 * GIB, mode="sm-sharing", threads=40, name="y", share_id="s1"),
        uid=UID_A,
    ),
    "40Gi on 4 GPUs, sm-sharing": lambda n: plan(
        *(device(g, 40 * GIB, mode="sm-sharing", name=f"d{g.index}") for g in n.gpus),
        uid=UID_A,
    ),
    "half a card on 2 GPUs": lambda n: plan(
        *(device(g, HALF, name=f"d{g.index}") for g in n.gpus[:2]), uid=UID_A
    ),
}


@pytest.mark.parametrize("make", list(PLANS.values()), ids=list(PLANS))
@pytest.mark.parametrize("record_cgroups", [True, False])
def test_edits_equal_the_real_enforcers_on_a_hard_node(
    tmp_path: Path, make: Make, record_cgroups: bool
) -> None:
    node = Node(tmp_path, count=4)
    if not record_cgroups:
        node.options = type(node.options)(**{**node.options.__dict__, "record_cgroups": False})
        node.enforcer = node.new_enforcer()
    p = make(node)
    real = node.enforcer.apply(p)
    recording = RecordingEnforcer(options=node.options)
    simulated = recording.apply(p)
    assert simulated == real
    assert recording.applied == {UID_A: p}
    assert recording.calls == [("apply", UID_A)]
    assert all(e.mounts and (e.hooks or not record_cgroups) for e in simulated.values())


@pytest.mark.parametrize("tier", ["cooperative", "none"])
def test_edits_equal_for_other_tiers(tmp_path: Path, tier: str) -> None:
    node = Node(tmp_path, tiers={0: tier, 1: tier})
    p = plan(device(node.gpus[0], 6 * GIB, 12 * GIB), uid=UID_A)
    assert RecordingEnforcer(tiers=node.tiers, options=node.options).apply(p) == (
        node.enforcer.apply(p)
    )


def test_default_shape_on_a_simulated_node() -> None:
    from tests.support.fakes.plans import gpu

    g0, g1 = gpu(0), gpu(1)
    edits = RecordingEnforcer().apply(
        plan(device(g0, GIB, name="a"), device(g1, GIB, name="b"), uid=UID_A)
    )
    server = "m_" + UID_A.replace("-", "_")
    pipe = f"/run/gpu-fraction/mps/time-slicing/pipe/{server}/claim"
    assert (
        edits["a"].mounts
        == edits["b"].mounts
        == (Mount(pipe, "/tmp/nvidia-mps", PIPE_MOUNT_OPTIONS),)
    )
    assert edits["a"].hooks[0].args[-1] == g0.uuid
    assert edits["b"].hooks[0].args[-1] == g1.uuid
    assert edits["a"].hooks[1].args[-1] == f"/run/gpu-fraction/cgroups/{UID_A}"
    assert "GPU_FRACTION_MEMORY_ENFORCEMENT=hard" in edits["a"].env


def test_refuses_what_the_real_enforcer_refuses_and_records_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g0, g1 = node.gpus
    mixed = plan(device(g0, 40 * GIB), device(g1, 20 * GIB, name="b"), uid=UID_A)
    recording = RecordingEnforcer(options=node.options)
    with pytest.raises(MpsError, match="different memory limits") as simulated:
        recording.apply(mixed)
    with pytest.raises(MpsError) as real:
        node.enforcer.apply(mixed)
    assert str(simulated.value) == str(real.value)
    assert recording.applied == {}
    assert recording.calls == [("apply", UID_A)]


def test_mode_conflict_across_claims(tmp_path: Path) -> None:
    node = Node(tmp_path)
    recording = RecordingEnforcer(options=node.options)
    recording.apply(plan(device(node.gpus[0], GIB), uid=UID_A))
    recording.apply(plan(device(node.gpus[0], GIB), uid=UID_A))  # re-apply: no conflict
    with pytest.raises(MpsError, match="serves time-slicing claims"):
        recording.apply(plan(device(node.gpus[0], GIB, mode="sm-sharing"), uid=UID_B))
    recording.release(UID_A)
    recording.apply(plan(device(node.gpus[0], GIB, mode="sm-sharing"), uid=UID_B))
    assert set(recording.applied) == {UID_B}


def test_fail_for_release_and_restore_are_recorded() -> None:
    from tests.support.fakes.plans import gpu

    recording = RecordingEnforcer(fail_for={UID_B})
    a = plan(device(gpu(0), GIB), uid=UID_A)
    with pytest.raises(MpsError, match="simulated MPS failure"):
        recording.apply(plan(device(gpu(0), GIB), uid=UID_B))
    recording.restore([a])
    recording.release(UID_A)
    recording.release(UID_A)
    assert recording.calls == [
        ("apply", UID_B),
        ("restore", "1"),
        ("release", UID_A),
        ("release", UID_A),
    ]
    assert recording.applied == {}
