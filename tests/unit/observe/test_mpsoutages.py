"""An MPS outage made visible: an event on the claim's pods, one count per replaced server and
GPU, and ``MpsClientsConnected=False`` on the claim's MPS devices until the containers that ran
before it (the consumer gate's records, older than the outage) are gone."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from dra_driver.enforce.rules.outages import NAMESPACE_RECREATED, SERVER_RESTARTED, MpsOutage
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.infra.metrics import Metrics
from dra_driver.model.plans import ClaimPlan, ClaimRef, DevicePlan
from dra_driver.model.vocabulary import Tier
from dra_driver.observe.claimstatus import (
    CLIENTS_CONDITION_TYPE,
    ClientsCondition,
    Enforcement,
    device_status,
)
from dra_driver.observe.consumers import ConsumerWatch
from dra_driver.observe.mpsoutages import (
    RECONNECTED,
    MpsOutageReport,
    clients_condition,
    event_on_terminations,
)
from tests.support import claimfactory as cf
from tests.support.apiserver_stub import ClaimStatusServer
from tests.support.node import NODE
from tests.unit.observe.test_claimstatus import prepared, writer
from tests.unit.observe.test_consumers import container_process, plan_of, run_gate

UID = "0a000000-0000-4000-8000-00000000000a"
T0 = 1_800_000_000.0
GPU0 = (0, "GPU-0")


def outage(
    claim: ClaimRef, reason: str = SERVER_RESTARTED, server: str = "gpu_0", **kw: Any
) -> MpsOutage:
    fields: dict[str, Any] = {
        "mode": "time-slicing",
        "namespace": "c_x",
        "gpus": (GPU0,),
        "old_pid": 41,
        "new_pid": 42,
        "at": T0,
    }
    fields.update(kw)
    return MpsOutage(claim=claim, reason=reason, server=server, **fields)


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def claim_event(self, claim: ClaimRef, reason: str, message: str) -> None:
        self.posted.append((claim.uid, reason, message))


def count(metrics: Metrics, gpu: str, mode: str = "time-slicing") -> float | None:
    return metrics.registry.get_sample_value(
        "dra_gpu_fraction_mps_server_restarts_total", {"gpu": gpu, "mode": mode}
    )


def test_event_per_claim_and_one_count_per_replaced_server_and_gpu() -> None:
    a, b, c = (ClaimRef("team-a", n, f"uid-{n}") for n in "abc")
    events, metrics = Events(), Metrics()
    report = MpsOutageReport(events, metrics, lambda uid, since: [])
    two = ((1, "GPU-1"), (2, "GPU-2"))
    report.report(
        [
            outage(a),
            outage(b),
            outage(c, server="m_c", gpus=two),
            outage(a, reason=NAMESPACE_RECREATED, server="gpu_3", gpus=((3, "GPU-3"),)),
        ]
    )
    assert [(uid, reason) for uid, reason, _ in events.posted] == [
        ("uid-a", SERVER_RESTARTED),
        ("uid-b", SERVER_RESTARTED),
        ("uid-c", SERVER_RESTARTED),
        ("uid-a", NAMESPACE_RECREATED),
    ]
    message = events.posted[0][2]
    assert "MPS server gpu_0 of GPU 0 (GPU-0) (time-slicing) was restarted (PID 41 -> 42)" in (
        message
    )
    assert "2027-01-15T08:00:00Z" in message and "restart the containers" in message
    assert [count(metrics, g) for g in ("GPU-0", "GPU-1", "GPU-2", "GPU-3")] == [1, 1, 1, None]


def test_condition_is_false_until_the_containers_before_the_outage_are_gone(
    node: Any, tmp_path: Path
) -> None:
    """The containers the consumer gate admitted before the outage and that still run
    (:meth:`ConsumerWatch.running_before`)."""
    plan = plan_of(node)
    records = tmp_path / "users"
    dev = records / UID / "gpu-0"
    with container_process() as before, container_process() as after:
        assert run_gate(dev, tmp_path / "b1", "before", 1000, before.pid, 2).returncode == 0
        os.utime(dev / "before", (T0 - 60, T0 - 60))
        assert run_gate(dev, tmp_path / "b2", "after", 1000, after.pid, 2).returncode == 0
        os.utime(dev / "after", (T0 + 60, T0 + 60))  # admitted after the outage
        seen: list[tuple[str, ClientsCondition]] = []
        report = MpsOutageReport(
            Events(),
            Metrics(),
            ConsumerWatch(records).running_before,
            lambda p, c: seen.append((p.claim.uid, c)),
            clock=lambda: T0 + 100,
        )
        report.check([plan])
        assert seen == []  # no outage, no condition
        report.report([outage(plan.claim)])
        report.check([plan])
        report.check([plan])  # unchanged: passed on once
        [(uid, down)] = seen
        assert (uid, down.connected, down.reason) == (UID, False, SERVER_RESTARTED)
        assert down.message.endswith("containers still to restart: before")
        assert down.since == "2027-01-15T08:00:00Z"
        before.kill()  # its container ended (restarted under a new ID)
        before.wait()
        report.check([plan])
        up = seen[-1][1]
        assert (up.connected, up.reason, up.since) == (
            True,
            RECONNECTED,
            "2027-01-15T08:01:40Z",
        )
    report.check([])  # released: forgotten
    report.report([outage(plan.claim, at=T0 + 200)])
    report.check([])
    assert len(seen) == 2


def test_condition_is_on_mps_devices_only() -> None:
    gpu = SimulatedGpuSource("simulated:H200x1", seed="n").discover().gpus[0]
    d = DevicePlan(("gpu",), "n", "gpu-0-time-slicing", "s", gpu, "time-slicing", 1, 1, None)
    down = clients_condition(outage(ClaimRef("ns", "n", UID)), ["abcdef0123456789"], T0)
    entry = device_status(d, "drv", Enforcement(Tier.HARD), "t", 100, clients=down)
    cond = entry["conditions"][-1]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        CLIENTS_CONDITION_TYPE,
        "False",
        SERVER_RESTARTED,
    )
    assert cond["message"].endswith("still to restart: abcdef012345")
    entry = device_status(d, "drv", Enforcement(Tier.NONE), "t", 100, clients=down)
    assert [c["type"] for c in entry["conditions"]] == ["FractionEnforced"]


@pytest.fixture
def api() -> Any:
    with ClaimStatusServer() as server:
        yield server


def test_the_claim_status_carries_the_condition(node: Any, api: Any) -> None:
    claim = cf.on_node(cf.claim([node.share(1, "quarter")]), NODE)
    (plan,) = prepared(node, [copy.deepcopy(claim)])
    assert isinstance(plan, ClaimPlan)
    api.add(claim)
    w = writer(api, plan)
    down = clients_condition(outage(plan.claim), ["c1"], T0)
    w.flag_clients(plan, down)
    assert w.write(plan) == "written"
    key = (claim["metadata"]["namespace"], claim["metadata"]["name"])
    [_, cond] = api.claims[key]["status"]["devices"][0]["conditions"]
    assert (cond["type"], cond["status"], cond["lastTransitionTime"]) == (
        CLIENTS_CONDITION_TYPE,
        "False",
        "2027-01-15T08:00:00Z",
    )
    w.flag_clients(plan, clients_condition(outage(plan.claim), [], T0 + 5))
    assert w.write(plan) == "written"
    [_, cond] = api.claims[key]["status"]["devices"][0]["conditions"]
    assert (cond["status"], cond["reason"]) == ("True", RECONNECTED)


def test_clients_over_the_cap_are_told_on_the_claims_pods() -> None:
    events = Events()
    claim = ClaimRef("team-a", "nb", UID)
    event_on_terminations(events)(claim, "GPU-0", [41, 42], 7)
    [(uid, reason, message)] = events.posted
    assert (uid, reason) == (UID, "MpsClientsOverCap")
    assert message.startswith("2 MPS client process(es) of this claim on GPU GPU-0 were terminated")
    assert "(PIDs 41, 42)" in message and "at most 7 at once" in message


def test_a_server_restart_stays_the_reason_while_its_containers_still_run() -> None:
    """One daemon restart shows as a replaced server and, a check later, as re-created
    namespaces (or the other way round): the condition keeps saying the server restarted,
    and follows the later time."""
    claim = ClaimRef("team-a", "nb", UID)
    plan = ClaimPlan(claim, ())
    for first, second in (
        (SERVER_RESTARTED, NAMESPACE_RECREATED),
        (NAMESPACE_RECREATED, SERVER_RESTARTED),
    ):
        seen: list[ClientsCondition] = []
        report = MpsOutageReport(
            Events(), Metrics(), lambda uid, since: ["c1"], lambda p, c, s=seen: s.append(c)
        )
        report.report([outage(claim, reason=first)])
        report.report([outage(claim, reason=second, at=T0 + 30)])
        report.check([plan])
        [condition] = seen
        assert (condition.connected, condition.reason) == (False, SERVER_RESTARTED)
        assert condition.since == "2027-01-15T08:00:30Z"
