"""Pods written for the KAI scheduler's fractions run here unchanged (issue 27, part 2): the
session's release upgraded with ``kaiCompat.enabled`` (its template in the test's namespace)
and the burst NVIDIA's two NvFractions examples ask for allowed by an admin (classLimits);
each example pod, as written for KAI (annotations, ``schedulerName: kai-scheduler``), is
translated at admission, scheduled by the default scheduler, prepared by the plugin on the
real node, and its container sees the memory it asked for (guaranteed and ceiling), its
compute mode and its number of GPUs. Prints ``KAI-E2E | ...`` lines."""

from __future__ import annotations

import json
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    CAPACITY_GPUS,
    CLASS_LIMITS,
    E2E,
    TIME_SLICING_GPUS,
    attr,
    check_prepared,
    slice_devices,
    wait_for,
)

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

MIB = 1 << 20
TEMPLATE = "gpu-fraction-kai"
INFERENCE = {
    # NVIDIA's NvFractions inference example: 40Gi guaranteed and up to 60Gi on each of 4
    # GPUs, sm-sharing
    "nvidia.com/container.server.gpu-memory.request": "40Gi",
    "nvidia.com/container.server.gpu-memory.limit": "60Gi",
    "nvidia.com/container.server.gpu-compute.mode": "sm-sharing",
    "gpu-fraction-num-devices": "4",
}
JOB = {
    # NVIDIA's gpu-fraction job example: half of each of 2 GPUs, ceiling 0.8 of a card
    "gpu-fraction": "0.5",
    "gpu-fraction.limit": "0.8",
    "gpu-fraction-num-devices": "2",
}
BURST = {
    "gpu-memory-sm-sharing": {"maxMemoryLimit": "60Gi"},
    "gpu-half": {"maxMemoryLimitPortion": "0.8"},
}


@pytest.fixture
def kai(e2e: E2E) -> Iterator[E2E]:
    """The release with KAI compatibility on for the test's namespace, and back after."""
    before = e2e.driver.values()
    e2e.driver.upgrade(
        kaiCompat={"enabled": True, "namespaces": [e2e.namespace]},
        classLimits={**CLASS_LIMITS, **BURST},
    )
    try:
        wait_for(
            f"template {TEMPLATE}",
            lambda: TEMPLATE
            in [t.metadata.name for t in e2e.res.list_namespaced_resource_claim_template(
                e2e.namespace).items],
            timeout=30,
        )  # fmt: skip
        yield e2e
    finally:
        e2e.driver.upgrade(
            kaiCompat=before.get("kaiCompat", {"enabled": False}),
            classLimits=before["classLimits"],
        )


def kai_pod(e2e: E2E, name: str, annotations: dict[str, str], containers: list[str]) -> None:
    """Create the pod as written for KAI (its scheduler, its annotations), on node 0, once the
    API server's policies translate it (a policy is in effect shortly after helm made it)."""
    spec = {
        "schedulerName": "kai-scheduler",
        "nodeSelector": {"kubernetes.io/hostname": e2e.nodes[0].name},
        "containers": [{"name": c} for c in containers],
    }

    def translated() -> bool:
        try:
            pod = e2e.create_pod(name, spec, annotations=annotations)
        except ApiException as exc:
            # the validating policy in effect before the mutating one
            if "were not translated" in str(exc.body):
                return False
            raise
        if pod["spec"].get("resourceClaims"):
            return True
        e2e.delete_pod(name, grace=0)
        e2e.wait_gone(name)
        return False

    wait_for(f"pod {name} translated at admission", translated, timeout=30, every=1.0)


def kai_claim_name(e2e: E2E, pod: str) -> str:
    (ref,) = e2e.read_pod(pod)["spec"]["resourceClaims"]
    name: str = ref["name"]
    assert name.startswith("kai-") and ref["resourceClaimTemplateName"] == TEMPLATE
    return name


def show(what: str, annotations: dict[str, str], result: dict[str, Any]) -> None:
    print(f"\nKAI-E2E | {what} | {json.dumps(annotations)} | {json.dumps(result)}")


def test_nvidia_inference_example_runs_unchanged(kai: E2E) -> None:
    e2e = kai
    kai_pod(e2e, "inference", INFERENCE, ["server", "metrics"])
    e2e.wait_running("inference", timeout=90)
    pod = e2e.read_pod("inference")
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    claim_name = kai_claim_name(e2e, "inference")
    got = check_prepared(e2e, "inference", claim_name)
    assert got.claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == (
        "gpu-memory-sm-sharing"
    )
    devices = slice_devices(e2e.slices(e2e.nodes[0].name))
    gpus = sorted(int(attr(devices[r["device"]], "index")) for r in got.results)
    # four distinct GPUs of the node's capacity, sm-sharing GPUs; 40Gi reserved on each
    assert gpus == list(CAPACITY_GPUS)
    assert {r["consumedCapacity"]["memory"] for r in got.results} == {"40Gi"}
    env = got.view.env
    assert env["GPU_FRACTION_COMPUTE_MODE"] == "sm-sharing"
    assert env["NVIDIA_GPU_MEMORY_REQUEST"] == str(40 * 1024)
    assert env["NVIDIA_GPU_MEMORY_LIMIT"] == str(60 * 1024)
    # the claim is the named container's only: the other one sees no GPU
    other = e2e.view("inference", "metrics")
    assert not [d for d in other.devices if d[len("/dev/nvidia") :].isdigit()], other.devices
    show("inference", INFERENCE, {"pod claim": claim_name, "GPUs": gpus, "env": env})
    e2e.delete_pod("inference")
    e2e.wait_gone("inference")
    wait_for("the claim unprepared", lambda: not got.spec_path.exists())


def test_nvidia_gpu_fraction_job_example_runs_unchanged(kai: E2E) -> None:
    e2e = kai
    kai_pod(e2e, "job", JOB, ["train"])
    e2e.wait_running("job", timeout=90)
    claim_name = kai_claim_name(e2e, "job")
    got = check_prepared(e2e, "job", claim_name)
    devices = slice_devices(e2e.slices(e2e.nodes[0].name))
    used = [devices[r["device"]] for r in got.results]
    gpus = sorted(int(attr(d, "index")) for d in used)
    assert len(gpus) == 2 and set(gpus) <= set(TIME_SLICING_GPUS), gpus
    card = int(attr(used[0], "gpuMemory"))
    env = got.view.env
    assert env["GPU_FRACTION_COMPUTE_MODE"] == "time-slicing"
    assert env["NVIDIA_GPU_MEMORY_REQUEST"] == str(card // 2 // MIB)
    assert env["NVIDIA_GPU_MEMORY_LIMIT"] == str(int(Fraction("0.8") * card) // MIB)
    show("job", JOB, {"pod claim": claim_name, "GPUs": gpus, "env": env})
    e2e.delete_pod("job")
    e2e.wait_gone("job")
    wait_for("the claim unprepared", lambda: not got.spec_path.exists())
