"""End to end, what the control plane decides with the plugin's slices: ResourceQuota on a
device class's device count, and pods that do not fit the node's GPU memory staying Pending."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import E2E, check_prepared, raw, unschedulable, wait_for  # noqa: E402

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]


ON_GPU = 'device.attributes["gpu-fraction.dra.dev"].index == {}'


def test_quota_on_device_class_devices(e2e: E2E) -> None:
    node = e2e.nodes[1]
    key = "gpu-quarter.deviceclass.resource.k8s.io/devices"
    # Returns once quota admission enforces it, not merely once its status is set: the flake
    # of this test (a third claim admitted under a quota of 2, 1 run in 4 on a loaded machine)
    # was two claims admitted while the admission's informer had not seen the quota's status.
    e2e.quota("gpus", {key: "2"})

    def quota(field: str) -> str | None:
        q = raw(
            e2e.core.read_namespaced_resource_quota("gpus", e2e.namespace, _preload_content=False)
        )
        value: str | None = (q.get("status") or {}).get(field, {}).get(key)
        return value

    e2e.claim("q-0", "gpu-quarter")
    e2e.claim("q-1", "gpu-quarter")
    with pytest.raises(ApiException) as refused:
        e2e.claim("q-2", "gpu-quarter")
    assert refused.value.status == 403
    body = str(refused.value.body)
    assert "exceeded quota: gpus" in body and key in body
    # Other classes are not limited by it.
    e2e.claim("h-0", "gpu-half")
    wait_for("quota usage 2", lambda: quota("used") == "2")

    # The admitted claims run, both in one pod (claims referenced by name).
    e2e.pod("two", node, claims={"a": "q-0", "b": "q-1"})
    e2e.wait_running("two")
    a = check_prepared(e2e, "two", "a")
    b = check_prepared(e2e, "two", "b")
    # Two shares (of one GPU's shared device or of two GPUs), never one share twice.
    assert (a.results[0]["device"], a.results[0]["shareID"]) != (
        b.results[0]["device"],
        b.results[0]["shareID"],
    )
    # A template-made claim over quota: the pod never gets it and says why.
    e2e.template("q", "gpu-quarter")
    e2e.pod("over", node, templates={"gpu": "q"})

    def quota_event() -> str | None:
        return next(
            (e["message"] for e in e2e.events("over") if "exceeded quota" in e["message"]), None
        )

    message = wait_for("the resourceclaim controller's quota event", quota_event)
    assert key in message
    assert not e2e.read_pod("over")["spec"].get("nodeName")

    e2e.delete_pod("two")
    e2e.wait_gone("two")
    wait_for("claims unprepared", lambda: not a.spec_path.exists() and not b.spec_path.exists())


def test_pod_beyond_the_gpu_memory_stays_pending(e2e: E2E) -> None:
    node = e2e.nodes[1]
    e2e.template("full", "gpu-full", selectors=[ON_GPU.format(3)])
    e2e.template("eighth", "gpu-eighth", selectors=[ON_GPU.format(3)])
    e2e.pod("big", node, templates={"gpu": "full"})
    e2e.wait_running("big")
    big = check_prepared(e2e, "big")

    e2e.pod("small", node, templates={"gpu": "eighth"})
    condition = wait_for("small Unschedulable", lambda: unschedulable(e2e, "small"))
    assert "cannot allocate all claims" in str(condition.get("message")), condition
    pod = e2e.read_pod("small")
    assert not pod["spec"].get("nodeName")
    assert pod["status"]["phase"] == "Pending"
    assert e2e.prepared_here()[node.name] == [big.uid]

    # Memory comes back when the big pod goes: the small one is scheduled and prepared.
    e2e.delete_pod("big")
    e2e.wait_gone("big")
    wait_for("the claim unprepared", lambda: not big.spec_path.exists())
    e2e.wait_running("small", timeout=60)
    check_prepared(e2e, "small")
