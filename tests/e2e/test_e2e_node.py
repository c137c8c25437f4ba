"""End to end, the plugin's life on a real node: what the kubelet's unprepare leaves, pipe
directories per claim, running pods across a plugin SIGKILL, a kubelet restart and a
``helm upgrade`` that rolls the DaemonSet, and a lost GPU reaching the kubelet (health) and
the scheduler (device taints)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    DRIVER,
    E2E,
    LOCAL_NODE,
    REPO,
    Driver,
    GpuNode,
    PreparedClaim,
    attr,
    check_prepared,
    claim_spec,
    pool_complete,
    slice_devices,
    unschedulable,
    wait_for,
)

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

ON_GPU = 'device.attributes["gpu-fraction.dra.dev"].index == {}'
TAINT_RULE_EXAMPLE = REPO / "docs" / "examples" / "device-taint-rule.yaml"


def container_ids(e2e: E2E, pod: str) -> list[tuple[str, int]]:
    statuses = e2e.read_pod(pod)["status"]["containerStatuses"]
    return [(s["containerID"], s["restartCount"]) for s in statuses]


def start(e2e: E2E, node: GpuNode, name: str, device_class: str = "gpu-eighth") -> PreparedClaim:
    e2e.template(name, device_class, selectors=[ON_GPU.format(0)])
    e2e.pod(name, node, templates={"gpu": name})
    e2e.wait_running(name)
    return check_prepared(e2e, name)


def unprepared(e2e: E2E, got: PreparedClaim) -> None:
    wait_for(
        f"claim {got.uid} unprepared",
        lambda: not got.spec_path.exists() and got.uid not in got.node.plugin_checkpoint(),
    )
    assert not any(p.exists() for p in got.pipe_dirs())


def test_deleting_a_pod_leaves_nothing(e2e: E2E) -> None:
    node = e2e.nodes[0]
    got = start(e2e, node, "gone")
    assert got.pipe_dirs() and all(p.is_dir() for p in got.pipe_dirs())
    e2e.delete_pod("gone")
    e2e.wait_gone("gone")
    unprepared(e2e, got)
    assert not [p for p in node.pipe_dirs() if got.uid.replace("-", "_") in p.name]


def test_two_pods_on_one_gpu_get_separate_pipe_directories(e2e: E2E) -> None:
    node = e2e.nodes[0]
    a = start(e2e, node, "a")
    b = start(e2e, node, "b")
    assert a.results[0]["device"].split("-")[1] == b.results[0]["device"].split("-")[1] == "0"
    assert a.view.devices == b.view.devices  # the same GPU
    assert a.pipe_dirs() != b.pipe_dirs()
    assert a.view.mounts != b.view.mounts
    assert a.uid.replace("-", "_") in a.view.mounts[0]
    assert b.uid.replace("-", "_") in b.view.mounts[0]


def wait_plugin_back(e2e: E2E, node: GpuNode, old_pids: list[int]) -> None:
    wait_for(
        f"a new plugin process on {node.name}",
        lambda: node.plugin_pids() and not set(node.plugin_pids()) & set(old_pids),
        timeout=60,
    )
    wait_for("slices published", lambda: pool_complete(e2e.slices(node.name)), timeout=30)


def after_disruption(e2e: E2E, node: GpuNode, before: PreparedClaim, ids: Any) -> None:
    """The pod of ``before`` still runs untouched; a new pod prepares; deleting the old pod
    unprepares the claim that was prepared before the disruption."""
    assert e2e.read_pod("before")["status"]["phase"] == "Running"
    assert container_ids(e2e, "before") == ids
    assert before.spec_path.exists() and before.uid in node.plugin_checkpoint()
    after = start(e2e, node, "after")
    assert after.uid != before.uid
    e2e.delete_pod("before")
    e2e.wait_gone("before")
    unprepared(e2e, before)
    assert after.spec_path.exists()


def test_plugin_killed_with_sigkill_while_pods_run(e2e: E2E) -> None:
    node = e2e.nodes[1]
    before = start(e2e, node, "before")
    ids = container_ids(e2e, "before")
    killed = node.kill_plugin()
    assert killed, "no plugin process found"
    wait_plugin_back(e2e, node, killed)
    after_disruption(e2e, node, before, ids)


def test_kubelet_restart_while_pods_run(e2e: E2E) -> None:
    node = e2e.nodes[1]
    before = start(e2e, node, "before")
    ids = container_ids(e2e, "before")
    subprocess.run(
        [sys.executable, str(LOCAL_NODE), "restart-kubelet", node.name],
        env={**os.environ, "LOCAL_CLUSTER_DIR": str(node.root.parents[1])},
        check=True,
        timeout=120,
    )
    # The restarted kubelet finds the plugin's socket again and republishes nothing itself;
    # the plugin's slices stay or come back.
    wait_for("slices published", lambda: pool_complete(e2e.slices(node.name)), timeout=60)
    after_disruption(e2e, node, before, ids)


def test_helm_upgrade_rolls_the_plugin_while_pods_run(e2e: E2E, driver: Driver) -> None:
    node = e2e.nodes[0]
    before = start(e2e, node, "before")
    ids = container_ids(e2e, "before")
    old = {p["metadata"]["uid"] for p in driver.plugin_pods()}
    t0 = time.monotonic()
    driver.upgrade(logLevel="info")
    driver.wait_rolled_out(timeout=120)
    rollout = time.monotonic() - t0
    new = {p["metadata"]["uid"] for p in driver.plugin_pods()}
    assert not old & new, "every plugin pod is replaced"
    print(f"DaemonSet rollout on helm upgrade: {rollout:.1f}s")
    after_disruption(e2e, node, before, ids)


def test_lost_gpu_reaches_the_pod_status_through_the_kubelet(e2e: E2E) -> None:
    """The health stream reaches the real kubelet: when the GPU behind a running claim is lost,
    the kubelet (ResourceHealthStatus, beta and on in 1.37) marks the claim's device Unhealthy
    in the container's ``allocatedResourcesStatus``; when it is back, Healthy again."""
    node = e2e.nodes[0]
    e2e.template("h", "gpu-eighth", selectors=[ON_GPU.format(2)])
    e2e.pod("h", node, templates={"gpu": "h"})
    e2e.wait_running("h")
    got = check_prepared(e2e, "h")
    lost = node.state_dir / "simulated" / "lost-gpus"

    def health() -> dict[str, str]:
        status = e2e.read_pod("h")["status"]["containerStatuses"][0]
        return {
            r["resourceID"]: r.get("health", "")
            for entry in status.get("allocatedResourcesStatus") or []
            for r in entry.get("resources") or []
        }

    try:
        lost.write_text("2\n")
        unhealthy = wait_for(
            "the kubelet to report the device Unhealthy",
            lambda: {k: v for k, v in health().items() if v == "Unhealthy"},
            timeout=90,
            every=1,
        )
        assert any(got.results[0]["device"] in k for k in unhealthy), unhealthy
        assert e2e.read_pod("h")["status"]["phase"] == "Running"  # not evicted by the driver
    finally:
        lost.unlink(missing_ok=True)
    wait_for(
        "the device Healthy again",
        lambda: health() and all(v == "Healthy" for v in health().values()),
        timeout=90,
        every=1,
    )


TAINT_KEY = f"{DRIVER}/gpu-unhealthy"


def gpu_taints(e2e: E2E, node: GpuNode) -> dict[int, list[list[dict[str, Any]]]]:
    """GPU index -> the ``taints`` of each of its devices in the node's (complete) pool."""
    slices = e2e.slices(node.name)
    if not pool_complete(slices):
        return {}
    out: dict[int, list[list[dict[str, Any]]]] = {}
    for device in slice_devices(slices).values():
        out.setdefault(attr(device, "index"), []).append(device.get("taints") or [])
    return out


def allocation(e2e: E2E, pod: str) -> dict[str, Any] | None:
    """The allocation of the pod's claim ``gpu``, or None (no claim yet, or not allocated)."""
    statuses = e2e.read_pod(pod)["status"].get("resourceClaimStatuses") or []
    if not any(s["name"] == "gpu" for s in statuses):
        return None
    found: dict[str, Any] | None = (e2e.claim_of(pod).get("status") or {}).get("allocation")
    return found


def test_lost_gpu_taints_its_devices_for_the_scheduler(e2e: E2E) -> None:
    """A lost GPU's devices stay published with a NoSchedule taint: the real scheduler leaves a
    claim pinned to it unallocated while a claim tolerating the taint gets it; republishing
    the same taint writes nothing; when the GPU is back the taint goes and the pending pod
    runs. DeviceTaintRule (docs' NoExecute example) is served as resource.k8s.io/v1."""
    node, gpu = e2e.nodes[0], 1
    lost = node.state_dir / "simulated" / "lost-gpus"
    started = time.monotonic()
    try:
        lost.write_text(f"{gpu}\n")
        tainted = wait_for(
            f"the devices of GPU {gpu} tainted",
            lambda: (t := gpu_taints(e2e, node)) and t[gpu] and all(t[gpu]) and t,
            timeout=30,
        )
        print(f"taint published {time.monotonic() - started:.1f}s after the GPU was lost")
        for taints in tainted[gpu]:
            (taint,) = taints
            assert taint.pop("timeAdded")
            assert taint == {"key": TAINT_KEY, "value": "gpu-lost", "effect": "NoSchedule"}
        assert all(t == [] for i, ts in tainted.items() if i != gpu for t in ts)
        versions = {s["metadata"]["resourceVersion"] for s in e2e.slices(node.name)}
        e2e.template("pinned", "gpu-eighth", selectors=[ON_GPU.format(gpu)])
        e2e.pod("pinned", node, templates={"gpu": "pinned"})
        spec = claim_spec("gpu-eighth", None, None, [ON_GPU.format(gpu)], None, None)
        spec["devices"]["requests"][0]["exactly"]["tolerations"] = [
            {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
        ]
        e2e.res.create_namespaced_resource_claim_template(
            e2e.namespace,
            k8s.V1ResourceClaimTemplate.from_dict(
                {"metadata": {"name": "tolerant"}, "spec": {"spec": spec}}
            ),
        )
        e2e.pod("tolerant", node, templates={"gpu": "tolerant"})
        allocated = wait_for("the tolerating claim allocated", lambda: allocation(e2e, "tolerant"))
        (result,) = allocated["devices"]["results"]
        assert result["pool"] == node.name and result["device"].startswith(f"gpu-{gpu}-")
        wait_for("the pinned pod unschedulable", lambda: unschedulable(e2e, "pinned"))
        assert not e2e.read_pod("pinned")["spec"].get("nodeName")
        assert not allocation(e2e, "pinned")
        # A publish round (5 s in e2e) later, the unchanged taint has caused no write.
        time.sleep(6)
        assert {s["metadata"]["resourceVersion"] for s in e2e.slices(node.name)} == versions
        # ... and the server stored the taint as sent (no "stored ... different" warning).
        log = e2e.driver.plugin_log(node.name, 400)
        assert "resource slices published" in log and "different from the one sent" not in log
        check_taint_rule_example(e2e, node)
    finally:
        lost.unlink(missing_ok=True)
    healed = time.monotonic()
    wait_for(
        "the taint removed",
        lambda: (t := gpu_taints(e2e, node)) and not any(x for ts in t.values() for x in ts),
        timeout=30,
    )
    print(f"taint removed {time.monotonic() - healed:.1f}s after the GPU was back")
    e2e.wait_running("pinned", timeout=60)
    got = check_prepared(e2e, "pinned")
    assert got.results[0]["device"].startswith(f"gpu-{gpu}-")
    print(f"lost GPU taint round trip: {time.monotonic() - started:.1f}s")


def check_taint_rule_example(e2e: E2E, node: GpuNode) -> None:
    """The admin guide's DeviceTaintRule, made for this node, is accepted (dry run) by the API
    server as resource.k8s.io/v1."""
    rule = yaml.safe_load(TAINT_RULE_EXAMPLE.read_text())
    assert rule["apiVersion"] == "resource.k8s.io/v1"
    rule["spec"]["deviceSelector"]["pool"] = node.name
    created = k8s.ResourceV1Api(e2e.api).create_device_taint_rule(
        k8s.V1DeviceTaintRule.from_dict(rule), dry_run="All"
    )
    assert created.spec.taint.effect == "NoExecute"


def test_image_pulls_never_leave_the_machine(e2e: E2E) -> None:
    """No registry is reachable: a node resolves every registry to a closed loopback port, so
    an image that was not imported fails at once, and no pull goes out of the machine."""
    body = {
        "nodeSelector": {"kubernetes.io/hostname": e2e.nodes[0].name},
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {"name": "c", "image": "registry.example/absent:1", "imagePullPolicy": "Always"}
        ],
    }
    e2e.core.create_namespaced_pod(
        e2e.namespace, k8s.V1Pod.from_dict({"metadata": {"name": "pull"}, "spec": body})
    )
    message = wait_for(
        "a failed pull",
        lambda: next(
            (e["message"] for e in e2e.events("pull") if "Failed to pull image" in e["message"]),
            None,
        ),
    )
    assert "127.0.0.1:9" in message and "connection refused" in message, message
