"""``dra-driver occupancy`` against a real control plane (hack/local-cluster, no kubelet): a
Node and its slices published through the API, the classes and the sizing policy installed,
pods allocated by the real scheduler, one left Pending; the command runs as a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import dynamic

from devtools import chartrender
from dra_driver import DEFAULT_DRIVER_NAME as DRIVER
from dra_driver.config.node import default_node_config
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.publish.slices import build_slices
from tests.support.nodeless import local_cluster
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("OCCUPANCY_CLUSTER_DIR", "/tmp/occ-cluster"))
NODE = "occ-node"
NS = "occ"
T = TypeVar("T")


@pytest.fixture(scope="module")
def api() -> Iterator[k8s.ApiClient]:
    up = local_cluster(STATE, "up")
    try:
        if up.returncode != 0:
            pytest.fail(f"hack/local-cluster up failed:\n{up.stderr[-3000:]}")
        client = k8s_config.new_client_from_config(config_file=str(STATE / "kubeconfig"))
        yield client
        client.close()
    finally:
        local_cluster(STATE, "down")


def create(api: k8s.ApiClient, obj: dict[str, Any], namespace: str | None = None) -> None:
    dc = dynamic.DynamicClient(api)
    dc.resources.get(api_version=obj["apiVersion"], kind=obj["kind"]).create(
        body=obj, namespace=namespace
    )


def template(name: str, cls: str, gpu: int) -> dict[str, Any]:
    on = f'device.attributes["{DRIVER}"].index == {gpu}'
    exactly = {"deviceClassName": cls, "selectors": [{"cel": {"expression": on}}]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def pod(name: str, tmpl: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [
                {"name": "c", "image": "pause", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": tmpl}],
        },
    }


def install(api: k8s.ApiClient) -> None:
    """The Node, its slices, the classes, the sizing policy and the namespace."""
    create(
        api,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
            "status": {
                "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            },
        },
    )
    inventory = SimulatedGpuSource("simulated:H200x2", seed=NODE).discover()
    tiers = {g.uuid: "hard" for g in inventory.gpus}
    for obj in build_slices(inventory, default_node_config(), DRIVER, NODE, enforcement=tiers):
        create(api, obj)
    for obj in chartrender.render(chartrender.chart_values()):
        create(api, obj)
    create(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    core = k8s.CoreV1Api(api)
    wait_for(
        "ServiceAccount default", lambda: core.list_namespaced_service_account(NS).items, timeout=90
    )
    probe = template("probe", "gpu-quarter", 0)["spec"]
    probe_claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", **probe}
    probe_claim["metadata"] = {"name": "probe"}

    def sized() -> bool:
        res = k8s.ResourceV1Api(api)
        body = k8s.ResourceV1ResourceClaim.from_dict(probe_claim)
        made = res.create_namespaced_resource_claim(NS, body, dry_run="All", _preload_content=False)
        request = json.loads(made.data)["spec"]["devices"]["requests"][0]["exactly"]
        return "capacity" in request

    wait_for("the sizing policy to write slots", sized, timeout=90)


def occupancy(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "dra_driver", "occupancy", "--kubeconfig", str(STATE / "kubeconfig")]
        + list(args),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_occupancy_of_scheduled_and_pending_pods(api: k8s.ApiClient) -> None:
    install(api)
    core = k8s.CoreV1Api(api)
    for name, cls, gpu in [
        ("half", "gpu-half", 0),
        ("quarter", "gpu-quarter", 0),
        ("eighth-sm", "gpu-eighth-sm-sharing", 1),
        ("full", "gpu-full", 0),
    ]:
        create(api, template(name, cls, gpu), NS)

    def bound(name: str) -> bool:
        return bool(core.read_namespaced_pod(name, NS).spec.node_name)

    for name in ("half", "quarter", "eighth-sm"):
        create(api, pod(f"pod-{name}", name), NS)
        wait_for(f"pod-{name} bound", lambda n=name: bound(f"pod-{n}"), timeout=90)  # type: ignore[misc]
    create(api, pod("pod-full", "full"), NS)

    def unschedulable() -> bool:
        conditions = core.read_namespaced_pod("pod-full", NS).status.conditions or []
        return any(c.type == "PodScheduled" and c.status == "False" for c in conditions)

    wait_for("pod-full Unschedulable", unschedulable, timeout=90)

    text = occupancy()
    print(text)
    lines = text.splitlines()
    assert lines[1].split()[:6] == [NODE, "0", "NVIDIA", "H200", "time-slicing", "hard"]
    assert lines[2].split()[:6] == [NODE, "1", "NVIDIA", "H200", "sm-sharing", "hard"]
    holders = {
        tuple(line.split()[3:5])
        for line in lines
        if line.startswith(f"{NODE} ") and f"{NS}/" in line
    }
    assert holders == {
        ("pod-half", "half"),
        ("pod-quarter", "quarter"),
        ("pod-eighth-sm", "eighth"),
    }
    assert f"{NS}/pod-full  gpu-full  not-enough-memory:" in text

    doc = json.loads(occupancy("-o", "json", "--node", NODE))
    # No kubelet here, so no plugin pod whose metrics would tell what the claims use.
    assert doc["usageUnknown"] == {NODE: "no Running kubelet plugin pod"}
    g0, g1 = doc["gpus"]
    assert g0["promisedBytes"] + g0["freeBytes"] == g0["memoryBytes"]
    assert g0["promisedBytes"] == sum(c["memoryBytes"] for c in g0["claims"])
    assert len(g0["claims"]) == 2 and len(g1["claims"]) == 1
    assert [p["name"] for p in doc["pending"]] == ["pod-full"]
    assert json.loads(occupancy("-o", "json", "--node", "elsewhere")) == {
        "gpus": [],
        "pending": [],
        "usageUnknown": {},
    }


def test_a_plugin_for_a_node_that_does_not_exist_publishes_nothing(api: k8s.ApiClient) -> None:
    """A kubelet-plugin started by hand with --node-name for a node that does not exist
    published two ResourceSlices without an owner and left them after SIGTERM, so occupancy
    listed a phantom node. It now publishes nothing until the Node exists (saying so), then
    slices owned by the Node, which go with it."""
    name = "phantom-node"
    res, core = k8s.ResourceV1Api(api), k8s.CoreV1Api(api)
    # short: the MPS sockets under --mps-root must fit the kernel's 107 bytes
    tmp_path = Path(tempfile.mkdtemp(prefix="phantom-"))
    log = tmp_path / "plugin.log"

    def slices() -> list[Any]:
        return res.list_resource_slice(field_selector=f"spec.nodeName={name}").items

    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dra_driver", "kubelet-plugin", f"--node-name={name}",
             "--gpus=simulated:H200x1", f"--kubeconfig={STATE / 'kubeconfig'}",
             f"--plugin-dir={tmp_path}/p", f"--registry-dir={tmp_path}/r",
             f"--cdi-root={tmp_path}/cdi", f"--state-dir={tmp_path}/s",
             f"--mps-root={tmp_path}/run", "--publish-interval=1",
             # publishing is the subject, not MPS (no MPS service runs beside this plugin)
             "--simulated-enforcer=recording"],
            stdout=subprocess.DEVNULL, stderr=sink, text=True,
        )  # fmt: skip
    try:

        def said() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            return f"Node '{name}' does not exist: not publishing" in log.read_text()

        wait_for("the plugin saying why it does not publish", said, timeout=60)
        time.sleep(2)  # two more rounds
        assert slices() == []
        assert name not in occupancy()
        create(
            api,
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}},
        )
        uid = core.read_node(name).metadata.uid
        published = wait_for("slices once the Node exists", slices, timeout=30)
        owners = [
            [(o.kind, o.name, o.uid) for o in s.metadata.owner_references or []] for s in published
        ]
        assert owners == [[("Node", name, uid)]] * len(published)
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0, log.read_text()[-2000:]
    core.delete_node(name)
    wait_for("the Node's slices garbage-collected with it", lambda: not slices(), timeout=60)
    shutil.rmtree(tmp_path, ignore_errors=True)
