"""Multi-GPU claims on MPS nodes: one server per claim (``m_<uid>``) with all its GPUs as
allowed devices, one namespace (``claim``) in it; against the fake control program and fake NVML."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from dra_driver.enforce import MpsError
from dra_driver.enforce.mps.nvmlcontrol import MpsProcess
from dra_driver.enforce.rules.edits import PIPE_MOUNT_OPTIONS
from dra_driver.enforce.rules.names import claim_uid_of_server, dedicated_server_name
from dra_driver.model.cdi import Hook, Mount
from dra_driver.model.plans import ClaimPlan
from dra_driver.observe.usage import MpsUsageSource
from tests.support.fakes.plans import GIB, H200_MIB, Node, device, plan

UID_A = "0a000000-0000-4000-8000-00000000000a"
UID_B = "0b000000-0000-4000-8000-00000000000b"
UID_C = "0c000000-0000-4000-8000-00000000000c"
CSV = "--format=csv,noheader"
SRV_A = "m_" + UID_A.replace("-", "_")
NS_A = "c_" + UID_A.replace("-", "_")
CLAIM_NS = "claim"
"""The namespace on a claim's own server (short: its socket path must fit 107 bytes)."""
HALF = H200_MIB // 2 * 1024 * 1024


def ns(uid: str) -> str:
    return "c_" + uid.replace("-", "_")


def spread(node: Node, size: int, uid: str = UID_A, count: int | None = None, **kw) -> ClaimPlan:  # type: ignore[no-untyped-def]
    """One device of ``size`` on each of the first ``count`` GPUs (a distinctAttribute claim)."""
    gpus = node.gpus[: count or len(node.gpus)]
    return plan(*(device(g, size, name=f"gpu-{g.index}-part-0", **kw) for g in gpus), uid=uid)


def servers(node: Node, mode: str) -> dict[str, tuple[str, ...]]:
    d = node.mps.daemon(node.pipe(mode))
    return {s.name: s.allowed for s in d.servers.values()}


def limits(node: Node, mode: str, server: str) -> dict[str, tuple[int | None, int | None]]:
    """The limits of the claims' namespaces on ``server`` (its ``default`` namespace aside:
    :func:`test_a_new_server_has_its_side_doors_closed`)."""
    d = node.mps.daemon(node.pipe(mode))
    spaces = d.servers[server].namespaces.values()
    return {n.name: (n.pinned, n.threads) for n in spaces if n.name != "default"}


def test_names_of_claim_servers() -> None:
    assert dedicated_server_name(UID_A) == SRV_A
    assert len(SRV_A) == 38
    assert claim_uid_of_server(SRV_A) == UID_A
    assert claim_uid_of_server("gpu_0") is None
    assert claim_uid_of_server(NS_A) is None


def test_four_gpu_sm_sharing_claim_gets_its_own_server(tmp_path: Path) -> None:
    node = Node(tmp_path, count=4)
    p = spread(node, 40 * GIB, mode="sm-sharing", threads=50)
    edits = node.enforcer.apply(p)
    config = tmp_path / "run/mps/sm-sharing/mps.toml"
    uuids = ",".join(g.uuid for g in node.gpus)
    assert node.mps.commands() == [
        f"server list {CSV}",
        f"-p 3 -m -d -a {config}",
        f"server list {CSV}",
        f"server create {SRV_A} --uid=0 --allowed-devices={uuids}",
        f"server list {CSV}",
        f"server set {SRV_A} --pinned-memory-limit=1M --active-thread-percentage=1",
        f"namespace list --server={SRV_A} {CSV}",
        f"namespace create {CLAIM_NS} --server={SRV_A}",
        f"namespace set {CLAIM_NS} --server={SRV_A} --pinned-memory-limit=40960M "
        "--active-thread-percentage=50",
        f"namespace list {CLAIM_NS} --server={SRV_A} {CSV}",
    ]
    assert servers(node, "sm-sharing") == {SRV_A: tuple(g.uuid for g in node.gpus)}
    assert limits(node, "sm-sharing", SRV_A) == {CLAIM_NS: (40 * GIB, 50)}
    assert {node.nvml.gpus[g.uuid].compute_mode for g in node.gpus} == {"EXCLUSIVE_PROCESS"}
    pipe = node.pipe("sm-sharing") / SRV_A / CLAIM_NS
    assert pipe.is_dir()
    assert set(edits) == {f"gpu-{i}-part-0" for i in range(4)}
    for g in node.gpus:
        e = edits[f"gpu-{g.index}-part-0"]
        assert e.env == (
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
            "GPU_FRACTION_COMPUTE_MODE=sm-sharing",
            "GPU_FRACTION_MEMORY_ENFORCEMENT=hard",
            "NVIDIA_GPU_MEMORY_REQUEST=40960",
            "NVIDIA_GPU_MEMORY_LIMIT=40960",
        )
        assert e.mounts == (Mount(str(pipe), "/tmp/nvidia-mps", PIPE_MOUNT_OPTIONS),)
        # one memory-limit hook per GPU: each device carries its own GPU's --gpu-id
        assert e.hooks[0] == Hook(
            "createRuntime",
            "/usr/bin/nvidia-cdi-hook",
            (
                "nvidia-cdi-hook",
                "apply-cuda-memory-limits",
                "--driver-root",
                "/",
                "--gpu-id",
                g.uuid,
            ),
        )
        assert e.hooks[1].args[-1] == str(tmp_path / "run/cgroups" / UID_A)
    assert [t.server for t in node.enforcer.targets()] == [SRV_A] * 4


def test_two_gpu_time_slicing_half_cards(tmp_path: Path) -> None:
    node = Node(tmp_path, count=3)
    p = spread(node, HALF, count=2)
    edits = node.enforcer.apply(p)
    g0, g1, g2 = node.gpus
    config = tmp_path / "run/mps/time-slicing/mps.toml"
    half_mib = H200_MIB // 2
    assert node.mps.commands() == [
        f"server list {CSV}",
        f"-p 3 -m -d -a {config}",
        f"server list {CSV}",
        f"server create {SRV_A} --uid=0 --allowed-devices={g0.uuid},{g1.uuid}",
        f"server list {CSV}",
        f"server set {SRV_A} --pinned-memory-limit=1M --active-thread-percentage=1",
        f"namespace list --server={SRV_A} {CSV}",
        f"namespace create {CLAIM_NS} --server={SRV_A}",
        f"namespace set {CLAIM_NS} --server={SRV_A} --pinned-memory-limit={half_mib}M "
        "--active-thread-percentage=100",
        f"namespace list {CLAIM_NS} --server={SRV_A} {CSV}",
    ]
    assert limits(node, "time-slicing", SRV_A) == {CLAIM_NS: (half_mib * 1024 * 1024, 100)}
    assert node.nvml.gpus[g2.uuid].compute_mode == "DEFAULT"
    e0, e1 = edits["gpu-0-part-0"], edits["gpu-1-part-0"]
    assert e0.env == e1.env and e0.mounts == e1.mounts
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in " ".join(e0.env)
    assert f"NVIDIA_GPU_MEMORY_LIMIT={half_mib}" in e0.env
    assert (e0.hooks[0].args[-1], e1.hooks[0].args[-1]) == (g0.uuid, g1.uuid)


def test_claim_server_lives_next_to_the_shared_server(tmp_path: Path) -> None:
    node = Node(tmp_path, count=2)
    g0, g1 = node.gpus
    node.enforcer.apply(plan(device(g0, 8 * GIB), uid=UID_B))
    node.enforcer.apply(spread(node, 16 * GIB))
    assert servers(node, "time-slicing") == {"gpu_0": (g0.uuid,), SRV_A: (g0.uuid, g1.uuid)}
    assert limits(node, "time-slicing", "gpu_0") == {ns(UID_B): (8 * GIB, 100)}
    assert limits(node, "time-slicing", SRV_A) == {CLAIM_NS: (16 * GIB, 100)}
    node.enforcer.release(UID_A)
    assert servers(node, "time-slicing") == {"gpu_0": (g0.uuid,)}
    assert node.nvml.gpus[g0.uuid].compute_mode == "EXCLUSIVE_PROCESS"
    assert node.nvml.gpus[g1.uuid].compute_mode == "DEFAULT"
    # the other way round: the shared server goes with its last claim, the claim server stays
    node.enforcer.apply(spread(node, 16 * GIB))
    node.enforcer.release(UID_B)
    assert servers(node, "time-slicing") == {SRV_A: (g0.uuid, g1.uuid)}
    assert node.nvml.gpus[g0.uuid].compute_mode == "EXCLUSIVE_PROCESS"


def test_release_terminates_clients_then_force_deletes_the_server(tmp_path: Path) -> None:
    node = Node(tmp_path, count=4)
    node.enforcer.apply(spread(node, 40 * GIB, mode="sm-sharing"))
    pipe = node.pipe("sm-sharing")
    pids = [node.mps.add_client(pipe, SRV_A, CLAIM_NS) for _ in range(2)]
    records = tmp_path / "run/cgroups" / UID_A
    records.mkdir(parents=True)
    (records / "ctr1").write_text("/gone/leaf\n")
    before = len(node.mps.calls)
    node.enforcer.release(UID_A)
    cmds = node.mps.commands()[before:]
    assert cmds[:5] == [
        f"server list {CSV}",
        f"client list --server={SRV_A} {CSV}",
        f"client terminate {pids[0]}",
        f"client terminate {pids[1]}",
        f"server delete {SRV_A} --force",
    ]
    assert not any(c.startswith("namespace delete") for c in cmds)
    assert cmds[-1] == "-q"
    assert node.mps.daemons == {}
    assert {node.nvml.gpus[g.uuid].compute_mode for g in node.gpus} == {"DEFAULT"}
    assert not pipe.exists()
    assert not records.exists()
    assert node.enforcer.targets() == []
    node.enforcer.release(UID_A)  # idempotent


def test_failed_server_delete_keeps_the_claim_for_retry(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.enforcer.apply(spread(node, GIB))
    node.mps.fail("server", "delete", stderr="busy")
    with pytest.raises(MpsError, match=f"MPS server {SRV_A}: .*busy"):
        node.enforcer.release(UID_A)
    assert SRV_A in servers(node, "time-slicing")
    node.enforcer.release(UID_A)
    assert node.mps.daemons == {}


def test_daemon_crash_recreates_the_claim_server(tmp_path: Path) -> None:
    node = Node(tmp_path, count=4)
    p = spread(node, 40 * GIB, mode="sm-sharing", threads=25)
    node.enforcer.apply(p)
    node.enforcer.apply(plan(device(node.gpus[0], 8 * GIB, mode="sm-sharing"), uid=UID_B))
    node.mps.crash(node.pipe("sm-sharing"))
    with capture_logs() as logs:
        health = node.enforcer.check_health()
    assert node.enforcer.daemon_restarts == 1
    assert {u: h.healthy for u, h in health.items()} == {g.uuid: True for g in node.gpus}
    assert servers(node, "sm-sharing") == {
        "gpu_0": (node.gpus[0].uuid,),
        SRV_A: tuple(g.uuid for g in node.gpus),
    }
    assert limits(node, "sm-sharing", SRV_A) == {CLAIM_NS: (40 * GIB, 25)}
    assert limits(node, "sm-sharing", "gpu_0") == {ns(UID_B): (8 * GIB, 100)}
    # the restarted daemon made them from its -a file (the claims' part): no command did
    assert sum(c.startswith(f"server create {SRV_A}") for c in node.mps.commands()) == 1
    assert sum(c.startswith(f"namespace create {CLAIM_NS}") for c in node.mps.commands()) == 1
    assert any(entry["event"].startswith("MPS control daemon not answering") for entry in logs)
    # a vanished claim server alone is re-created too, without a daemon restart
    node.mps.daemon(node.pipe("sm-sharing")).servers.pop(SRV_A)
    node.enforcer.check_health()
    assert limits(node, "sm-sharing", SRV_A) == {CLAIM_NS: (40 * GIB, 25)}
    assert node.enforcer.daemon_restarts == 1


def test_restore_after_plugin_restart_and_crash(tmp_path: Path) -> None:
    node = Node(tmp_path, count=2)
    p = spread(node, 10 * GIB)
    node.enforcer.apply(p)
    node.mps.crash(node.pipe("time-slicing"))
    fresh = node.new_enforcer()
    fresh.restore([p])
    assert servers(node, "time-slicing") == {SRV_A: tuple(g.uuid for g in node.gpus)}
    assert limits(node, "time-slicing", SRV_A) == {CLAIM_NS: (10 * GIB, 100)}
    edits = fresh.apply(p)
    assert edits["gpu-1-part-0"].mounts[0].host_path.endswith(f"{SRV_A}/{CLAIM_NS}")


def test_restore_removes_claim_servers_of_unknown_claims(tmp_path: Path) -> None:
    node = Node(tmp_path, count=2)
    keep = plan(device(node.gpus[0], GIB), uid=UID_B)
    node.enforcer.apply(keep)
    node.enforcer.apply(spread(node, GIB))
    busy = node.mps.add_client(node.pipe("time-slicing"), SRV_A, CLAIM_NS)
    fresh = node.new_enforcer()
    fresh.restore([keep])
    cmds = node.mps.commands()
    assert cmds.index(f"client terminate {busy}") < cmds.index(f"server delete {SRV_A} --force")
    assert servers(node, "time-slicing") == {"gpu_0": (node.gpus[0].uuid,)}
    assert node.nvml.gpus[node.gpus[1].uuid].compute_mode == "DEFAULT"


def test_release_of_unknown_claim_removes_its_server(tmp_path: Path) -> None:
    node = Node(tmp_path, count=2)
    node.enforcer.apply(spread(node, GIB))
    node.enforcer.apply(plan(device(node.gpus[0], GIB), uid=UID_B))
    fresh = node.new_enforcer()  # plugin restarted without restore
    fresh.release(UID_A)
    assert servers(node, "time-slicing") == {"gpu_0": (node.gpus[0].uuid,)}


def test_reapply_with_other_gpus_replaces_the_server(tmp_path: Path) -> None:
    node = Node(tmp_path, count=3)
    g0, g1, g2 = node.gpus
    node.enforcer.apply(plan(device(g0, GIB), uid=UID_A))  # first on one GPU (shared server)
    node.enforcer.apply(spread(node, GIB, count=2))
    assert servers(node, "time-slicing") == {SRV_A: (g0.uuid, g1.uuid)}
    other = plan(device(g0, GIB, name="a"), device(g2, GIB, name="b"), uid=UID_A)
    node.enforcer.apply(other)
    assert servers(node, "time-slicing") == {SRV_A: (g0.uuid, g2.uuid)}
    assert node.nvml.gpus[g1.uuid].compute_mode == "DEFAULT"
    node.enforcer.apply(plan(device(g2, GIB), uid=UID_A))  # back to one GPU
    assert servers(node, "time-slicing") == {"gpu_2": (g2.uuid,)}
    assert limits(node, "time-slicing", "gpu_2") == {NS_A: (GIB, 100)}
    assert node.nvml.gpus[g0.uuid].compute_mode == "DEFAULT"


def test_vanished_claim_server_fails_the_claim_and_leaves_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path, count=2, mps_visible=[0])
    with pytest.raises(MpsError, match=rf"{SRV_A} for GPUs 0 \(.*\), 1 \(.*\) vanished"):
        node.enforcer.apply(spread(node, GIB))
    assert node.mps.daemons == {}
    assert {node.nvml.gpus[g.uuid].compute_mode for g in node.gpus} == {"DEFAULT"}
    assert node.enforcer.targets() == []


def test_mode_conflict_with_another_claim_on_one_of_the_gpus(tmp_path: Path) -> None:
    node = Node(tmp_path, count=2)
    node.enforcer.apply(plan(device(node.gpus[1], GIB), uid=UID_B))
    with pytest.raises(MpsError, match="GPU 1 .* serves time-slicing claims"):
        node.enforcer.apply(spread(node, GIB, mode="sm-sharing", uid=UID_C))


@pytest.mark.parametrize(
    ("tiers", "make", "message"),
    [
        (
            {},
            lambda g, h: [device(g, 40 * GIB), device(h, 20 * GIB)],
            r"different memory limits \(MiB\) \(a on GPU 0 \(GPU-.*\): 40960; b on GPU 1 "
            r"\(GPU-.*\): 20480\); an MPS namespace has one pinned memory limit",
        ),
        (
            {},
            lambda g, h: [device(g, 10 * GIB, 40 * GIB), device(h, 20 * GIB, 40 * GIB)],
            r"different memory requests \(MiB\) \(a on GPU 0 .*: 10240; b on GPU 1 .*: 20480\)"
            r"; the memory-limit hook reads one NVIDIA_GPU_MEMORY_REQUEST",
        ),
        (
            {},
            lambda g, h: [device(g, GIB), device(h, GIB, mode="sm-sharing")],
            r"different compute modes \(a on GPU 0 .*: time-slicing; b on GPU 1 .*: sm-sharing\)",
        ),
        (
            {},
            lambda g, h: [
                device(g, GIB, mode="sm-sharing", threads=30),
                device(h, GIB, mode="sm-sharing", threads=60),
            ],
            "different active thread percentages",
        ),
        ({1: "cooperative"}, lambda g, h: [device(g, GIB), device(h, GIB)], "enforcement tiers"),
        ({1: "none"}, lambda g, h: [device(g, GIB), device(h, GIB)], "enforcement tiers"),
    ],
)
def test_multi_gpu_refusals_run_nothing(tmp_path: Path, tiers, make, message: str) -> None:  # type: ignore[no-untyped-def]
    node = Node(tmp_path, tiers=tiers)
    a, b = make(*node.gpus)
    p = plan(replace(a, device="a"), replace(b, device="b"), uid=UID_A)
    with pytest.raises(MpsError, match=message):
        node.enforcer.apply(p)
    assert node.mps.calls == []
    assert node.nvml.calls == []


def test_cooperative_multi_gpu_claim_may_differ_in_request(tmp_path: Path) -> None:
    node = Node(tmp_path, tiers={0: "cooperative", 1: "cooperative"})
    g0, g1 = node.gpus
    p = plan(device(g0, 10 * GIB, 40 * GIB), device(g1, 20 * GIB, 40 * GIB, name="b"), uid=UID_A)
    edits = node.enforcer.apply(p)
    assert limits(node, "time-slicing", SRV_A) == {CLAIM_NS: (40 * GIB, 100)}
    # no memory-limit hook on cooperative GPUs: only the consumer gate
    assert all([h.args[3] for h in e.hooks] == ["gpu-fraction-consumer"] for e in edits.values())


def test_claim_without_mps_still_spans_gpus(tmp_path: Path) -> None:
    node = Node(tmp_path, tiers={0: "none", 1: "none"})
    edits = node.enforcer.apply(spread(node, GIB))
    assert node.mps.calls == []
    assert set(edits) == {"gpu-0-part-0", "gpu-1-part-0"}
    assert all(t.server.startswith("gpu_") for t in node.enforcer.targets())


def test_usage_of_a_multi_gpu_claim(tmp_path: Path) -> None:
    node = Node(tmp_path, tiers={0: "cooperative", 1: "cooperative"})
    g0, g1 = node.gpus
    p = spread(node, 8 * GIB)
    node.enforcer.apply(p)
    pipe = node.pipe("time-slicing")
    c1 = node.mps.add_client(pipe, SRV_A, CLAIM_NS)
    c2 = node.mps.add_client(pipe, SRV_A, CLAIM_NS)
    node.nvml.gpus[g0.uuid].processes = [MpsProcess(c1, GIB), MpsProcess(c2, 2 * GIB)]
    node.nvml.gpus[g1.uuid].processes = [MpsProcess(c1, 3 * GIB)]  # c2 uses GPU 0 only
    usage = MpsUsageSource(node.enforcer, node.nvml).snapshot([p])
    assert usage[(UID_A, g0.uuid)].used_bytes == 3 * GIB
    assert usage[(UID_A, g1.uuid)].used_bytes == 3 * GIB
    assert usage[(UID_A, g0.uuid)].clients == usage[(UID_A, g1.uuid)].clients == 2
