"""Fixtures for end-to-end tests of the kubelet plugin against the real local control plane.

A test gets an :class:`E2E` (fixture ``e2e``): its own namespace, and :meth:`E2E.start_node`,
which starts a simulated GPU node: the kubelet stand-in (``hack/kubelet_standin.py``, a thread)
registers the Node, then ``python -m dra_driver kubelet-plugin`` runs as a real subprocess with a
simulated GPU inventory and its own plugin, registry, CDI and state directories. Pods are pinned
to their node with a ``kubernetes.io/hostname`` node selector, so tests never share a node.

On teardown the namespace's pods are deleted, the stand-in unprepares their claims, and then
the plugin (SIGTERM), the stand-in, the node's ResourceSlices and the Node are removed.

Use from a test module with ``pytest_plugins = ["plugin_fixtures"]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "hack") not in sys.path:
    sys.path.insert(0, str(REPO / "hack"))

import kubelet_standin  # noqa: E402

from dra_driver import DEFAULT_DRIVER_NAME  # noqa: E402
from tests.nodedirs import NodeDirs  # noqa: E402

DRIVER = DEFAULT_DRIVER_NAME
DEVICE_CLASS_DIR = REPO / "manifests" / "deviceclasses"
CDI_ANNOTATION = kubelet_standin.CDI_ANNOTATION
T = TypeVar("T")


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 30.0, every: float = 0.2) -> T:
    """Poll ``fn`` until it returns a truthy value; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = fn()
        except ApiException as exc:
            value, last = None, f"{exc.status} {exc.reason}"
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last})")
        time.sleep(every)


def raw(resp: Any) -> dict[str, Any]:
    """API JSON of a ``_preload_content=False`` response."""
    data: dict[str, Any] = json.loads(resp.data)
    return data


def short_id() -> str:
    return uuid.uuid4().hex[:6]


def dns_name(text: str, limit: int = 40) -> str:
    """A DNS label made from a test name."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-")


# --------------------------------------------------------------------------- session fixtures


@pytest.fixture(scope="session")
def kube(control_plane: Any) -> k8s.ApiClient:
    """An admin API client for the session's control plane."""
    api: k8s.ApiClient = control_plane.api_client()
    return api


@pytest.fixture(scope="session")
def device_classes(kube: k8s.ApiClient) -> Iterator[list[str]]:
    """The shipped DeviceClasses (manifests/deviceclasses), created or replaced once."""
    res = k8s.ResourceV1Api(kube)
    names = []
    for path in sorted(DEVICE_CLASS_DIR.glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        name = body["metadata"]["name"]
        try:
            res.create_device_class(k8s.V1DeviceClass.from_dict(body))
        except ApiException as exc:
            if exc.status != 409:
                raise
            old = raw(res.read_device_class(name, _preload_content=False))
            body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            res.replace_device_class(name, k8s.V1DeviceClass.from_dict(body))
        names.append(name)
    yield names
    for name in names:
        with contextlib.suppress(ApiException):
            res.delete_device_class(name)


# --------------------------------------------------------------------------- a GPU node


@dataclass
class GpuNode(NodeDirs):
    """A simulated GPU node: the stand-in (thread) plus the plugin (subprocess)."""

    name: str
    root: Path
    gpus: str
    standin: kubelet_standin.KubeletStandin
    kubeconfig: Path
    node_config: Path | None = None
    plugin_args: list[str] = field(default_factory=list)
    plugin: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.root / "plugin.log"

    def cdi_spec_path(self, claim_uid: str) -> Path:
        return self.cdi_root / f"{DRIVER}-claim_{claim_uid}.json"

    def cdi_specs(self) -> dict[str, dict[str, Any]]:
        """Spec files on disk: file name -> spec."""
        if not self.cdi_root.is_dir():
            return {}
        return {
            p.name: json.loads(p.read_text())
            for p in sorted(self.cdi_root.iterdir())
            if p.suffix in (".json", ".yaml")
        }

    def rendered_slices(self) -> list[dict[str, Any]]:
        """``dra-driver render-slices`` for this node: what the plugin says it publishes."""
        cmd = [sys.executable, "-m", "dra_driver", "render-slices", f"--node={self.name}"]
        cmd += [
            f"--gpus={self.gpus}",
            *([f"--config={self.node_config}"] if self.node_config else []),
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=True)
        slices: list[dict[str, Any]] = json.loads(done.stdout)
        return slices

    def plugin_checkpoint(self) -> dict[str, Any]:
        path = self.state_dir / "checkpoint.json"
        if not path.exists():
            return {}
        claims: dict[str, Any] = json.loads(path.read_text()).get("claims", {})
        return claims

    def plugin_log(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def start_plugin(self) -> None:
        """Start ``python -m dra_driver kubelet-plugin`` for this node (log: ``plugin.log``)."""
        cmd = [
            sys.executable,
            "-m",
            "dra_driver",
            "kubelet-plugin",
            f"--node-name={self.name}",
            f"--gpus={self.gpus}",
            f"--kubeconfig={self.kubeconfig}",
            f"--plugin-dir={self.plugin_dir}",
            f"--registry-dir={self.registry_dir}",
            f"--cdi-root={self.cdi_root}",
            f"--state-dir={self.state_dir}",
            "--log-format=console",
            "--log-level=debug",
            *([f"--node-config={self.node_config}"] if self.node_config else []),
            *self.plugin_args,
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with open(self.log_path, "ab") as out:
            self.plugin = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def stop_plugin(self) -> int | None:
        if self.plugin is None or self.plugin.poll() is not None:
            return None if self.plugin is None else self.plugin.returncode
        self.plugin.send_signal(signal.SIGTERM)
        try:
            return self.plugin.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.plugin.kill()
            return self.plugin.wait()


# --------------------------------------------------------------------------- per-test env


@dataclass
class E2E:
    """One test's world: API handles, a namespace, the nodes it started."""

    api: k8s.ApiClient
    kubeconfig: Path
    namespace: str
    test_name: str
    nodes: list[GpuNode] = field(default_factory=list)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def res(self) -> k8s.ResourceV1Api:
        return k8s.ResourceV1Api(self.api)

    # ---- nodes ---------------------------------------------------------------------------

    def start_node(
        self,
        gpus: str = "simulated:H200x2",
        node_config: Mapping[str, Any] | None = None,
        versions: tuple[str, ...] = kubelet_standin.DRA_VERSIONS,
        plugin_args: list[str] | None = None,
    ) -> GpuNode:
        """Start a stand-in and a plugin for a new node; return once its slices are published
        and the node is schedulable."""
        name = f"{dns_name(self.test_name, 30)}-{short_id()}"
        # Short root: unix socket paths are limited to 107 bytes.
        root = Path(tempfile.mkdtemp(prefix="dra-e2e-"))
        standin = kubelet_standin.KubeletStandin(
            self.api,
            name,
            root / "registry",
            checkpoint_path=root / "standin" / "checkpoint.json",
            versions=versions,
            initial_backoff=0.5,
            max_backoff=4.0,
            resync_interval=1.0,
            delete_node_on_stop=True,
        )
        node = GpuNode(name, root, gpus, standin, self.kubeconfig)
        self.nodes.append(node)
        standin.start()  # first: it wipes the node's slices, as a starting kubelet does
        config_path = None
        if node_config is not None:
            config_path = root / "node-config.yaml"
            config_path.write_text(
                yaml.safe_dump(
                    {"apiVersion": "gpu-fraction.dra.dev/v1alpha1", "kind": "NodeConfig"}
                    | dict(node_config)
                )
            )
        node.node_config, node.plugin_args = config_path, list(plugin_args or [])
        node.start_plugin()

        def registered() -> bool:
            assert node.plugin is not None
            if node.plugin.poll() is not None:
                pytest.fail(f"plugin exited with {node.plugin.returncode}:\n{node.plugin_log()}")
            return standin.registry.plugin(DRIVER) is not None

        wait_for(f"plugin registration on {name}", registered, timeout=30, every=0.1)
        wait_for(f"ResourceSlices of {name}", lambda: pool_complete(self.slices(name)), timeout=30)
        standin.wait_node_schedulable(timeout=60)
        return node

    def stop_node(self, node: GpuNode) -> None:
        node.stop_plugin()
        node.standin.stop()
        for s in self.slices(node.name):
            with contextlib.suppress(ApiException):
                self.res.delete_resource_slice(s["metadata"]["name"])

    def slices(self, node: str) -> list[dict[str, Any]]:
        """The ResourceSlices of ``node`` for our driver, as stored by the API server."""
        items: list[dict[str, Any]] = raw(
            self.res.list_resource_slice(
                field_selector=f"spec.nodeName={node},spec.driver={DRIVER}",
                _preload_content=False,
            )
        )["items"]
        return sorted(items, key=lambda s: s["metadata"]["name"])

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
    ) -> dict[str, Any]:
        """Create a ResourceClaim (request ``gpu``); raises ApiException when refused."""
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
            )
        )

    def pod(
        self,
        name: str,
        node: GpuNode,
        templates: Mapping[str, str] | None = None,
        claims: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Create a pod on ``node`` using ``templates`` (pod claim -> template) and ``claims``
        (pod claim -> existing ResourceClaim); its one container uses every claim."""
        refs = [{"name": n, "resourceClaimTemplateName": t} for n, t in (templates or {}).items()]
        refs += [{"name": n, "resourceClaimName": c} for n, c in (claims or {}).items()]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node.name},
                "terminationGracePeriodSeconds": 30,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": r["name"]} for r in refs]},
                    }
                ],
                "resourceClaims": refs,
            },
        }
        return raw(
            self.core.create_namespaced_pod(
                self.namespace, k8s.V1Pod.from_dict(body), _preload_content=False
            )
        )

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

    def wait_running(self, name: str, timeout: float = 45.0) -> dict[str, Any]:
        def running() -> dict[str, Any] | None:
            pod = self.read_pod(name)
            return pod if pod["status"].get("phase") == "Running" else None

        try:
            return wait_for(f"pod {name} Running", running, timeout=timeout)
        except pytest.fail.Exception:
            print(self.describe(name))
            raise

    def describe(self, pod: str) -> str:
        """Pod status, its events, and every node's plugin log tail (for failure messages)."""
        out = []
        with contextlib.suppress(ApiException):
            out.append(json.dumps(self.read_pod(pod).get("status"), indent=1)[:3000])
        out += [f"event {e['reason']}: {e['message']}" for e in self.events(pod)]
        for node in self.nodes:
            out.append(f"--- plugin log of {node.name}\n{node.plugin_log(40)}")
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
        """Delete a pod (default grace: the stand-in sees it terminating, unprepares, deletes)."""
        self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=grace)

    def wait_gone(self, name: str, timeout: float = 30.0) -> None:
        wait_for(f"pod {name} deleted", lambda: not self.pod_exists(name), timeout=timeout)

    def cleanup(self) -> None:
        core = self.core
        pods = raw(core.list_namespaced_pod(self.namespace, _preload_content=False))["items"]
        for pod in pods:
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(
                    pod["metadata"]["name"], self.namespace, grace_period_seconds=0
                )
        deadline = time.monotonic() + 30
        for node in self.nodes:
            while node.standin.prepared_claims() and time.monotonic() < deadline:
                node.standin.sync_now()
                time.sleep(0.1)
        for node in self.nodes:
            self.stop_node(node)
            if node.plugin is not None and node.plugin.returncode not in (0, None):
                print(f"plugin of {node.name} exited {node.plugin.returncode}")
            print(f"--- plugin log of {node.name} (tail)\n{node.plugin_log(30)}")
            shutil.rmtree(node.root, ignore_errors=True)
        with contextlib.suppress(ApiException):
            core.delete_namespace(self.namespace)


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


def check_prepared(e2e: E2E, node: GpuNode, pod: str, pod_claim: str = "gpu") -> PreparedClaim:
    """Assert the whole prepare path for one pod claim and return what it produced.

    The pod is Running; the stand-in's annotation names the claim, its allocated devices and
    CDI IDs; a PreparedDynamicResources event was recorded; the plugin wrote the claim's CDI
    spec, valid against the CDI JSON schema, holding exactly those CDI devices, each with its
    GPU's device node.
    """
    p = e2e.read_pod(pod)
    assert p["status"]["phase"] == "Running"
    assert p["spec"]["nodeName"] == node.name
    claim = e2e.claim_of(pod, pod_claim)
    uid = claim["metadata"]["uid"]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["pool"] for r in results} == {node.name}
    assert {r["driver"] for r in results} == {DRIVER}
    note = json.loads(p["metadata"]["annotations"][CDI_ANNOTATION])[pod_claim]
    assert note["claimUID"] == uid
    assert sorted(d["device"] for d in note["devices"]) == sorted(r["device"] for r in results)
    path = node.cdi_spec_path(uid)
    assert path.exists(), f"no CDI spec {path}; on disk: {list(node.cdi_specs())}"
    spec = json.loads(path.read_text())
    errors = sorted(str(e.message) for e in cdi_validator().iter_errors(spec))
    assert not errors, errors
    ids = [i for d in note["devices"] for i in d["cdiDeviceIDs"]]
    assert sorted(ids) == sorted(f"{spec['kind']}={d['name']}" for d in spec["devices"])
    for d in spec["devices"]:
        assert uid in d["name"]
        nodes = [n["path"] for n in d["containerEdits"]["deviceNodes"]]
        assert any(re.fullmatch(r"/dev/nvidia[0-9]+", n) for n in nodes), nodes
    reasons = [e["reason"] for e in e2e.events(pod)]
    assert kubelet_standin.REASON_PREPARED in reasons, reasons
    assert uid in node.plugin_checkpoint()
    return PreparedClaim(claim, results, spec, path, note)


@dataclass
class PreparedClaim:
    """What :func:`check_prepared` found for one claim."""

    claim: dict[str, Any]
    results: list[dict[str, Any]]
    spec: dict[str, Any]
    spec_path: Path
    annotation: dict[str, Any]

    @property
    def uid(self) -> str:
        return str(self.claim["metadata"]["uid"])


def cdi_validator() -> Any:
    """The CDI JSON-schema validator of the unit tests (``tests/data/cdi-schema``)."""
    from tests.cdischema import validator

    return validator()


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


@pytest.fixture
def e2e(
    kube: k8s.ApiClient,
    device_classes: list[str],
    control_plane: Any,
    request: pytest.FixtureRequest,
) -> Iterator[E2E]:
    """A fresh namespace for the test; nodes started with :meth:`E2E.start_node` are torn
    down with it."""
    core = k8s.CoreV1Api(kube)
    namespace = f"e2e-{dns_name(request.node.name, 40)}-{short_id()}"
    core.create_namespace(k8s.V1Namespace.from_dict({"metadata": {"name": namespace}}))
    wait_for(
        f"ServiceAccount {namespace}/default",
        lambda: core.read_namespaced_service_account("default", namespace),
        timeout=30,
        every=0.1,
    )
    env = E2E(kube, Path(control_plane.kubeconfig), namespace, request.node.name)
    try:
        yield env
    finally:
        env.cleanup()
