"""End to end, the shipped examples (manifests/examples): each example's DeviceClass and
ResourceClaimTemplate are applied as shipped, a pod built from its workload's pod template is
placed by the real scheduler on a real node, the plugin prepares its claim through the real
kubelet, and the container sees its fraction.

The workload's pod template is used as is except for the image and command (the tenant image:
it prints what it sees, then runs the tenant probe, which attaches to the claim's MPS namespace
as a CUDA client would: no GPU code runs here) and a node selector pinning it to one node. The
probe's own line must show the memory limit the claim's status reports and, on sm-sharing, its
active thread percentage. The quota example is applied and enforced as shipped."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    DRIVER,
    E2E,
    GpuNode,
    check_prepared,
    wait_for,
    wait_quota_enforced,
)

from dra_driver.enforce.rules.names import memory_arg, parse_memory  # noqa: E402

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
WORKLOADS = ("Deployment", "Job", "Pod", "StatefulSet")
EXAMPLE_FILES = sorted(p.name for p in EXAMPLES.glob("*.yaml") if not p.name.startswith("quota"))


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def pod_template(workload: dict[str, Any]) -> dict[str, Any]:
    if workload["kind"] == "Pod":
        return {"metadata": workload.get("metadata", {}), "spec": workload["spec"]}
    template: dict[str, Any] = workload["spec"]["template"]
    return template


def run_pod(e2e: E2E, node: GpuNode, workload: dict[str, Any]) -> str:
    spec = dict(pod_template(workload)["spec"])
    spec["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    spec.pop("restartPolicy", None)
    name = workload["metadata"]["name"]
    e2e.create_pod(name, spec, probe=True)
    return name


def check_probe(e2e: E2E, pod: str, pod_claim: str) -> None:
    """The tenant probe of the container using ``pod_claim`` attached to an MPS server whose
    namespace holds the limit the claim's status reports and its active thread percentage
    (sm-sharing: the claim's, time-slicing: 100)."""
    container = e2e.container_of(pod, pod_claim)
    line = wait_for(f"{pod} probe attached", lambda: e2e.attached(pod, container), timeout=60)
    entries = wait_for(
        f"{pod}'s claim status",
        lambda: [
            d["data"]
            for d in (e2e.claim_of(pod, pod_claim).get("status") or {}).get("devices") or []
            if d["driver"] == DRIVER
        ],
    )
    limits = {parse_memory(memory_arg(d["memory"]["limitBytes"])) for d in entries}
    assert parse_memory(line["pinned_memory_limit"]) in limits, (line, limits)
    # time-slicing: every SM (MPS's 100 %); sm-sharing: the claim's percentage
    threads = {str(d.get("activeThreadPercentage", 100)) for d in entries}
    assert line["active_thread_percentage"] in threads, (line, threads)


@pytest.mark.parametrize("example", EXAMPLE_FILES)
def test_example_is_allocated_and_prepared(e2e: E2E, example: str) -> None:
    example_node = e2e.nodes[EXAMPLE_FILES.index(example) % len(e2e.nodes)]
    classes: list[str] = []
    workloads: list[dict[str, Any]] = []
    try:
        for doc in docs(example):
            if doc["kind"] == "DeviceClass":
                with contextlib.suppress(ApiException):
                    e2e.res.delete_device_class(doc["metadata"]["name"])
                e2e.res.create_device_class(k8s.V1DeviceClass.from_dict(doc))
                classes.append(doc["metadata"]["name"])
            elif doc["kind"] == "ResourceClaimTemplate":
                e2e.res.create_namespaced_resource_claim_template(
                    e2e.namespace, k8s.V1ResourceClaimTemplate.from_dict(doc)
                )
            elif doc["kind"] in WORKLOADS:
                workloads.append(doc)
        assert workloads, f"{example} has no workload"
        for workload in workloads:
            pod = run_pod(e2e, example_node, workload)
            e2e.wait_running(pod, timeout=60)
            for ref in pod_template(workload)["spec"]["resourceClaims"]:
                prepared = check_prepared(e2e, pod, ref["name"])
                gpus = {r["device"].split("-")[1] for r in prepared.results}
                assert len(gpus) == len(prepared.results) or len(prepared.results) == 1
                # The container sees one device node per allocated GPU.
                seen = [d for d in prepared.view.devices if d[len("/dev/nvidia") :].isdigit()]
                assert len(seen) == len(gpus), (seen, gpus)
                check_probe(e2e, pod, ref["name"])
    finally:
        for name in classes:
            with contextlib.suppress(ApiException):
                e2e.res.delete_device_class(name)


def test_quota_example_admits_four_quarters_and_refuses_the_fifth(e2e: E2E) -> None:
    [quota] = docs("quota-four-quarters.yaml")
    e2e.core.create_namespaced_resource_quota(e2e.namespace, k8s.V1ResourceQuota.from_dict(quota))
    wait_quota_enforced(e2e, quota["metadata"]["name"], quota["spec"]["hard"])

    def claim(i: int) -> Any:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"q{i}"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu-quarter"}}]
                }
            },
        }
        return e2e.res.create_namespaced_resource_claim(
            e2e.namespace, k8s.ResourceV1ResourceClaim.from_dict(body)
        )

    for i in range(4):
        claim(i)
    with pytest.raises(ApiException) as refused:
        claim(4)
    assert refused.value.status == 403
    assert "exceeded quota" in str(refused.value.body)
