"""``dra-driver occupancy``'s pure part: API JSON (slices from build_slices, claims as the
scheduler leaves them) -> per-GPU occupancy and the reasons pending pods wait."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_driver import DEFAULT_DRIVER_NAME as DRIVER
from dra_driver.cluster.occupancy import Cluster
from dra_driver.cluster.occupancyrender import render_json, render_table
from dra_driver.cluster.occupancywait import (
    NO_DEVICE,
    NO_MEMORY,
    NO_NODE,
    OTHER_MODE,
    QUOTA,
    TAINTED,
    UNKNOWN,
    UNKNOWN_CLASS,
    build_report,
)
from dra_driver.config.load import parse_node_config
from dra_driver.config.node import default_node_config
from dra_driver.gpus import MIB, SimulatedGpuSource
from dra_driver.publish.devicetaints import GPU_LOST, DeviceTaint, taint_key
from dra_driver.publish.offer import offered_devices
from dra_driver.publish.slices import build_slices
from tests.support import claimfactory as cf
from tests.support.chartobjects import extended_classes, shipped_classes
from tests.support.node import MIXED_CONFIG, share_result

GPUS = "simulated:H200x2"
CARD = SimulatedGpuSource(GPUS, seed="node-a").discover().gpus[0].memory_bytes
QUARTER = CARD // 4 // MIB * MIB


def slices(
    node: str, config: dict[str, Any] | None = None, tainted: tuple[int, ...] = ()
) -> list[dict[str, Any]]:
    """``node``'s slices; the GPUs of ``tainted`` (indexes) lost, as the plugin taints them."""
    inventory = SimulatedGpuSource(GPUS, seed=node).discover()
    cfg = parse_node_config(config) if config else default_node_config()
    tiers = {g.uuid: "hard" for g in inventory.gpus}
    taints = {
        g.uuid: DeviceTaint(taint_key(DRIVER), GPU_LOST, "2026-12-01T10:00:00Z")
        for g in inventory.gpus
        if g.index in tainted
    }
    return build_slices(inventory, cfg, DRIVER, node, enforcement=tiers, taints=taints)


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}


def request(cls: str, slots: str | None = None, memory: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if slots or memory:
        key, value = ("slots", slots) if slots else ("memory", memory)
        exactly["capacity"] = {"requests": {key: value}}
    return {"name": "gpu", "exactly": exactly}


def allocated(
    name: str,
    cls: str,
    gpu: int,
    product: str | None,
    mode: str,
    pod: str,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A claim as the scheduler leaves it: allocated on ``gpu`` of node-a, reserved."""
    cfg = parse_node_config(config) if config else default_node_config()
    inventory = SimulatedGpuSource(GPUS, seed="node-a").discover()
    device = next(
        d
        for d in offered_devices(inventory, cfg)
        if d.gpu.index == gpu and d.compute_mode == mode and d.product is None
    )
    result = share_result(device, "node-a", product, memory=None if product else "40Gi")
    claim = cf.claim([result], name=name, reserved_for=[cf.pod(pod)])
    slots = result.get("consumedCapacity", {}).get("slots")
    claim["spec"]["devices"]["requests"] = [request(cls, slots=slots)]
    return claim


def pending_pod(
    name: str,
    claims: dict[str, str] | None = None,
    templates: dict[str, str] | None = None,
    selector: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
) -> dict[str, Any]:
    refs = [{"name": k, "resourceClaimName": v} for k, v in (claims or {}).items()]
    refs += [{"name": k, "resourceClaimTemplateName": v} for k, v in (templates or {}).items()]
    return {
        "metadata": {"namespace": "default", "name": name},
        "spec": {
            "nodeSelector": selector or {},
            "containers": [{"name": "c", "resources": {"limits": limits or {}}}],
            "resourceClaims": refs,
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/1 nodes are available: cannot allocate all claims.",
                }
            ],
        },
    }


def unallocated(name: str, cls: str, slots: str | None = None) -> dict[str, Any]:
    claim = cf.claim([], name=name)
    claim["status"] = {}
    claim["spec"]["devices"]["requests"] = [request(cls, slots=slots)]
    return claim


def template(name: str, cls: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "default", "name": name},
        "spec": {"spec": {"devices": {"requests": [request(cls)]}}},
    }


def quota(key: str, used: str, hard: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "default", "name": "gpus"},
        "status": {"hard": {key: hard}, "used": {key: used}},
    }


def busy_cluster(**extra: Any) -> Cluster:
    """node-a: GPU 0 with two quarters in time-slicing, GPU 1 with a half in sm-sharing."""
    claims = [
        allocated("q1", "gpu-quarter", 0, "quarter", "time-slicing", "p1"),
        allocated("q2", "gpu-quarter", 0, "quarter", "time-slicing", "p2"),
        allocated("h1", "gpu-half-sm-sharing", 1, "half", "sm-sharing", "p3"),
    ]
    fields: dict[str, Any] = {
        "slices": slices("node-a"),
        "claims": claims,
        "classes": extended_classes(),
        "nodes": [node("node-a")],
    }
    for key, value in extra.items():
        fields[key] = [*fields.get(key, []), *value]
    return Cluster(**fields)


def extended_resources_config() -> Any:
    return parse_node_config({**_BASE, "extendedResources": True})


_BASE = {"apiVersion": "gpu-fraction.dra.dev/v1alpha1", "kind": "NodeConfig"}


def test_gpus_show_mode_tier_promised_and_free() -> None:
    report = build_report(busy_cluster(), DRIVER)
    g0, g1 = report.gpus
    assert (g0.node, g0.index, g0.mode, g0.tier) == ("node-a", 0, "time-slicing", "hard")
    assert g0.promised_bytes == 2 * QUARTER
    assert g0.free_bytes == CARD - 2 * QUARTER
    assert [(h.name, h.pods, h.fraction) for h in g0.holders] == [
        ("q1", ("p1",), "quarter"),
        ("q2", ("p2",), "quarter"),
    ]
    assert (g1.mode, g1.promised_bytes) == ("sm-sharing", CARD // 2 // MIB * MIB)
    assert [h.fraction for h in g1.holders] == ["half"]


def test_an_idle_gpu_and_a_capacity_claim() -> None:
    claim = allocated("m", "gpu-memory-sm-sharing", 1, None, "sm-sharing", "p", config=MIXED_CONFIG)
    cluster = Cluster(slices=slices("node-a", MIXED_CONFIG), claims=[claim])
    g0, g1 = build_report(cluster, DRIVER).gpus
    assert (g0.mode, g0.promised_bytes, g0.free_bytes) == ("idle", 0, CARD)
    assert (g1.mode, g1.promised_bytes) == ("sm-sharing", 40 * 1024**3)
    assert g1.holders[0].fraction == "40Gi"


def test_claims_of_other_drivers_are_not_counted() -> None:
    claim = allocated("q", "gpu-quarter", 0, "quarter", "time-slicing", "p")
    claim["status"]["allocation"]["devices"]["results"][0]["driver"] = "other.example.com"
    gpus = build_report(Cluster(slices=slices("node-a"), claims=[claim]), DRIVER).gpus
    assert [g.promised_bytes for g in gpus] == [0, 0]


def reason_of(cluster: Cluster) -> tuple[str, str]:
    [pending] = build_report(cluster, DRIVER).pending
    return pending.reason, pending.detail


def test_not_enough_memory() -> None:
    # gpu-full in time-slicing: GPU 0 has half free, GPU 1 is in sm-sharing.
    pod = pending_pod("big", claims={"gpu": "big"})
    cluster = busy_cluster(claims=[unallocated("big", "gpu-full", "8")], pods=[pod])
    why, detail = reason_of(cluster)
    assert why == NO_MEMORY
    assert "needs 139.7Gi" in detail and "69.8Gi" in detail


def test_all_gpus_busy_in_the_other_mode() -> None:
    cluster = busy_cluster(
        claims=[allocated("t", "gpu-eighth", 1, "eighth", "time-slicing", "p4")],
        pods=[pending_pod("sm", templates={"gpu": "sm"})],
        templates=[template("sm", "gpu-eighth-sm-sharing")],
    )
    # GPU 1 now carries both modes, which the scheduler never does; replace its sm claim.
    cluster = Cluster(
        **{
            **cluster.__dict__,
            "claims": [c for c in cluster.claims if c["metadata"]["name"] != "h1"],
        }
    )
    assert reason_of(cluster)[0] == OTHER_MODE


def tainted_cluster(tainted: tuple[int, ...]) -> Cluster:
    """node-a: GPU 0 with two quarters in time-slicing, GPU 1 idle; ``tainted`` GPUs lost;
    a pod waits for a whole GPU."""
    busy = busy_cluster(
        claims=[unallocated("big", "gpu-full", "8")],
        pods=[pending_pod("big", claims={"gpu": "big"})],
    )
    return Cluster(
        **{
            **busy.__dict__,
            "slices": slices("node-a", tainted=tainted),
            "claims": [c for c in busy.claims if c["metadata"]["name"] != "h1"],
        }
    )


def test_a_tainted_idle_gpu_is_not_counted_as_room() -> None:
    assert reason_of(tainted_cluster(()))[0] == UNKNOWN  # GPU 1 idle: the pod fits there
    why, detail = reason_of(tainted_cluster((1,)))
    lost = f"{DRIVER}/gpu-unhealthy=gpu-lost:NoSchedule"
    assert why == NO_MEMORY and "(node-a GPU 0)" in detail
    assert detail.endswith(f"; 1 other GPU(s) for gpu-full tainted ({lost})")
    assert "tainted" not in reason_of(tainted_cluster(()))[1]
    report = build_report(tainted_cluster((1,)), DRIVER)
    assert [sorted(g.taints) for g in report.gpus] == [[], [lost]]
    assert render_table(report).splitlines()[2].endswith(lost)
    assert json.loads(render_json(report))["gpus"][1]["taints"] == [lost]


def test_every_gpu_for_the_class_tainted() -> None:
    why, detail = reason_of(tainted_cluster((0, 1)))
    assert why == TAINTED
    assert "all 2 GPU(s) for gpu-full are tainted" in detail and "gpu-lost" in detail


def test_quota_exhausted_for_a_claim_not_yet_made() -> None:
    key = "gpu-quarter.deviceclass.resource.k8s.io/devices"
    cluster = busy_cluster(
        pods=[pending_pod("q", templates={"gpu": "quarter"})],
        templates=[template("quarter", "gpu-quarter")],
        quotas=[quota(key, "2", "2")],
    )
    why, detail = reason_of(cluster)
    assert why == QUOTA and key in detail


def test_a_full_quota_is_not_the_reason_for_a_claim_already_admitted() -> None:
    key = "gpu-full.deviceclass.resource.k8s.io/devices"
    cluster = busy_cluster(
        claims=[unallocated("big", "gpu-full", "8")],
        pods=[pending_pod("big", claims={"gpu": "big"})],
        quotas=[quota(key, "1", "1")],
    )
    assert reason_of(cluster)[0] == NO_MEMORY


def test_quota_exhausted_for_an_extended_resource() -> None:
    resource = f"{DRIVER}/quarter"
    cluster = busy_cluster(
        pods=[pending_pod("er", limits={resource: "1"})],
        quotas=[quota(f"requests.{resource}", "4", "4")],
    )
    assert reason_of(cluster)[0] == QUOTA
    assert build_report(cluster, DRIVER).pending[0].classes == ("gpu-quarter",)


def test_no_node_matches_the_selector() -> None:
    pod = pending_pod("far", templates={"gpu": "q"}, selector={"zone": "moon"})
    cluster = busy_cluster(pods=[pod], templates=[template("q", "gpu-quarter")])
    why, detail = reason_of(cluster)
    assert why == NO_NODE and "moon" in detail


def test_no_gpu_offers_the_class() -> None:
    pod = pending_pod("mem", templates={"gpu": "m"})
    cluster = busy_cluster(pods=[pod], templates=[template("m", "gpu-memory")])
    assert reason_of(cluster)[0] == NO_DEVICE


def test_a_request_that_fits_leaves_the_schedulers_message() -> None:
    pod = pending_pod("fits", templates={"gpu": "e"})
    cluster = busy_cluster(pods=[pod], templates=[template("e", "gpu-eighth")])
    assert reason_of(cluster) == (UNKNOWN, "0/1 nodes are available: cannot allocate all claims.")


@pytest.mark.parametrize("change", ["bound", "scheduled", "other class"])
def test_pods_not_waiting_for_our_classes_are_left_out(change: str) -> None:
    pod = pending_pod("p", templates={"gpu": "t"})
    if change == "bound":
        pod["spec"]["nodeName"] = "node-a"
    elif change == "scheduled":
        pod["status"]["conditions"][0]["status"] = "True"
    cls = "gpu.example.com" if change == "other class" else "gpu-quarter"
    other = {
        "metadata": {"name": "gpu.example.com"},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]},
    }
    cluster = busy_cluster(pods=[pod], templates=[template("t", cls)], classes=[other])
    assert build_report(cluster, DRIVER).pending == []


def test_a_pod_waiting_on_a_class_that_does_not_exist_is_listed_with_the_closest_name() -> None:
    """A claim for gpu-quater stays Pending with a scheduler event, and occupancy left the pod
    out (it names none of the driver's classes)."""
    pod = pending_pod("typo", templates={"gpu": "t"})
    cluster = busy_cluster(pods=[pod], templates=[template("t", "gpu-quater")])
    [pending] = build_report(cluster, DRIVER).pending
    assert (pending.name, pending.classes, pending.reason) == (
        "typo",
        ("gpu-quater",),
        UNKNOWN_CLASS,
    )
    assert pending.detail.startswith(
        "DeviceClass gpu-quater does not exist; did you mean gpu-quarter"
    )
    assert "typo" in render_table(build_report(cluster, DRIVER))
    nothing_alike = busy_cluster(pods=[pod], templates=[template("t", "zzzz")])
    assert "no class has a similar name" in reason_of(nothing_alike)[1]


def test_an_admitted_claim_of_an_unknown_class_is_listed_too() -> None:
    claim = unallocated("c", "gpu-halff")
    pod = pending_pod("typo", claims={"gpu": "c"})
    cluster = busy_cluster(pods=[pod], claims=[claim])
    why, detail = reason_of(cluster)
    assert why == UNKNOWN_CLASS and "did you mean gpu-half" in detail


def test_node_filter() -> None:
    cluster = busy_cluster(slices=slices("node-b"), nodes=[node("node-b")])
    pod = pending_pod("b", templates={"gpu": "t"}, selector={"kubernetes.io/hostname": "node-b"})
    cluster = Cluster(**{**cluster.__dict__, "pods": [pod], "templates": [template("t", "gpu-x")]})
    report = build_report(cluster, DRIVER, node="node-b")
    assert {g.node for g in report.gpus} == {"node-b"}
    assert all(g.mode == "idle" for g in report.gpus)
    nowhere = build_report(cluster, DRIVER, node="nosuch")
    assert nowhere.gpus == [] and nowhere.pending == []
    assert render_table(nowhere).splitlines()[0] == "no GPUs of this driver on node nosuch"


def test_table_and_json_output() -> None:
    pod = pending_pod("big", claims={"gpu": "big"})
    report = build_report(
        busy_cluster(claims=[unallocated("big", "gpu-full", "8")], pods=[pod]), DRIVER
    )
    text = render_table(report)
    lines = text.splitlines()
    assert lines[0].split() == [
        "NODE",
        "GPU",
        "NAME",
        "MODE",
        "TIER",
        "MEMORY",
        "PROMISED",
        "FREE",
        "TAINTS",
    ]
    assert lines[1].split() == [
        "node-a",
        "0",
        "NVIDIA",
        "H200",
        "time-slicing",
        "hard",
        "139.7Gi",
        "69.8Gi",
        "69.8Gi",
        "-",
    ]
    # Columns align: every GPU row's MODE starts where its header does.
    assert lines[2].index("sm-sharing") == lines[0].index("MODE")
    assert "default/q1" in text and "p1" in text
    assert f"default/big  gpu-full  {NO_MEMORY}:" in text
    doc = json.loads(render_json(report))
    assert list(doc) == ["gpus", "pending", "usageUnknown"]
    assert doc["gpus"][0]["promisedBytes"] == 2 * QUARTER
    assert doc["gpus"][0]["claims"][0]["fraction"] == "quarter"
    assert doc["pending"][0]["reason"] == NO_MEMORY
    assert render_json(report) == render_json(report)


CAPACITY_SM_CONFIG = {
    "apiVersion": "gpu-fraction.dra.dev/v1alpha1",
    "kind": "NodeConfig",
    "defaults": {"fractionModel": "capacity", "computeMode": "sm-sharing"},
    "capacity": {"default": "8Gi"},
}


def test_capacity_request_without_memory_is_sized_at_the_published_default() -> None:
    """A capacity claim that names no memory consumes the published default (the scheduler's
    rule), not the whole card: it was reported not-enough-memory beside GPUs with room."""
    published = slices("node-a", CAPACITY_SM_CONFIG)
    policy = next(
        d["capacity"]["memory"]["requestPolicy"]
        for s in published
        for d in s["spec"].get("devices", [])
    )
    assert policy["default"] == "8Gi"  # what the scheduler gives a claim that names no memory
    # Each GPU holds a 40Gi claim: ~99.8Gi free on each, plenty for the 8Gi default.
    claims = [
        allocated(
            f"m{i}",
            "gpu-memory-sm-sharing",
            i,
            None,
            "sm-sharing",
            f"p{i}",
            config=CAPACITY_SM_CONFIG,
        )
        for i in (0, 1)
    ]
    claims.append(unallocated("new", "gpu-memory-sm-sharing"))  # no capacity request
    cluster = Cluster(
        slices=published,
        claims=claims,
        classes=shipped_classes(),  # classes depend on products and modes only
        pods=[pending_pod("w", claims={"gpu": "new"})],
        nodes=[node("node-a")],
    )
    [pending] = build_report(cluster, DRIVER).pending
    assert pending.reason != NO_MEMORY, pending.detail
