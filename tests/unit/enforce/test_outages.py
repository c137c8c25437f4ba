"""MPS outages found by the health check: a claim whose server process was replaced, or whose
namespace was re-created, is reported once, with the server's old and new PIDs; claims of
other servers are not (against the fake control program)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from structlog.testing import capture_logs

from dra_driver.enforce.rules.outages import (
    NAMESPACE_RECREATED,
    SERVER_RESTARTED,
    MpsOutage,
    server_pid,
)
from tests.support.fakes.plans import GIB, Node, device, plan

UID_A = "0a000000-0000-4000-8000-00000000000a"
UID_B = "0b000000-0000-4000-8000-00000000000b"
UID_C = "0c000000-0000-4000-8000-00000000000c"
NS_A = "c_" + UID_A.replace("-", "_")
CSV = "--format=csv,noheader"


class Reports:
    """The outages each check reported, in order."""

    def __init__(self) -> None:
        self.calls: list[list[MpsOutage]] = []

    def __call__(self, outages: Sequence[MpsOutage]) -> None:
        self.calls.append(list(outages))


def node_with_claims(tmp_path: Path) -> tuple[Node, Reports]:
    node = Node(tmp_path, count=3)
    g0, g1, _ = node.gpus
    node.enforcer.apply(plan(device(g0, 2 * GIB), uid=UID_A))
    node.enforcer.apply(plan(device(g1, 2 * GIB), uid=UID_B))
    node.enforcer.apply(
        plan(*(device(g, GIB, name=f"gpu-{g.index}-part") for g in node.gpus[1:]), uid=UID_C)
    )
    reports = Reports()
    node.enforcer.report_outages(reports)
    assert all(h.healthy for h in node.enforcer.check_health().values())
    assert reports.calls == []
    return node, reports


def pids(node: Node) -> dict[str, int]:
    return {s.name: s.pid for s in node.mps.daemon(node.pipe("time-slicing")).servers.values()}


def test_a_daemon_restart_is_an_outage_of_every_claim_it_served(tmp_path: Path) -> None:
    node, reports = node_with_claims(tmp_path)
    before = pids(node)
    node.mps.crash(node.pipe("time-slicing"))
    with capture_logs() as logs:
        node.enforcer.check_health()
    [outages] = reports.calls
    after = pids(node)
    got = {(o.claim.uid, o.server): (o.reason, o.old_pid, o.new_pid) for o in outages}
    srv_c = "m_" + UID_C.replace("-", "_")
    assert got == {
        (uid, srv): (SERVER_RESTARTED, before[srv], after[srv])
        for uid, srv in ((UID_A, "gpu_0"), (UID_B, "gpu_1"), (UID_C, srv_c))
    }
    [c] = [o for o in outages if o.claim.uid == UID_C]  # one for both GPUs of its own server
    assert c.gpus == tuple((g.index, g.uuid) for g in node.gpus[1:])
    assert (c.mode, c.namespace) == ("time-slicing", "claim")
    warned = [e for e in logs if e["event"].startswith("claim's MPS server or namespace was")]
    assert {e["claim_uid"] for e in warned} == {UID_A, UID_B, UID_C}
    node.enforcer.check_health()
    assert len(reports.calls) == 1  # reported once


def test_one_failed_server_is_an_outage_of_its_claims_only(tmp_path: Path) -> None:
    node, reports = node_with_claims(tmp_path)
    node.mps.daemon(node.pipe("time-slicing")).servers.pop("gpu_0")
    node.enforcer.check_health()
    [[outage]] = reports.calls
    assert (outage.claim.uid, outage.reason, outage.gpus) == (
        UID_A,
        SERVER_RESTARTED,
        ((0, node.gpus[0].uuid),),
    )


def test_a_recreated_namespace_is_an_outage_of_its_claim(tmp_path: Path) -> None:
    node, reports = node_with_claims(tmp_path)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(node.pipe("time-slicing"))}
    argv = ["nvidia-cuda-mps-control", "namespace", "delete", NS_A, "--server=gpu_0"]
    assert node.mps.run([*argv, "--force"], env={**env, "CUDA_MPS_PROTOCOL_VERSION": "3"}).ok
    node.enforcer.check_health()
    [[outage]] = reports.calls
    assert (outage.claim.uid, outage.reason, outage.old_pid) == (UID_A, NAMESPACE_RECREATED, None)


def test_a_failing_listener_does_not_stop_the_check(tmp_path: Path) -> None:
    node, _ = node_with_claims(tmp_path)

    def broken(outages: Sequence[MpsOutage]) -> None:
        raise RuntimeError("bug")

    node.enforcer.report_outages(broken)
    node.mps.crash(node.pipe("time-slicing"))
    with capture_logs() as logs:
        health = node.enforcer.check_health()
    assert all(h.healthy for h in health.values())
    assert any(e["event"] == "MPS outage report failed" for e in logs)


def test_server_pid_column() -> None:
    assert [server_pid(t) for t in ("4711", "0", "-", "")] == [4711, None, None, None]
