"""The published model with the real scheduler: the compute mode follows the claims per GPU,
the class alone chooses the size, quota per product, extended resources.

Mode and packing tests run on kubelet-less nodes of this test (:class:`VirtualNode`): the real
kube-scheduler allocates the claims exactly as on a real node, and nothing needs to run. The
DeviceClasses and the sizing admission policy are the ones the session's chart installed.
Extended resources run on the session's real nodes (kubelet, containerd, the plugin installed
by the chart).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    DEVICE_NAME,
    DRIVER,
    E2E,
    TIME_SLICING_GPUS,
    VirtualNode,
    check_prepared,
    raw,
    unschedulable,
    wait_for,
)

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]


def _pending(e2e: E2E, pod: str) -> dict[str, Any]:
    return wait_for(f"pod {pod} unschedulable", lambda: unschedulable(e2e, pod), timeout=60)


def test_one_gpu_takes_one_mode_at_a_time(e2e: E2E, vnodes: list[VirtualNode]) -> None:
    node = VirtualNode(e2e, gpus=1)
    vnodes.append(node)
    node.pod("ts", "gpu-quarter")
    wait_for("time-slicing pod scheduled", lambda: node.scheduled("ts"), timeout=60)
    node.pod("sm", "gpu-quarter-sm-sharing")
    condition = _pending(e2e, "sm")
    assert "cannot allocate all claims" in condition.get("message", ""), condition
    assert node.modes_per_gpu() == {0: {"time-slicing"}}
    node.pod("ts2", "gpu-half")
    wait_for("second time-slicing pod shares the GPU", lambda: node.scheduled("ts2"), timeout=60)
    assert not node.scheduled("sm")
    node.remove("ts")
    node.remove("ts2")
    wait_for("sm-sharing pod scheduled once the GPU is free", lambda: node.scheduled("sm"), 90)
    assert node.modes_per_gpu() == {0: {"sm-sharing"}}


def test_two_gpus_run_both_modes_on_different_gpus(e2e: E2E, vnodes: list[VirtualNode]) -> None:
    node = VirtualNode(e2e, gpus=2)
    vnodes.append(node)
    node.pod("ts", "gpu-quarter")
    node.pod("sm", "gpu-quarter-sm-sharing")
    for pod in ("ts", "sm"):
        wait_for(f"pod {pod} scheduled", lambda p=pod: node.scheduled(p), timeout=60)
    modes = node.modes_per_gpu()
    assert sorted(modes) == [0, 1]
    assert sorted(m for s in modes.values() for m in s) == ["sm-sharing", "time-slicing"]
    assert all(len(s) == 1 for s in modes.values()), modes


def test_class_alone_chooses_the_size_and_sizes_mix_on_a_gpu(
    e2e: E2E, vnodes: list[VirtualNode]
) -> None:
    node = VirtualNode(e2e, gpus=1)
    vnodes.append(node)
    for pod, cls in (("half", "gpu-half"), ("q1", "gpu-quarter"), ("q2", "gpu-quarter")):
        node.pod(pod, cls)
        wait_for(f"pod {pod} scheduled", lambda p=pod: node.scheduled(p), timeout=60)
    slots = sorted(s for results in node.allocations().values() for _, _, s in results)
    assert slots == ["2", "2", "4"]
    node.pod("eighth", "gpu-eighth")
    _pending(e2e, "eighth")  # the card is full: 4 + 2 + 2 of 8 slots
    claim = e2e.claim_of("q1")
    request = claim["spec"]["devices"]["requests"][0]["exactly"]
    assert request["capacity"] == {"requests": {"slots": "2"}}


def test_random_churn_never_puts_both_modes_on_a_gpu(e2e: E2E, vnodes: list[VirtualNode]) -> None:
    node = VirtualNode(e2e, gpus=2)
    vnodes.append(node)
    rng = random.Random(11)
    classes = ["gpu-quarter", "gpu-half", "gpu-quarter-sm-sharing", "gpu-half-sm-sharing"]
    live: list[str] = []
    scheduled_any = {"time-slicing": False, "sm-sharing": False}
    for step in range(24):
        if live and (len(live) >= 6 or rng.random() < 0.4):
            node.remove(live.pop(rng.randrange(len(live))))
        else:
            name = f"p{step}"
            node.pod(name, rng.choice(classes))
            live.append(name)
        wait_for(
            f"step {step}: every pod scheduled or unschedulable",
            lambda: all(node.scheduled(p) or unschedulable(e2e, p) for p in live),
            timeout=60,
        )
        modes = node.modes_per_gpu()
        assert all(len(m) == 1 for m in modes.values()), (step, modes)
        for m in modes.values():
            scheduled_any.update(dict.fromkeys(m, True))
    assert all(scheduled_any.values()), scheduled_any


def test_quota_per_product_admits_four_quarters_and_refuses_the_fifth(e2e: E2E) -> None:
    key = "gpu-quarter.deviceclass.resource.k8s.io/devices"
    e2e.quota("quarters", {key: "4"})
    for i in range(4):
        e2e.claim(f"q{i}", "gpu-quarter")
    with pytest.raises(ApiException) as refused:
        e2e.claim("q4", "gpu-quarter")
    assert refused.value.status == 403
    assert "exceeded quota" in str(refused.value.body)
    e2e.claim("h0", "gpu-half")  # another product is not counted against the quarters


def test_extended_resource_pod_gets_a_quarter_on_a_real_node(e2e: E2E) -> None:
    node = next(n for n in e2e.nodes)
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": node.name},
        "containers": [{"name": "main", "resources": {"limits": {f"{DRIVER}/quarter": "1"}}}],
    }
    e2e.create_pod("er", spec)
    e2e.wait_running("er", timeout=90)
    pod = e2e.read_pod("er")
    claim_name = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    claim = raw(
        e2e.res.read_namespaced_resource_claim(claim_name, e2e.namespace, _preload_content=False)
    )
    [result] = claim["status"]["allocation"]["devices"]["results"]
    m = DEVICE_NAME.fullmatch(result["device"])
    assert m and int(m["gpu"]) in TIME_SLICING_GPUS and result["device"].endswith("-quarter")
    assert result["consumedCapacity"] == {"slots": "2"}
    view = e2e.view("er")
    card = 143_131 * 2**20  # simulated H200: 143131 MiB
    assert view.env["NVIDIA_GPU_MEMORY_LIMIT"] == str(card // 4 // 2**20)
    assert node.cdi_spec_path(claim["metadata"]["uid"]).exists()
    _release(e2e, "er", claim_name)


def _release(e2e: E2E, pod: str, claim_name: str) -> None:
    """Delete the pod and wait until the scheduler-made claim is gone too: its extended-
    resource device holds the GPU's counter, so a later test pinned to that GPU would wait."""
    e2e.delete_pod(pod)
    e2e.wait_gone(pod)

    def gone() -> bool:
        try:
            e2e.res.read_namespaced_resource_claim(claim_name, e2e.namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(f"claim {claim_name} deleted", gone, timeout=60)


def test_extended_resource_quota(e2e: E2E) -> None:
    key = f"requests.{DRIVER}/quarter"
    e2e.quota("er", {key: "1"})
    node = next(n for n in e2e.nodes)
    limits = {"limits": {f"{DRIVER}/quarter": "1"}}
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": node.name},
        "containers": [{"name": "main", "resources": limits}],
    }
    e2e.create_pod("er1", spec)
    with pytest.raises(ApiException) as refused:
        e2e.create_pod("er2", spec)
    assert refused.value.status == 403 and "exceeded quota" in str(refused.value.body)
    e2e.wait_running("er1", timeout=90)
    status = e2e.read_pod("er1")["status"]["extendedResourceClaimStatus"]
    _release(e2e, "er1", status["resourceClaimName"])


def test_template_claim_on_a_real_node_is_sized_by_its_class(e2e: E2E) -> None:
    node = next(n for n in e2e.nodes)
    e2e.template("quarter", "gpu-quarter")
    e2e.pod("q", node, templates={"gpu": "quarter"})
    e2e.wait_running("q", timeout=90)
    got = check_prepared(e2e, "q")
    [result] = got.results
    assert result["consumedCapacity"] == {"slots": "2"} and "shareID" in result
    card = 143_131 * 2**20
    assert got.view.env["NVIDIA_GPU_MEMORY_LIMIT"] == str(card // 4 // 2**20)
