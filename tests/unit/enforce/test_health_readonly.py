"""MPS settings are written only when they must change.

On r615 drivers ``namespace set`` fails once a client is attached (measured by the
maintainers of KAI's gpu-fractioning operator), and the fake refuses it the same way. So the
health check and a restart's restore read, compare and repair only what is missing or wrong,
and never re-set a namespace that has clients.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.fakes.plans import GIB, Node, device, plan

UID_A = "0a000000-0000-4000-8000-00000000000a"
NS_A = "c_" + UID_A.replace("-", "_")
CSV = "--format=csv,noheader"


def _sets(node: Node) -> list[str]:
    return [c for c in node.mps.commands() if c.startswith("namespace set")]


def test_fake_refuses_namespace_set_while_clients_are_attached(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.enforcer.apply(plan(device(node.gpus[0], GIB), uid=UID_A))
    pipe = node.pipe("time-slicing")
    node.mps.add_client(pipe, "gpu_0", NS_A)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_PROTOCOL_VERSION": "3"}
    argv = ["nvidia-cuda-mps-control", "namespace", "set", NS_A, "--server=gpu_0"]
    done = node.mps.run([*argv, "--pinned-memory-limit=2G"], env=env)
    assert done.rc != 0 and "active clients" in done.stderr
    assert node.mps.daemon(pipe).servers["gpu_0"].namespaces[NS_A].pinned == GIB


def test_health_check_does_not_re_set_a_namespace_with_clients(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, GIB, 2 * GIB), uid=UID_A))
    node.mps.add_client(node.pipe("time-slicing"), "gpu_0", NS_A)
    before = len(_sets(node))
    for _ in range(3):
        health = node.enforcer.check_health()
        assert health[g.uuid].healthy, health[g.uuid].detail
    assert len(_sets(node)) == before == 1


def test_restore_after_restart_keeps_running_clients_namespace(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    a = plan(device(g, GIB, 2 * GIB), uid=UID_A)
    node.enforcer.apply(a)
    node.mps.add_client(node.pipe("time-slicing"), "gpu_0", NS_A)
    fresh = node.new_enforcer()
    fresh.restore([a])
    assert [t.claim.uid for t in fresh.targets()] == [UID_A]
    assert fresh.check_health()[g.uuid].healthy
    assert len(_sets(node)) == 1


def test_drifted_limits_are_repaired_while_no_client_is_attached(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, GIB, 2 * GIB), uid=UID_A))
    spaces = node.mps.daemon(node.pipe("time-slicing")).servers["gpu_0"].namespaces
    spaces[NS_A].pinned = 7 * GIB  # changed behind the plugin's back
    assert node.enforcer.check_health()[g.uuid].healthy
    assert spaces[NS_A].pinned == 2 * GIB
    assert _sets(node)[-1] == (
        f"namespace set {NS_A} --server=gpu_0 --pinned-memory-limit=2048M "
        "--active-thread-percentage=100"
    )


def test_drifted_limits_with_clients_are_reported_not_re_set(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, GIB, 2 * GIB), uid=UID_A))
    pipe = node.pipe("time-slicing")
    node.mps.add_client(pipe, "gpu_0", NS_A)
    node.mps.daemon(pipe).servers["gpu_0"].namespaces[NS_A].pinned = 7 * GIB
    health = node.enforcer.check_health()[g.uuid]
    assert not health.healthy
    assert "pinned memory limit '7G'" in health.detail and "1 client" in health.detail
    assert len(_sets(node)) == 1
