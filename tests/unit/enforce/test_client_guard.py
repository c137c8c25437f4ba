"""The enforcer holds each claim's MPS clients within its cap (issue 26, item 2): one ``client
list`` per daemon, ``client terminate`` for the newest clients beyond the cap, said in a log
line, a callback and a metric; never a neighbour's client, and never with the lock Prepare
needs held while a command runs."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

from structlog.testing import capture_logs

from dra_driver.app.nodestate import check_clients, police_clients
from dra_driver.enforce import MpsEnforcer, RecordingEnforcer
from dra_driver.enforce.rules.base import ClientTermination
from dra_driver.infra import budget
from dra_driver.infra.budget import Budget
from dra_driver.infra.metrics import Metrics
from dra_driver.model.plans import ClaimRef
from tests.support.fakes.plans import H200_MIB, MIB, Node, device, plan
from tests.support.waiting import wait_for

UID_A = "0a000000-0000-4000-8000-00000000000a"
UID_B = "0b000000-0000-4000-8000-00000000000b"
NS_A = "c_" + UID_A.replace("-", "_")
NS_B = "c_" + UID_B.replace("-", "_")
EIGHTH = H200_MIB * MIB // 8  # cap 7
CSV = "--format=csv,noheader"


class Reported:
    """Records the calls of the enforcer's ``report_terminations`` listener."""

    def __init__(self) -> None:
        self.calls: list[tuple[ClaimRef, str, list[int], int]] = []

    def __call__(self, claim: ClaimRef, gpu_uuid: str, pids: list[int], cap: int) -> None:
        self.calls.append((claim, gpu_uuid, pids, cap))


def enforcer(node: Node, reported: Reported | None = None) -> MpsEnforcer:
    mps = MpsEnforcer(node.tiers, node.nvml, node.mps, node.options, sleep=node.sleeps.append)
    mps.report_terminations(reported or Reported())
    return mps


def clients(node: Node) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for c in node.mps.daemon(node.pipe("time-slicing")).clients:
        out.setdefault(c.namespace, []).append(c.pid)
    return out


def test_the_newest_clients_beyond_a_claim_s_cap_are_terminated_and_said(tmp_path: Path) -> None:
    node = Node(tmp_path)
    reported = Reported()
    mps = enforcer(node, reported)
    g = node.gpus[0]
    mps.apply(plan(device(g, EIGHTH), uid=UID_A))
    mps.apply(plan(device(g, EIGHTH), uid=UID_B, name="serve"))
    pipe = node.pipe("time-slicing")
    flood = [node.mps.add_client(pipe, "gpu_0", NS_A) for _ in range(10)]
    neighbour = [node.mps.add_client(pipe, "gpu_0", NS_B) for _ in range(2)]
    outsider = node.mps.add_client(pipe, "gpu_0", "default")
    before = len(node.mps.calls)
    with capture_logs() as logs:
        done = mps.check_clients()
    ended = [flood[9], flood[8], flood[7]]  # newest first
    claim = ClaimRef("team-a", "train", UID_A)
    assert done == [ClientTermination(claim, g.uuid, tuple(ended), 7, "over_claim_cap")]
    assert reported.calls == [(claim, g.uuid, ended, 7)]
    assert node.mps.commands()[before:] == [f"client list {CSV}"] + [
        f"client terminate {p}" for p in ended
    ]
    assert clients(node) == {NS_A: flood[:7], NS_B: neighbour, "default": [outsider]}
    [line] = [e for e in logs if e["log_level"] == "warning"]
    assert line["event"] == "claim over its MPS client cap; its newest clients were terminated"
    assert {k: line[k] for k in ("claim_uid", "namespace", "name", "gpu", "pids", "cap")} == {
        "claim_uid": UID_A,
        "namespace": "team-a",
        "name": "train",
        "gpu": g.uuid,
        "pids": ended,
        "cap": 7,
    }
    assert (line["clients"], line["mps_server"], line["mps_namespace"]) == (10, "gpu_0", NS_A)

    # within the cap now: the next check lists and ends nothing; the earliest stay
    later = node.mps.add_client(pipe, "gpu_0", NS_A)
    assert [t.pids for t in mps.check_clients()] == [(later,)]
    assert mps.check_clients() == []
    assert clients(node)[NS_A] == flood[:7]


def test_no_claims_no_command(tmp_path: Path) -> None:
    node = Node(tmp_path)
    assert enforcer(node).check_clients() == []
    assert node.mps.calls == []


def test_a_check_never_keeps_prepare_waiting(tmp_path: Path) -> None:
    node = Node(tmp_path)
    mps = enforcer(node)
    mps.apply(plan(device(node.gpus[0], EIGHTH), uid=UID_A))
    node.mps.hang("client", "list")
    check = threading.Thread(target=mps.check_clients)
    check.start()
    try:
        wait_for("the check's client list", lambda: f"client list {CSV}" in node.mps.commands(), 5)
        with budget.within(Budget.of(2)):  # fails, not hangs, if the check held the lock
            mps.apply(plan(device(node.gpus[1], EIGHTH), uid=UID_B))
        assert check.is_alive()
    finally:
        node.mps.release()
        check.join(5)
    assert not check.is_alive()


def test_a_daemon_that_cannot_be_asked_is_skipped_and_logged_once(tmp_path: Path) -> None:
    node = Node(tmp_path)
    mps = enforcer(node)
    mps.apply(plan(device(node.gpus[0], EIGHTH), uid=UID_A))
    for _ in range(8):
        node.mps.add_client(node.pipe("time-slicing"), "gpu_0", NS_A)
    node.mps.fail("client", "list", stderr="daemon busy", times=2)
    with capture_logs() as logs:
        assert mps.check_clients() == []
        assert mps.check_clients() == []
        [done] = mps.check_clients()
    assert len(done.pids) == 1
    events = [(e["event"], e.get("mode")) for e in logs if e["log_level"] != "warning"]
    warned = [e for e in logs if e["event"].startswith("MPS client check failed")]
    assert len(warned) == 1 and "daemon busy" in warned[0]["error"]
    assert events == [("MPS client check works again", "time-slicing")]


def test_a_failing_reporter_or_terminate_does_not_stop_enforcement(tmp_path: Path) -> None:
    node = Node(tmp_path)

    def broken(claim: ClaimRef, gpu_uuid: str, pids: list[int], cap: int) -> None:
        raise RuntimeError("event API down")

    mps = MpsEnforcer(node.tiers, node.nvml, node.mps, node.options)
    mps.report_terminations(broken)
    mps.apply(plan(device(node.gpus[0], EIGHTH), uid=UID_A))
    pids = [node.mps.add_client(node.pipe("time-slicing"), "gpu_0", NS_A) for _ in range(9)]
    node.mps.fail("client", "terminate", stderr="client not found")  # gone meanwhile
    with capture_logs() as logs:
        [done] = mps.check_clients()
    assert done.pids == (pids[7],)
    assert "reporting terminated MPS clients failed" in [e["event"] for e in logs]


def test_the_plugin_counts_terminated_clients_and_stops_for_an_enforcer_without_clients(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    mps = enforcer(node)
    mps.apply(plan(device(node.gpus[0], EIGHTH), uid=UID_A))
    for _ in range(10):
        node.mps.add_client(node.pipe("time-slicing"), "gpu_0", NS_A)
    metrics = Metrics()
    assert check_clients(mps, metrics)
    value = metrics.registry.get_sample_value(
        "dra_gpu_fraction_mps_clients_terminated_total", {"reason": "over_claim_cap"}
    )
    assert value == 3

    assert RecordingEnforcer().check_clients() is None
    returned = threading.Event()

    def run() -> None:
        police_clients(RecordingEnforcer(), metrics, threading.Event(), 0.01)
        returned.set()

    threading.Thread(target=run, daemon=True).start()
    assert returned.wait(5.0)

    broken = SimpleNamespace(check_clients=lambda: 1 / 0)
    with capture_logs() as logs:
        assert check_clients(broken, metrics)  # type: ignore[arg-type]
    assert [e["event"] for e in logs] == ["MPS client check failed"]
