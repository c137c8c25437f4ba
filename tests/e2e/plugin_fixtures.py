"""Fixtures for end-to-end tests on real nodes: the driver installed by its Helm chart.

The session's cluster (``control_plane``, see conftest) has two real nodes, ``gpu-node-1`` and
``gpu-node-2`` (hack/local-node: a kubelet v1.37.2 with containerd and runc each). The fixture
``driver`` installs the chart from ``deployments/helm`` once per session, with the plugin image
built by ``make image`` and imported into both nodes, simulated GPUs (:data:`GPUS`, laid out by
:data:`NODE_CONFIG`) and the local cluster's settings (see :func:`driver_values`); the
DaemonSet then runs the plugin on both nodes.

A test gets an :class:`E2E` (fixture ``e2e``): its own namespace, the nodes, and helpers to
create claims and pods. Pods run ``localhost/busybox`` with a script that prints what the
container sees (its ``/dev/nvidia*`` nodes, its GPU environment variables, its MPS pipe mount)
and then waits; :meth:`E2E.view` reads that from the kubelet's log file of the container.
On teardown the namespace's pods are deleted and the test waits until the real kubelet has
unprepared their claims.

Use from a test module with ``pytest_plugins = ["plugin_fixtures"]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from devtools import localinstall
from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.config.node import NodeConfig, default_node_config
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.mpsemu.probe import parse_line
from dra_driver.publish.slices import build_slices
from tests.support.cdischema import validator as cdi_validator
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
LOCAL_NODE = REPO / "hack" / "local-node"
DRIVER = DEFAULT_DRIVER_NAME
RELEASE = "gfd-e2e"
RELEASE_NAMESPACE = "gpu-fraction-e2e"
NODE_NAMES = ("gpu-node-1", "gpu-node-2")
NODE_LABEL = "gpu-fraction.dra.dev/e2e-node"
TENANT_LABEL = f"{DEFAULT_DRIVER_NAME}/tenant"
"""The namespace label by which a cluster admin grants a namespace this driver's devices."""
POD_SECURITY_LABEL = "pod-security.kubernetes.io/enforce"
GRANT_LABELS = {TENANT_LABEL: "true", POD_SECURITY_LABEL: "baseline"}
"""A granted namespace's labels: the tenant label and Pod Security enforced, ``baseline`` since
the tests' pods run as their image's user, root (``restricted`` refuses that)."""
GRANT_QUOTA = f"{RELEASE}-gpu-fraction-dra-gpu-fractions"
"""The ResourceQuota the session's chart requires in a granted namespace (its fullname and
``-gpu-fractions``; the tenant-quota policy)."""
GRANT_DEVICES = "1000"
"""Devices of each class a test namespace's grant allows: more than any test uses."""
CLASS_LIMITS: dict[str, dict[str, Any]] = {
    # Caps the tests' claims burst within (chart value classLimits); others allow no burst.
    "gpu-quarter": {"maxMemoryLimitPortion": "0.5"},
    "gpu-quarter-sm-sharing": {"maxMemoryLimit": "48Gi"},
    "gpu-eighth-sm-sharing": {"maxActiveThreadPercentage": 25},
}
WORKLOAD_IMAGE = "localhost/busybox:1.35.0"
TENANT_IMAGE = localinstall.image_ref("tenant")
"""The simulated tenant's image (hack/build-image tenant): busybox, python3 and tenant-probe."""
GPUS = "simulated:H200x12"
NODE_CONFIG: dict[str, Any] = {
    # GPUs 0-3: products pinned to time-slicing; 4-7: capacity, sm-sharing; 8-11: products,
    # sm-sharing (pinned, so each test knows where a claim of a class lands; the default mode
    # "auto" is tested on kubelet-less nodes in test_e2e_modes). Extended-resource devices on.
    "extendedResources": True,
    "gpus": [
        *({"selector": {"index": i}, "computeMode": "time-slicing"} for i in range(0, 4)),
        *(
            {"selector": {"index": i}, "fractionModel": "capacity", "computeMode": "sm-sharing"}
            for i in range(4, 8)
        ),
        *({"selector": {"index": i}, "computeMode": "sm-sharing"} for i in range(8, 12)),
    ],
}
TIME_SLICING_GPUS = range(0, 4)
CAPACITY_GPUS = range(4, 8)
SM_SHARING_PRODUCT_GPUS = range(8, 12)
T = TypeVar("T")

# What every test container runs: print what it sees, then wait (SIGTERM ends it at once).
VIEW_SCRIPT = """
for d in /dev/nvidia*; do [ -e "$d" ] && echo "DEVICE $d"; done
env | grep -E '^(NVIDIA_|CUDA_|GPU_FRACTION_)' | sort | sed 's/^/ENV /'
grep ' /tmp/nvidia-mps ' /proc/self/mountinfo | awk '{print "MOUNT " $4}'
echo VIEW-END
trap 'exit 0' TERM
while :; do sleep 1; done
"""
PROBE_SCRIPT = VIEW_SCRIPT.split("trap ", 1)[0] + "exec tenant-probe\n"
""":data:`VIEW_SCRIPT` in the tenant image, then the tenant probe (it attaches to the claim's
MPS namespace as a CUDA client would, reports what it got once a second; SIGTERM ends it)."""


def raw(resp: Any) -> dict[str, Any]:
    """API JSON of a ``_preload_content=False`` response."""
    data: dict[str, Any] = json.loads(resp.data)
    return data


def short_id() -> str:
    return uuid.uuid4().hex[:6]


def dns_name(text: str, limit: int = 40) -> str:
    """A DNS label made from a test name."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-")


# --------------------------------------------------------------------------- real nodes


@dataclass
class GpuNode:
    """A real node of the local cluster; paths are the host's view of the node's directories
    (hack/local-node bind-mounts them over the standard paths inside the node)."""

    name: str
    root: Path

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    @property
    def state_dir(self) -> Path:
        return self.root / "gpu-fraction-state"

    @property
    def run_dir(self) -> Path:
        """The node's ``/run/gpu-fraction`` (MPS pipe directories)."""
        return self.root / "gpu-fraction-run"

    @property
    def hook_records(self) -> Path:
        return self.state_dir / "simulated" / "hook-records"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    def host_path(self, node_path: str) -> Path:
        """Where a path of the node (e.g. ``/run/gpu-fraction/...``) lies on the host."""
        for prefix, sub in (("/run/gpu-fraction", "gpu-fraction-run"), ("/var/run/cdi", "cdi")):
            if node_path == prefix or node_path.startswith(prefix + "/"):
                return self.root / sub / node_path[len(prefix) :].lstrip("/")
        raise ValueError(f"{node_path} is not under a node directory this helper knows")

    def cdi_spec_path(self, claim_uid: str) -> Path:
        return self.cdi_root / f"{DRIVER}-claim_{claim_uid}.json"

    def cdi_specs(self) -> dict[str, dict[str, Any]]:
        """Our spec files on disk: file name -> spec."""
        if not self.cdi_root.is_dir():
            return {}
        return {
            p.name: json.loads(p.read_text())
            for p in sorted(self.cdi_root.iterdir())
            if p.name.startswith(f"{DRIVER}-claim_") and p.suffix == ".json"
        }

    def plugin_checkpoint(self) -> dict[str, Any]:
        path = self.state_dir / "checkpoint.json"
        if not path.exists():
            return {}
        claims: dict[str, Any] = json.loads(path.read_text()).get("claims", {})
        return claims

    def pipe_dirs(self) -> list[Path]:
        """Every claim's namespace pipe directory (``mps/<mode>/pipe/<server>/<namespace>``)."""
        return sorted(self.run_dir.glob("mps/*/pipe/*/*"))

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """The container's output as the kubelet logged it."""
        return "\n".join(localinstall.container_log(self.root, namespace, pod, container))

    def plugin_pids(self) -> list[int]:
        """PIDs of the plugin processes serving this node (hostPID: visible here)."""
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                args = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"kubelet-plugin" in args and f"--node-name={self.name}".encode() in args:
                pids.append(int(proc.name))
        return pids

    def kill_plugin(self) -> list[int]:
        """SIGKILL every plugin process of this node."""
        pids = self.plugin_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids


@dataclass
class ContainerView:
    """What a test container printed about itself (see :data:`VIEW_SCRIPT`)."""

    devices: list[str]
    env: dict[str, str]
    mounts: list[str]

    @classmethod
    def parse(cls, text: str) -> ContainerView:
        devices, env, mounts = [], {}, []
        for line in text.splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "DEVICE":
                devices.append(rest)
            elif kind == "ENV":
                k, _, v = rest.partition("=")
                env[k] = v
            elif kind == "MOUNT":
                mounts.append(rest)
        return cls(sorted(devices), env, mounts)


# --------------------------------------------------------------------------- session fixtures


@pytest.fixture(scope="session")
def kube(control_plane: Any) -> k8s.ApiClient:
    """An admin API client for the session's control plane."""
    api: k8s.ApiClient = control_plane.api_client()
    return api


def driver_values(control_plane: Any) -> dict[str, Any]:
    """Chart values of the session's install: the local cluster's (image, API server address,
    host network, no metrics ports; see devtools/localinstall.py), simulated GPUs laid out by
    :data:`NODE_CONFIG`, and only the e2e nodes (the plain manifests that test_e2e_install
    applies must not land there)."""
    return {
        **localinstall.local_values(control_plane.state_dir),
        "gpus": GPUS,
        "nodeConfig": NODE_CONFIG,
        "logLevel": "debug",
        "logFormat": "console",
        "publishInterval": 5,
        # The orphan sweep's first read soon after a plugin start (test_e2e_orphans).
        "orphanSweep": {"firstAfterSeconds": 5, "intervalSeconds": 600},
        # Only the e2e label; null removes the chart's default selector key (Helm merges maps).
        "nodeSelector": {NODE_LABEL: "true", "nvidia.com/gpu.present": None},
        "priorityClassName": "",
        "terminationGracePeriodSeconds": 5,
        # Admission warns instead of refusing, so that claims the plugin must refuse reach
        # it (test_e2e_errors); test_e2e_install checks the refusing policy.
        "policies": {"claimParametersActions": ["Warn"]},
        # Product classes carry extendedResourceName (test_e2e_modes); the node config above
        # turns the extended-resource devices on.
        "extendedResources": {"enabled": True},
        "classLimits": CLASS_LIMITS,
    }


@contextlib.contextmanager
def node_with_release(
    control_plane: Any, e2e: E2E, node: str, release: str, namespace: str, env: Mapping[str, str]
) -> Iterator[GpuNode]:
    """A node of the test's own (``hack/local-node up node`` with ``env`` added, e.g. its
    labels); afterwards the test's pods are deleted, then the second chart ``release`` (if the
    test installed one, :func:`install_second_release`), then the node."""
    env = {**os.environ, "LOCAL_CLUSTER_DIR": str(control_plane.state_dir), **env}
    up = subprocess.run(
        [sys.executable, str(LOCAL_NODE), "up", node], env=env, capture_output=True, text=True
    )
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        yield GpuNode(node, control_plane.state_dir / "nodes" / node)
    finally:
        for pod in e2e.pods():
            with contextlib.suppress(Exception):
                e2e.delete_pod(pod["metadata"]["name"])
        with contextlib.suppress(Exception):
            wait_for("the test's pods gone", lambda: not e2e.pods(), timeout=60)
        with contextlib.suppress(BaseException):
            helm(control_plane, "uninstall", release, "-n", namespace, "--wait")
        subprocess.run([sys.executable, str(LOCAL_NODE), "down", node], env=env, check=False)


def install_second_release(
    control_plane: Any, release: str, namespace: str, label: str, path: Path, **values: Any
) -> None:
    """Install a second release of the chart on the nodes labelled ``label`` only: one
    simulated GPU in time-slicing, no classes or cluster-wide policies (the session's release
    owns them), plus ``values``; its values file is written to ``path``."""
    body = {
        **driver_values(control_plane),
        "gpus": "simulated:H200x1",
        "nodeConfig": {"gpus": [{"selector": {"index": 0}, "computeMode": "time-slicing"}]},
        "nodeSelector": {label: "true", "nvidia.com/gpu.present": None},
        "deviceClasses": {"enabled": False},
        "policies": {
            "nodeScopedSlices": False,
            "claimParameters": False,
            "productSizes": False,
            "deviceTaintRuleSelector": False,
        },
        "tenants": {"requireGrant": False},
        **values,
    }
    path.write_text(yaml.safe_dump(body))
    try:
        localinstall.install(control_plane.kubeconfig, release, namespace, path)
    except RuntimeError as exc:
        pytest.fail(str(exc))


def helm(control_plane: Any, *args: str) -> str:
    try:
        return localinstall.helm(control_plane.kubeconfig, *args).stdout
    except RuntimeError as exc:
        pytest.fail(str(exc))


@dataclass
class Driver:
    """The session's Helm release of the driver."""

    control_plane: Any
    api: k8s.ApiClient
    values_file: Path
    nodes: list[GpuNode]

    def values(self) -> dict[str, Any]:
        """The release's current values (what :meth:`upgrade` changes)."""
        values: dict[str, Any] = yaml.safe_load(self.values_file.read_text())
        return values

    def upgrade(self, **overrides: Any) -> None:
        """``helm upgrade`` with changed values (waits for nothing)."""
        values = {**yaml.safe_load(self.values_file.read_text()), **overrides}
        self.values_file.write_text(yaml.safe_dump(values))
        helm(self.control_plane, "upgrade", RELEASE, str(localinstall.CHART), "-n",
             RELEASE_NAMESPACE, "-f", str(self.values_file))  # fmt: skip

    def plugin_pods(
        self, node: str | None = None, component: str = "kubelet-plugin"
    ) -> list[dict[str, Any]]:
        """The release's pods of ``component`` (``kubelet-plugin`` or ``mps-service``) that
        are not being deleted, on ``node`` if given."""
        selector = f"spec.nodeName={node}" if node else None
        items: list[dict[str, Any]] = raw(
            k8s.CoreV1Api(self.api).list_namespaced_pod(
                RELEASE_NAMESPACE,
                field_selector=selector,
                label_selector=f"app.kubernetes.io/component={component}",
                _preload_content=False,
            )
        )["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def wait_rolled_out(self, timeout: float = 90.0) -> None:
        """Every node runs exactly one plugin pod of the current DaemonSet generation and one
        running MPS service pod."""
        apps = k8s.AppsV1Api(self.api)

        def done() -> bool:
            sets = raw(apps.list_namespaced_daemon_set(RELEASE_NAMESPACE, _preload_content=False))
            (ds,) = [
                d
                for d in sets["items"]
                if d["metadata"]["labels"].get("app.kubernetes.io/component") == "kubelet-plugin"
            ]
            st = ds["status"]
            want = len(self.nodes)
            services = self.plugin_pods(component="mps-service")
            return (
                st.get("observedGeneration") == ds["metadata"]["generation"]
                and st.get("updatedNumberScheduled") == want
                and st.get("numberAvailable") == want
                and st.get("numberReady") == want
                and len(self.plugin_pods()) == want
                and all(running(p) for p in self.plugin_pods())
                and len(services) == want
                and all(running(p) for p in services)
            )

        wait_for("the plugin DaemonSet rolled out", done, timeout=timeout, every=0.5)

    def wait_published(self, timeout: float = 60.0) -> None:
        for node in self.nodes:
            wait_for(
                f"ResourceSlices of {node.name}",
                lambda n=node.name: pool_complete(slices_of(self.api, n)),
                timeout=timeout,
            )

    def plugin_log(self, node: str, lines: int = 40) -> str:
        out = []
        for gpu_node in self.nodes:
            if gpu_node.name != node:
                continue
            for pod in self.plugin_pods(node):
                text = gpu_node.container_log(
                    RELEASE_NAMESPACE, pod["metadata"]["name"], "plugin"
                ).splitlines()
                out.append(f"--- {pod['metadata']['name']}\n" + "\n".join(text[-lines:]))
        return "\n".join(out)


def running(pod: Mapping[str, Any]) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return bool(statuses) and all(s.get("state", {}).get("running") for s in statuses)


def slices_of(api: k8s.ApiClient, node: str) -> list[dict[str, Any]]:
    """The ResourceSlices of ``node`` for our driver, as stored by the API server."""
    items: list[dict[str, Any]] = raw(
        k8s.ResourceV1Api(api).list_resource_slice(
            field_selector=f"spec.nodeName={node},spec.driver={DRIVER}",
            _preload_content=False,
        )
    )["items"]
    return sorted(items, key=lambda s: s["metadata"]["name"])


@pytest.fixture(scope="session")
def driver(
    control_plane: Any, kube: k8s.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Driver]:
    """The chart installed once per session (``helm install``), rolled out on both nodes."""
    core = k8s.CoreV1Api(kube)
    nodes = [GpuNode(n, control_plane.state_dir / "nodes" / n) for n in NODE_NAMES]
    for n in nodes:
        core.patch_node(n.name, {"metadata": {"labels": {NODE_LABEL: "true"}}})
    values_file = tmp_path_factory.mktemp("helm") / "values.yaml"
    values_file.write_text(yaml.safe_dump(driver_values(control_plane)))
    try:
        localinstall.install(control_plane.kubeconfig, RELEASE, RELEASE_NAMESPACE, values_file)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    drv = Driver(control_plane, kube, values_file, nodes)
    try:
        drv.wait_rolled_out(timeout=120)
        drv.wait_published()
    except BaseException:
        for n in nodes:
            print(drv.plugin_log(n.name))
        raise
    yield drv
    with contextlib.suppress(Exception):
        helm(control_plane, "uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait")


@pytest.fixture(scope="session")
def device_classes(driver: Driver) -> list[str]:
    """The DeviceClasses the chart installed."""
    items = raw(k8s.ResourceV1Api(driver.api).list_device_class(_preload_content=False))["items"]
    return [d["metadata"]["name"] for d in items]


# --------------------------------------------------------------------------- per-test env


@dataclass
class E2E:
    """One test's world: API handles, a namespace, the session's nodes and driver."""

    api: k8s.ApiClient
    namespace: str
    test_name: str
    driver: Driver
    _pods: list[str] = field(default_factory=list)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def res(self) -> k8s.ResourceV1Api:
        return k8s.ResourceV1Api(self.api)

    @property
    def nodes(self) -> list[GpuNode]:
        return self.driver.nodes

    def slices(self, node: str) -> list[dict[str, Any]]:
        return slices_of(self.api, node)

    # ---- objects -------------------------------------------------------------------------

    def template(
        self,
        name: str,
        device_class: str,
        *,
        count: int | None = None,
        capacity: str | None = None,
        selectors: list[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
        distinct: str | None = None,
    ) -> str:
        """Create a ResourceClaimTemplate with one request ``gpu`` (see :func:`claim_spec`)."""
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {
                "spec": claim_spec(device_class, count, capacity, selectors, parameters, distinct)
            },
        }
        self.res.create_namespaced_resource_claim_template(
            self.namespace, k8s.V1ResourceClaimTemplate.from_dict(body)
        )
        return name

    def claim(
        self,
        name: str,
        device_class: str,
        *,
        count: int | None = None,
        parameters: Mapping[str, Any] | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Create a ResourceClaim (request ``gpu``); raises ApiException when refused.
        ``dry_run``: only admit it (``dryRun=All``: checked against quota, never charged)."""
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": claim_spec(device_class, count, None, None, parameters, None),
        }
        return raw(
            self.res.create_namespaced_resource_claim(
                self.namespace,
                k8s.ResourceV1ResourceClaim.from_dict(body),
                _preload_content=False,
                **({"dry_run": "All"} if dry_run else {}),
            )
        )

    def quota(self, name: str, hard: Mapping[str, str]) -> None:
        """Create the ResourceQuota ``name`` and return once quota admission enforces it
        (:func:`wait_quota_enforced`)."""
        body = {"metadata": {"name": name}, "spec": {"hard": dict(hard)}}
        self.core.create_namespaced_resource_quota(
            self.namespace, k8s.V1ResourceQuota.from_dict(body)
        )
        wait_quota_enforced(self, name, hard)

    def pod(
        self,
        name: str,
        node: GpuNode,
        templates: Mapping[str, str] | None = None,
        claims: Mapping[str, str] | None = None,
        run_as_user: int | None = None,
    ) -> dict[str, Any]:
        """Create a pod on ``node`` using ``templates`` (pod claim -> template) and ``claims``
        (pod claim -> existing ResourceClaim); its one container uses every claim and prints
        what it sees (:data:`VIEW_SCRIPT`). It runs as the image's user (root), or as
        ``run_as_user`` (a non-root UID, also its group)."""
        refs = [{"name": n, "resourceClaimTemplateName": t} for n, t in (templates or {}).items()]
        refs += [{"name": n, "resourceClaimName": c} for n, c in (claims or {}).items()]
        # One fraction per container: two claims on one GPU in one container would both mount
        # /tmp/nvidia-mps and set NVIDIA_GPU_MEMORY_*, and the runtime keeps one of each.
        containers = [
            {"name": "main" if len(refs) == 1 else r["name"], "resources": {"claims": [r["name"]]}}
            for r in refs
        ]
        for c in containers:
            c["resources"]["claims"] = [{"name": n} for n in c["resources"]["claims"]]
        spec = {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "containers": containers or [{"name": "main"}],
            "resourceClaims": refs,
        }
        if run_as_user is not None:
            spec["securityContext"] = {
                "runAsNonRoot": True,
                "runAsUser": run_as_user,
                "runAsGroup": run_as_user,
            }
        return self.create_pod(name, spec)

    def create_pod(
        self,
        name: str,
        spec: Mapping[str, Any],
        probe: bool = False,
        probe_args: Sequence[str] = (),
        annotations: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Create a pod from ``spec`` (with ``annotations``); every container runs
        :data:`VIEW_SCRIPT` in the local busybox image (never pulled), or with ``probe``
        :data:`PROBE_SCRIPT` in the tenant image (``tenant-probe`` given ``probe_args``, e.g.
        ``--use-memory 2Gi``); the pod stops within a second."""
        spec = dict(spec)
        script = PROBE_SCRIPT.replace(
            "exec tenant-probe", shlex.join(["exec", "tenant-probe", *probe_args])
        )
        spec["containers"] = [
            {
                **c,
                "image": TENANT_IMAGE if probe else WORKLOAD_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script if probe else VIEW_SCRIPT],
                "args": None,
            }
            for c in spec["containers"]
        ]
        spec.setdefault("terminationGracePeriodSeconds", 2)
        spec.setdefault("dnsPolicy", "Default")
        return self.create_raw_pod(name, spec, annotations)

    def create_raw_pod(
        self, name: str, spec: Mapping[str, Any], annotations: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """Create a pod from ``spec`` as given (its own images and commands), once the
        scheduler is done with this test's earlier pods (:meth:`wait_scheduler_settled`)."""
        self.wait_scheduler_settled()
        metadata = {"name": name, "annotations": dict(annotations or {})}
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
        self._pods.append(name)
        return raw(
            self.core.create_namespaced_pod(
                self.namespace, k8s.V1Pod.from_dict(body), _preload_content=False
            )
        )

    def wait_scheduler_settled(self, timeout: float = 30.0) -> None:
        """Wait until each earlier pod of this test is bound to a node or was found
        unschedulable (``PodScheduled`` False), at most ``timeout`` seconds.

        kube-scheduler 1.37 counts the consumed capacity of a claim it is binding twice for a
        moment (its assume cache has the allocation while the in-flight entry is still there,
        until PreBind ends; pkg/scheduler/framework/plugins/dynamicresources, dra_manager.go
        ``GatherAllocatedState``); a pod whose scheduling cycle falls into that moment gets
        "cannot allocate all claims" on a device with room, and no later event retries it for
        up to 5 minutes (the unschedulable queue's flush). Pods of one test that share a
        device are therefore created one after another, never during another's binding."""

        def settled(name: str) -> bool:
            try:
                pod = self.read_pod(name)
            except ApiException as exc:
                return exc.status == 404
            if pod["spec"].get("nodeName") or pod.get("metadata", {}).get("deletionTimestamp"):
                return True
            conditions = (pod.get("status") or {}).get("conditions") or []
            return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)

        deadline = time.monotonic() + timeout
        for name in self._pods:
            while not settled(name) and time.monotonic() < deadline:
                time.sleep(0.1)

    def read_pod(self, name: str) -> dict[str, Any]:
        return raw(self.core.read_namespaced_pod(name, self.namespace, _preload_content=False))

    def pod_exists(self, name: str) -> bool:
        try:
            self.read_pod(name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def node_of(self, pod: str) -> GpuNode:
        name = self.read_pod(pod)["spec"]["nodeName"]
        return next(n for n in self.nodes if n.name == name)

    def wait_running(self, name: str, timeout: float = 60.0) -> dict[str, Any]:
        def is_running() -> dict[str, Any] | None:
            pod = self.read_pod(name)
            return pod if pod["status"].get("phase") == "Running" and running(pod) else None

        try:
            return wait_for(f"pod {name} Running", is_running, timeout=timeout)
        except pytest.fail.Exception:
            print(self.describe(name))
            raise

    def container_of(self, pod: str, pod_claim: str) -> str:
        """The name of the (first) container of ``pod`` that uses ``pod_claim``."""
        for c in self.read_pod(pod)["spec"]["containers"]:
            if any(r["name"] == pod_claim for r in (c.get("resources") or {}).get("claims", [])):
                return str(c["name"])
        raise AssertionError(f"no container of {pod} uses its claim {pod_claim}")

    def view(self, pod: str, container: str = "main", timeout: float = 30.0) -> ContainerView:
        """What the pod's container printed about itself."""
        node = self.node_of(pod)
        text = wait_for(
            f"output of {pod}/{container}",
            lambda: (
                t
                if "VIEW-END" in (t := node.container_log(self.namespace, pod, container))
                else None
            ),
            timeout=timeout,
        )
        return ContainerView.parse(text)

    def pods(self) -> list[dict[str, Any]]:
        """The pods of this test's namespace."""
        items: list[dict[str, Any]] = raw(
            self.core.list_namespaced_pod(self.namespace, _preload_content=False)
        )["items"]
        return items

    def probe_lines(self, pod: str, container: str) -> list[dict[str, str]]:
        """The tenant probe's lines so far in the container's output, parsed (``key=value``
        fields, :func:`dra_driver.mpsemu.probe.parse_line`)."""
        text = self.node_of(pod).container_log(self.namespace, pod, container)
        return [f for f in (parse_line(line) for line in text.splitlines()) if f]

    def attached(self, pod: str, container: str) -> dict[str, str] | None:
        """The probe's last line when it is attached to a server (``connected`` or ``same``)."""
        lines = self.probe_lines(pod, container)
        return lines[-1] if lines and lines[-1].get("state") in ("connected", "same") else None

    def describe(self, pod: str) -> str:
        """Pod status, its events, and the plugin log tails (for failure messages)."""
        out = []
        with contextlib.suppress(ApiException):
            out.append(json.dumps(self.read_pod(pod).get("status"), indent=1)[:3000])
        out += [f"event {e['reason']}: {e['message']}" for e in self.events(pod)]
        for node in self.nodes:
            out.append(self.driver.plugin_log(node.name))
        return "\n".join(out)

    def claim_of(self, pod: str, pod_claim: str = "gpu") -> dict[str, Any]:
        """The ResourceClaim behind a pod's claim (template-made or direct)."""
        p = self.read_pod(pod)
        entry = next(c for c in p["spec"]["resourceClaims"] if c["name"] == pod_claim)
        claim_name = entry.get("resourceClaimName")
        if not claim_name:
            statuses = p["status"].get("resourceClaimStatuses") or []
            claim_name = next(s["resourceClaimName"] for s in statuses if s["name"] == pod_claim)
        return raw(
            self.res.read_namespaced_resource_claim(
                claim_name, self.namespace, _preload_content=False
            )
        )

    def events(self, pod: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = raw(
            self.core.list_namespaced_event(
                self.namespace,
                field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod}",
                _preload_content=False,
            )
        )["items"]
        return items

    def delete_pod(self, name: str, grace: int | None = None) -> None:
        """Delete a pod; the real kubelet stops it, unprepares its claims, then removes it."""
        self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=grace)

    def wait_gone(self, name: str, timeout: float = 60.0) -> None:
        wait_for(f"pod {name} deleted", lambda: not self.pod_exists(name), timeout=timeout)

    def prepared_here(self) -> dict[str, list[str]]:
        """Node name -> UIDs of this namespace's claims in the node's plugin checkpoint."""
        return {
            n.name: [
                u for u, r in n.plugin_checkpoint().items() if r["namespace"] == self.namespace
            ]
            for n in self.nodes
        }

    def allocated_claims(self) -> list[str]:
        """Names of this namespace's ResourceClaims that are still allocated (the scheduler
        counts their devices as taken)."""
        items = raw(self.res.list_namespaced_resource_claim(self.namespace, _preload_content=False))
        return [
            c["metadata"]["name"]
            for c in items["items"]
            if (c.get("status") or {}).get("allocation")
        ]

    def cleanup(self) -> None:
        """Delete the namespace's pods and wait until the GPUs they used are free for the next
        test: pods gone, their claims unprepared on every node and deallocated (a test that
        starts while the scheduler still counts them can find no room: "cannot allocate all
        claims")."""
        core = self.core
        pods = raw(core.list_namespaced_pod(self.namespace, _preload_content=False))["items"]
        for pod in pods:
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(pod["metadata"]["name"], self.namespace)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            left = raw(core.list_namespaced_pod(self.namespace, _preload_content=False))["items"]
            if not left and not any(self.prepared_here().values()) and not self.allocated_claims():
                break
            time.sleep(0.3)
        else:
            print(
                f"cleanup of {self.namespace}: pods, prepared or allocated claims left after 60 s"
            )
        with contextlib.suppress(ApiException):
            core.delete_namespace(self.namespace)


def set_node_taint(e2e: E2E, node: str, taint: Mapping[str, str], on: bool) -> None:
    """Add (``on``) or remove ``taint`` (matched by key) on Node ``node``, other taints kept."""
    body = raw(e2e.core.read_node(node, _preload_content=False))
    taints = [t for t in body["spec"].get("taints") or [] if t["key"] != taint["key"]]
    if on:
        taints.append(dict(taint))
    e2e.core.patch_node(node, {"spec": {"taints": taints}})


DEVICE_CLASS_QUOTA = re.compile(r"^(.+)\.deviceclass\.resource\.k8s\.io/devices$")
"""A quota key on a DeviceClass's devices (Kubernetes: ``<class>.deviceclass.resource.k8s.io/
devices``); group 1 is the class."""


def wait_quota_enforced(
    e2e: E2E, name: str, hard: Mapping[str, str], timeout: float = 30.0
) -> None:
    """Wait until quota admission enforces the ResourceQuota ``name`` of ``e2e``'s namespace.

    A GET showing ``status.hard`` is not enough: kube-apiserver's quota admission reads quotas
    from its informer's lister (k8s.io/apiserver, admission/plugin/resourcequota, GetQuotas),
    which can lag a GET by a moment on a loaded machine, and a quota whose ``status.hard`` it
    has not seen restricts nothing: claims created meanwhile are admitted and not counted. So
    for each device-class key, a dry-run claim for one device more than the quota allows must
    be refused with ``exceeded quota: <name>`` (dry runs are checked against the quota, never
    charged), and for each extended-resource key a dry-run pod asking one more; for other keys
    (counts of objects) the quota's ``status.hard`` must be set.
    """

    def status_set() -> bool:
        q = raw(
            e2e.core.read_namespaced_resource_quota(name, e2e.namespace, _preload_content=False)
        )
        return set((q.get("status") or {}).get("hard") or {}) >= set(hard)

    wait_for(f"quota {name} status", status_set, timeout=timeout)
    probes: dict[str, Callable[[], object]] = {}
    for key, value in hard.items():
        if m := DEVICE_CLASS_QUOTA.match(key):
            probes[key] = partial(
                e2e.claim, "quota-probe", m.group(1), count=int(value) + 1, dry_run=True
            )
        elif key.startswith("requests.") and "/" in key:  # an extended resource
            limits = {key.removeprefix("requests."): str(int(value) + 1)}
            pod = {
                "metadata": {"name": "quota-probe"},
                "spec": {
                    "containers": [
                        {"name": "main", "image": WORKLOAD_IMAGE, "resources": {"limits": limits}}
                    ]
                },
            }
            probes[key] = partial(e2e.core.create_namespaced_pod, e2e.namespace, pod, dry_run="All")
    for key, create in probes.items():

        def refused(create: Callable[[], object] = create) -> bool:
            try:
                create()
            except ApiException as exc:
                return exc.status == 403 and f"exceeded quota: {name}" in str(exc.body)
            return False

        wait_for(f"quota admission enforcing {name} on {key}", refused, timeout=timeout)


def claim_spec(
    device_class: str,
    count: int | None,
    capacity: str | None,
    selectors: list[str] | None,
    parameters: Mapping[str, Any] | None,
    distinct: str | None,
) -> dict[str, Any]:
    """A ResourceClaim spec with one request named ``gpu``.

    ``capacity``: ``capacity.requests.memory``; ``selectors``: CEL expressions;
    ``parameters``: opaque GpuFractionParameters fields; ``distinct``: a
    ``distinctAttribute`` constraint over the request.
    """
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if count is not None:
        exactly["allocationMode"] = "ExactCount"
        exactly["count"] = count
    if capacity is not None:
        exactly["capacity"] = {"requests": {"memory": capacity}}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if parameters is not None:
        devices["config"] = [
            {
                "requests": ["gpu"],
                "opaque": {
                    "driver": DRIVER,
                    "parameters": {
                        "apiVersion": "gpu-fraction.dra.dev/v1alpha1",
                        "kind": "GpuFractionParameters",
                        **parameters,
                    },
                },
            }
        ]
    if distinct is not None:
        devices["constraints"] = [{"requests": ["gpu"], "distinctAttribute": distinct}]
    return {"devices": devices}


@dataclass
class PreparedClaim:
    """What :func:`check_prepared` found for one claim of a running pod."""

    claim: dict[str, Any]
    results: list[dict[str, Any]]
    spec: dict[str, Any]
    spec_path: Path
    view: ContainerView
    node: GpuNode

    @property
    def uid(self) -> str:
        return str(self.claim["metadata"]["uid"])

    def pipe_dirs(self) -> list[Path]:
        """Host paths of the pipe directories the claim's spec mounts."""
        return sorted(
            {
                self.node.host_path(m["hostPath"])
                for d in self.spec["devices"]
                for m in d["containerEdits"].get("mounts", [])
            }
        )


def check_prepared(e2e: E2E, pod: str, pod_claim: str = "gpu") -> PreparedClaim:
    """Assert the whole prepare path for one pod claim, as the container sees it.

    The pod runs on a node of ours; its claim is allocated from that node's pool; the plugin
    wrote the claim's CDI spec (valid against the CDI JSON schema) and recorded the claim in
    its checkpoint; and the container itself sees exactly the spec's edits: the GPU device
    nodes of the claim plus the control nodes and no other GPU's node, the spec's
    environment, and its MPS pipe directory mounted at /tmp/nvidia-mps. Where the spec names
    the memory-limit hook, the recording stand-in received the GPU UUID and the claim's MiB.
    """
    p = e2e.read_pod(pod)
    assert p["status"]["phase"] == "Running"
    node = e2e.node_of(pod)
    claim = e2e.claim_of(pod, pod_claim)
    uid = claim["metadata"]["uid"]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["pool"] for r in results} == {node.name}
    assert {r["driver"] for r in results} == {DRIVER}
    path = node.cdi_spec_path(uid)
    assert path.exists(), f"no CDI spec {path}; on disk: {list(node.cdi_specs())}"
    spec = json.loads(path.read_text())
    errors = sorted(str(e.message) for e in cdi_validator().iter_errors(spec))
    assert not errors, errors
    assert uid in node.plugin_checkpoint()
    container = e2e.container_of(pod, pod_claim)
    view = e2e.view(pod, container)
    spec_nodes = {
        n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])
    }
    assert any(re.fullmatch(r"/dev/nvidia[0-9]+", n) for n in spec_nodes), spec_nodes
    assert set(view.devices) == spec_nodes, (view.devices, spec_nodes)
    for d in spec["devices"]:
        for entry in d["containerEdits"].get("env", []):
            k, _, v = entry.partition("=")
            assert view.env.get(k) == v, (k, v, view.env)
    got = PreparedClaim(claim, results, spec, path, view, node)
    pipes = got.pipe_dirs()
    if pipes:
        assert len(view.mounts) == 1, view.mounts
        assert any(view.mounts[0].endswith(str(p)) for p in pipes), (view.mounts, pipes)
        assert all(p.is_dir() for p in pipes)
    for d in spec["devices"]:
        hooks = [
            h
            for h in d["containerEdits"].get("hooks", [])
            if "apply-cuda-memory-limits" in h.get("args", [])
        ]
        for h in hooks:
            gpu = h["args"][h["args"].index("--gpu-id") + 1]
            record = hook_record(e2e, pod, container, node, gpu)
            env = dict(e.split("=", 1) for e in d["containerEdits"]["env"])
            assert record["NVIDIA_GPU_MEMORY_REQUEST"] == env["NVIDIA_GPU_MEMORY_REQUEST"]
            assert record["NVIDIA_GPU_MEMORY_LIMIT"] == env["NVIDIA_GPU_MEMORY_LIMIT"]
    return got


def hook_record(e2e: E2E, pod: str, container: str, node: GpuNode, gpu: str) -> dict[str, str]:
    """What the recording ``nvidia-cdi-hook`` stand-in wrote for a container on a GPU."""
    statuses = e2e.read_pod(pod)["status"]["containerStatuses"]
    status = next(s for s in statuses if s["name"] == container)
    container_id = status["containerID"].split("://", 1)[1]
    path = node.hook_records / f"{container_id}.{gpu}"
    assert path.exists(), f"no hook record {path.name}: {sorted(os.listdir(node.hook_records))}"
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def pool_complete(slices: list[dict[str, Any]]) -> bool:
    """Whether ``slices`` are a whole pool: as many as ``resourceSliceCount``, one generation.

    The plugin writes a pool's slices one by one, so a reader can see part of a pool.
    """
    if not slices:
        return False
    pools = {
        (s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices
    }
    return len(pools) == 1 and len(slices) == next(iter(pools))[1]


def slice_devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Device name -> device body over a node's slices."""
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def attr(device: Mapping[str, Any], name: str) -> Any:
    """The value of one of our driver's attributes on a device body."""
    value = device["attributes"][name]
    return next(iter(value.values()))


def unschedulable(e2e: E2E, pod: str) -> dict[str, Any] | None:
    """The pod's ``PodScheduled=False/Unschedulable`` condition, or None."""
    conditions = e2e.read_pod(pod)["status"].get("conditions") or []
    return next(
        (
            c
            for c in conditions
            if c["type"] == "PodScheduled"
            and c["status"] == "False"
            and c.get("reason") == "Unschedulable"
        ),
        None,
    )


def cdi_env(spec: Mapping[str, Any], device_index: int = 0) -> dict[str, str]:
    """The env of one CDI device of a spec, as a dict."""
    env = spec["devices"][device_index]["containerEdits"].get("env", [])
    return dict(e.split("=", 1) for e in env)


VIRTUAL_TAINT = "gpu-fraction.dra.dev/kubelet-less"
DEVICE_NAME = re.compile(r"gpu-(?P<gpu>[0-9]+)-(?P<mode>time-slicing|sm-sharing)(-.*)?")


class VirtualNode:
    """A kubelet-less node with ``gpus`` simulated H200s published as the plugin would publish
    them with node configuration ``config`` (default: the default one): a Node object, tainted
    so that no other test's pod lands there, and the slices ``render-slices`` prints for it,
    published through the API. The real kube-scheduler allocates claims on it exactly as on a
    real node; nothing runs there."""

    def __init__(self, e2e: E2E, gpus: int, config: NodeConfig | None = None) -> None:
        self.e2e = e2e
        self.name = f"vnode-{short_id()}"
        self.gpus = gpus
        node = {
            "metadata": {"name": self.name, "labels": {"kubernetes.io/hostname": self.name}},
            "spec": {"taints": [{"key": VIRTUAL_TAINT, "effect": "NoSchedule"}]},
        }
        e2e.core.create_node(k8s.V1Node.from_dict(node))
        status = {
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "Test"}],
                "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "250"},
                "capacity": {"cpu": "64", "memory": "512Gi", "pods": "250"},
            }
        }
        e2e.core.patch_node_status(self.name, status)
        inventory = SimulatedGpuSource(f"simulated:H200x{gpus}", seed=self.name).discover()
        custom = k8s.CustomObjectsApi(e2e.api)
        config = config if config is not None else default_node_config()
        for body in build_slices(inventory, config, DRIVER, self.name):
            custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body)

    def pod(self, name: str, device_class: str) -> None:
        """A pod on this node with one claim of ``device_class`` from a template."""
        self.e2e.template(name, device_class)
        spec = {
            "nodeSelector": {"kubernetes.io/hostname": self.name},
            "tolerations": [{"key": VIRTUAL_TAINT, "operator": "Exists"}],
            "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
        }
        self.e2e.create_pod(name, spec)

    def scheduled(self, pod: str) -> bool:
        return bool(self.e2e.read_pod(pod)["spec"].get("nodeName"))

    def remove(self, pod: str) -> None:
        """Delete the pod at once (no kubelet confirms it) and its claim template."""
        self.e2e.core.delete_namespaced_pod(pod, self.e2e.namespace, grace_period_seconds=0)
        wait_for(f"pod {pod} gone", lambda: not self.e2e.pod_exists(pod), timeout=30)
        self.e2e.res.delete_namespaced_resource_claim_template(pod, self.e2e.namespace)

    def allocations(self) -> dict[str, list[tuple[int, str, str]]]:
        """Claim name -> (GPU index, mode, consumed slots) of each result on this node."""
        claims = raw(
            self.e2e.res.list_namespaced_resource_claim(self.e2e.namespace, _preload_content=False)
        )["items"]
        out: dict[str, list[tuple[int, str, str]]] = {}
        for c in claims:
            alloc = (c.get("status") or {}).get("allocation")
            if not alloc:
                continue
            for r in alloc["devices"]["results"]:
                if r["pool"] != self.name:
                    continue
                m = DEVICE_NAME.fullmatch(r["device"])
                assert m, r["device"]
                slots = (r.get("consumedCapacity") or {}).get("slots", "")
                out.setdefault(c["metadata"]["name"], []).append((int(m["gpu"]), m["mode"], slots))
        return out

    def modes_per_gpu(self) -> dict[int, set[str]]:
        modes: dict[int, set[str]] = {}
        for results in self.allocations().values():
            for gpu, mode, _ in results:
                modes.setdefault(gpu, set()).add(mode)
        return modes

    def delete(self) -> None:
        core = self.e2e.core
        pods = raw(core.list_namespaced_pod(self.e2e.namespace, _preload_content=False))["items"]
        for p in pods:
            if p["spec"].get("nodeName") == self.name or any(
                t.get("key") == VIRTUAL_TAINT for t in p["spec"].get("tolerations") or []
            ):
                with contextlib.suppress(ApiException):
                    core.delete_namespaced_pod(
                        p["metadata"]["name"], self.e2e.namespace, grace_period_seconds=0
                    )
        with contextlib.suppress(ApiException):
            self.e2e.res.delete_collection_resource_slice(
                field_selector=f"spec.nodeName={self.name}"
            )
        with contextlib.suppress(ApiException):
            core.delete_node(self.name)


def grant(
    core: k8s.CoreV1Api,
    namespace: str,
    classes: Iterable[str],
    labels: Mapping[str, str] | None = None,
) -> None:
    """Create ``namespace`` as a cluster admin grants it (docs/admin-guide.md, "Tenants"): the
    :data:`GRANT_LABELS` (and ``labels``) and the ResourceQuota :data:`GRANT_QUOTA`, listing
    every class in ``classes`` (the session's: the chart's) at :data:`GRANT_DEVICES`."""
    meta = {"name": namespace, "labels": {**GRANT_LABELS, **(labels or {})}}
    core.create_namespace(k8s.V1Namespace.from_dict({"metadata": meta}))
    hard = {f"{c}.deviceclass.resource.k8s.io/devices": GRANT_DEVICES for c in classes}
    quota = {"metadata": {"name": GRANT_QUOTA}, "spec": {"hard": hard}}
    core.create_namespaced_resource_quota(namespace, k8s.V1ResourceQuota.from_dict(quota))


@pytest.fixture
def vnodes(e2e: E2E) -> Iterator[list[VirtualNode]]:
    """Kubelet-less nodes a test made (append them); deleted after the test."""
    made: list[VirtualNode] = []
    yield made
    for node in made:
        node.delete()


@pytest.fixture
def e2e(
    kube: k8s.ApiClient,
    driver: Driver,
    device_classes: list[str],
    request: pytest.FixtureRequest,
) -> Iterator[E2E]:
    """A fresh namespace for the test, on the session's nodes and driver."""
    core = k8s.CoreV1Api(kube)
    namespace = f"e2e-{dns_name(request.node.name, 40)}-{short_id()}"
    grant(core, namespace, device_classes)
    wait_for(
        f"ServiceAccount {namespace}/default",
        lambda: core.read_namespaced_service_account("default", namespace),
        timeout=30,
        every=0.1,
    )
    env = E2E(kube, namespace, request.node.name, driver)
    try:
        yield env
    finally:
        env.cleanup()
