"""Shared plumbing of the scheduler benchmarks (bench_scheduler, bench_packing, check_modes).

A *layout* is what the driver publishes, as three functions (a module passed as
``--layout file:PATH`` exposes them; ``--layout render-slices`` is the driver's own):

- ``slices(node: str, gpus: int) -> list[dict]``: the ResourceSlices (API JSON) of one node;
- ``classes() -> list[dict]``: the DeviceClasses it needs;
- ``claim_spec(class_name: str) -> dict``: the ResourceClaim ``spec`` a user writes for a
  product class name (``gpu-quarter``, ``gpu-half-sm-sharing``, ...), one request ``gpu``;

and optionally two more (a module without them installs no admission policy):

- ``policies() -> list[dict]``: admission objects to install with the classes (the driver's
  sizing admission policies and their bindings, rendered from the chart by
  :mod:`devtools.chartrender`);
- ``sized_slots(class_name: str) -> str | None``: the ``capacity.requests.slots`` the API
  server must have written into a claim of that class (None: no capacity request), checked
  with a dry-run create before a measurement (:meth:`Cluster.put_policies`).

The cluster is the local control plane (hack/local-cluster: kube-apiserver, -controller-manager
and -scheduler v1.37.2; :func:`local_cluster` sets their client rate limits) or any cluster
given by a kubeconfig. Nodes are kubelet-less Node objects (Ready, allocatable cpu/memory/pods):
nothing runs, the benchmarks measure scheduling only. Every object a run creates carries the
label ``bench.dra.dev/run=<run>`` and is deleted by :func:`Cluster.cleanup`.

API calls go through :meth:`Cluster.call` with JSON bodies (plain dicts in, dicts out): the
typed client's models cost CPU that the 2-core machines running these benchmarks lack.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # devtools: the chart's rendering

from devtools import chartrender  # noqa: E402
from dra_driver import DEFAULT_DRIVER_NAME  # noqa: E402
from dra_driver.app.readcmds import render_slices_json  # noqa: E402
from dra_driver.config import class_slots, load_node_config  # noqa: E402
from dra_driver.enforce import detect_enforcement  # noqa: E402
from dra_driver.gpus import Inventory  # noqa: E402
from dra_driver.infra import logs  # noqa: E402

DRIVER = DEFAULT_DRIVER_NAME
RUN_LABEL = "bench.dra.dev/run"
POLICY_LABEL = "bench.dra.dev/policy"
"""Label on the admission objects a benchmark installed (replaced per layout)."""
GATE = "bench.dra.dev/hold"
GPU_MODEL = "H200"
MIB = 1024 * 1024
PRODUCT_SIZES = {"eighth": 0.125, "quarter": 0.25, "half": 0.5, "full": 1.0}
"""Portion of a card per product class stem (``gpu-<stem>[-sm-sharing]``)."""
PROBE_CLASS = "gpu-quarter"
"""Class of the dry-run claim that checks the admission policies (:meth:`Cluster.put_policies`)."""
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_DEVICES_PER_SLICE = 64
"""Kubernetes 1.37 limits: 8 counter sets per slice; 64 devices per slice once a device
consumes counters or allows multiple allocations."""

RESOURCE = "/apis/resource.k8s.io/v1"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
KINDS = {
    "MutatingAdmissionPolicy": f"{ADMISSION}/mutatingadmissionpolicies",
    "MutatingAdmissionPolicyBinding": f"{ADMISSION}/mutatingadmissionpolicybindings",
    "ValidatingAdmissionPolicy": f"{ADMISSION}/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": f"{ADMISSION}/validatingadmissionpolicybindings",
}
"""Collection path of each admission kind a layout may install."""


class Layout(Protocol):
    def slices(self, node: str, gpus: int) -> list[dict[str, Any]]: ...
    def classes(self) -> list[dict[str, Any]]: ...
    def claim_spec(self, class_name: str) -> dict[str, Any]: ...


def layout_policies(layout: Layout) -> list[dict[str, Any]]:
    """The layout's admission objects (``policies()``), or none."""
    fn: Callable[[], list[dict[str, Any]]] | None = getattr(layout, "policies", None)
    return fn() if fn is not None else []


def layout_sized_slots(layout: Layout, class_name: str) -> str | None:
    """The slots the layout's policies write into a claim of ``class_name`` (``sized_slots``),
    or None (no capacity request)."""
    fn: Callable[[str], str | None] | None = getattr(layout, "sized_slots", None)
    return fn(class_name) if fn is not None else None


def product_of(class_name: str) -> tuple[str, str]:
    """``gpu-quarter-sm-sharing`` -> (``quarter``, ``sm-sharing``); mode ``time-slicing`` when
    there is no suffix. Raises KeyError for an unknown product stem."""
    stem = class_name.removeprefix("gpu-")
    mode = "time-slicing"
    if stem.endswith("-sm-sharing"):
        stem, mode = stem.removesuffix("-sm-sharing"), "sm-sharing"
    if stem not in PRODUCT_SIZES:
        raise KeyError(f"unknown product class {class_name!r}; known: {sorted(PRODUCT_SIZES)}")
    return stem, mode


def one_request(exactly: dict[str, Any]) -> dict[str, Any]:
    """A ResourceClaim spec with one request ``gpu``."""
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def requested_slots(spec: Mapping[str, Any]) -> str | None:
    """``capacity.requests.slots`` of a claim spec's first request, or None."""
    exactly = spec["devices"]["requests"][0].get("exactly", {})
    slots: str | None = exactly.get("capacity", {}).get("requests", {}).get("slots")
    return slots


def _tiers(inventory: Inventory) -> dict[str, str]:
    return detect_enforcement(inventory, simulated=True).tiers


def rendered_slices(node: str, gpus: int, config: str | None) -> list[dict[str, Any]]:
    """What ``dra-driver render-slices --node NODE --gpus simulated:H200xGPUS [--config]``
    prints (same function, same enforcement detection, called in-process)."""
    text = render_slices_json(node, f"simulated:{GPU_MODEL}x{gpus}", config, DRIVER, _tiers)
    result: list[dict[str, Any]] = json.loads(text)
    return result


GPU_ONLY_DROP = frozenset({"product", "portion", "fractionModel", "computeMode"})
"""Attributes of a rendered device that describe the fraction, not the GPU."""


def gpu_attributes(node: str, gpus: int) -> list[dict[str, Any]]:
    """Per GPU (by index), the attributes render-slices gives the GPU's devices, without
    ``product``, ``portion``, ``fractionModel`` and ``computeMode``."""
    by_index: dict[int, dict[str, Any]] = {}
    for s in rendered_slices(node, gpus, None):
        for d in s["spec"].get("devices", []):
            attrs = d["attributes"]
            by_index.setdefault(
                attrs["index"]["int"],
                {k: v for k, v in attrs.items() if k not in GPU_ONLY_DROP},
            )
    return [by_index[i] for i in range(gpus)]


def pool_slices(
    node: str,
    counter_sets: Sequence[dict[str, Any]],
    devices: Sequence[dict[str, Any]],
    per_slice: int = MAX_DEVICES_PER_SLICE,
) -> list[dict[str, Any]]:
    """Slices of pool ``node``: counter sets first (8 per slice), then devices (``per_slice``
    per slice, at most 64)."""
    parts: list[tuple[str, list[dict[str, Any]]]] = [
        ("sharedCounters", list(counter_sets[i : i + MAX_COUNTER_SETS_PER_SLICE]))
        for i in range(0, len(counter_sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    parts += [
        ("devices", list(devices[i : i + per_slice])) for i in range(0, len(devices), per_slice)
    ]
    pool = {"name": node, "generation": 1, "resourceSliceCount": len(parts)}
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER.replace('.', '-')}-{n}"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": pool, key: items},
        }
        for n, (key, items) in enumerate(parts)
    ]


def device_class(name: str, expression: str) -> dict[str, Any]:
    """A DeviceClass selecting this driver's devices that match a CEL ``expression`` over
    ``attrs`` (the driver's attribute map)."""
    attrs = f'device.attributes["{DRIVER}"]'
    cel = f'device.driver == "{DRIVER}" && ' + expression.replace("attrs", attrs)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": cel}}]},
    }


@dataclass
class RenderSlicesLayout:
    """The driver's own layout: slices from render-slices, classes from
    the chart and the sizing admission policies from the chart too (:mod:`devtools.chartrender`,
    their one source).

    Products model (default): a claim names only the class; the policy writes
    ``capacity.requests.slots`` (``gpu-quarter``: 2 of 8). Capacity model (a node config with
    ``fractionModel: capacity``): a product class name is written as ``gpu-memory[-sm-sharing]``
    with ``capacity.requests.memory`` = the portion of the device's largest request, rounded
    DOWN to the request policy's step."""

    config: str | None = None
    _capacity: dict[str, Any] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        devices = [
            d
            for s in rendered_slices("probe", 1, self.config)
            for d in s["spec"].get("devices", [])
        ]
        if devices[0]["attributes"]["fractionModel"]["string"] == "capacity":
            self._capacity = devices[0]["capacity"]["memory"]

    def slices(self, node: str, gpus: int) -> list[dict[str, Any]]:
        return rendered_slices(node, gpus, self.config)

    def _config_doc(self) -> dict[str, Any] | None:
        if self.config is None:
            return None
        doc: dict[str, Any] = yaml.safe_load(Path(self.config).read_text())
        return doc

    def classes(self) -> list[dict[str, Any]]:
        return chartrender.device_classes(config=self._config_doc())

    def policies(self) -> list[dict[str, Any]]:
        return chartrender.sizing_policies(config=self._config_doc())

    def sized_slots(self, class_name: str) -> str | None:
        if self._capacity is not None:
            return None
        slots = class_slots(load_node_config(self.config)).get(class_name)
        return None if slots is None else str(slots)

    def claim_spec(self, class_name: str) -> dict[str, Any]:
        if self._capacity is None:
            return one_request({"deviceClassName": class_name})
        product, mode = product_of(class_name)
        policy = self._capacity["requestPolicy"]
        top, step = mib(policy["validRange"]["max"]), mib(policy["validRange"]["step"])
        amount = max(
            int(top * PRODUCT_SIZES[product]) // step * step, mib(policy["validRange"]["min"])
        )
        cls = "gpu-memory" if mode == "time-slicing" else "gpu-memory-sm-sharing"
        return one_request(
            {"deviceClassName": cls, "capacity": {"requests": {"memory": f"{amount}Mi"}}}
        )


def mib(quantity: str) -> int:
    """``"143104Mi"`` / ``"1Gi"`` -> MiB (the binary suffixes render-slices uses)."""
    units = {"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
    return int(quantity[:-2]) * units[quantity[-2:]]


def load_layout(spec: str, config: str | None) -> Layout:
    """``render-slices`` (with the optional node-config file ``config``),
    ``render-slices:CONFIG`` or ``file:PATH`` (a module). The driver's logs go to warning
    level (rendering slices for many nodes would log each GPU's enforcement tier)."""
    logs.configure("warning", "console")
    if spec == "render-slices":
        return RenderSlicesLayout(config)
    if spec.startswith("render-slices:"):
        return RenderSlicesLayout(spec.removeprefix("render-slices:"))
    if spec.startswith("file:"):
        if config is not None:
            raise SystemExit("--config applies to --layout render-slices only")
        layout: Layout = _module(Path(spec.removeprefix("file:")))
        return layout
    raise SystemExit(f"--layout: 'render-slices' or 'file:PATH', got {spec!r}")


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"layout_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--layout: cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- cluster


def wait(what: str, fn: Callable[[], Any], timeout: float = 120.0, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


CLIENT_LIMITS = {
    "LOCAL_CLUSTER_SCHEDULER_QPS": "500",
    "LOCAL_CLUSTER_SCHEDULER_BURST": "1000",
    "LOCAL_CLUSTER_CM_QPS": "500",
    "LOCAL_CLUSTER_CM_BURST": "1000",
}
"""Client rate limits the benchmarks start a local cluster with (hack/local-cluster's knobs;
the component defaults are QPS 50 / burst 100 for the scheduler, 20 / 30 for the
controller-manager): high enough that the scheduler's allocation work, not its client's
throttling, is what a benchmark measures."""


@contextlib.contextmanager
def local_cluster(
    kubeconfig: str | None, keep: bool, limits: Mapping[str, str] = CLIENT_LIMITS
) -> Iterator[tuple[str, str]]:
    """Yields (kubeconfig path, a line describing the control plane's client rate limits): the
    given kubeconfig, or that of a local control plane started in a fresh state directory with
    ``limits`` (hack/local-cluster variables) and stopped at the end unless ``keep``."""
    if kubeconfig:
        yield kubeconfig, f"cluster {kubeconfig}: client rate limits as configured there"
        return
    state = Path(os.environ.get("BENCH_CLUSTER_DIR", f"/tmp/dra-bench-{os.getpid()}"))
    env = {**os.environ, **limits, "LOCAL_CLUSTER_DIR": str(state)}
    script = [sys.executable, str(REPO / "hack" / "local-cluster")]
    subprocess.run([*script, "up"], env=env, check=True, stdout=subprocess.DEVNULL)
    try:
        yield str(state / "kubeconfig"), client_limit_flags(state)
    finally:
        if not keep:
            subprocess.run([*script, "down"], env=env, check=False, stderr=subprocess.DEVNULL)


def client_limit_flags(state: Path) -> str:
    """The ``--kube-api-qps``/``--kube-api-burst`` flags on the running kube-scheduler's and
    kube-controller-manager's command lines (``/proc/<pid>/cmdline``; "defaults" when none)."""
    parts = []
    for comp in ("kube-scheduler", "kube-controller-manager"):
        try:
            pid = int((state / "run" / f"{comp}.pid").read_text())
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except (OSError, ValueError):
            parts.append(f"{comp}: unknown")
            continue
        flags = [a for a in argv if a.startswith(("--kube-api-qps", "--kube-api-burst"))]
        parts.append(f"{comp} {' '.join(flags) or 'defaults'}")
    return "; ".join(parts)


def node_body(name: str, run: str) -> dict[str, Any]:
    """A kubelet-less Node: Ready, 64 cpu, 512Gi memory, 110 pods."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "stand-in"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, RUN_LABEL: run}},
        "status": {"capacity": resources, "allocatable": resources, "conditions": [ready]},
    }


def pod_body(name: str, claim: dict[str, str], gated: bool) -> dict[str, Any]:
    """A pod with one claim ``gpu`` (``claim`` is a podResourceClaim source, e.g.
    ``{"resourceClaimTemplateName": "t"}``); ``gated`` adds a scheduling gate."""
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
        ],
        "resourceClaims": [{"name": "gpu", **claim}],
        "terminationGracePeriodSeconds": 0,
    }
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def claim_body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": spec,
    }


def unschedulable(pod: Mapping[str, Any]) -> bool:
    """True once the scheduler marked the pod PodScheduled=False/Unschedulable."""
    return any(
        c["type"] == "PodScheduled"
        and c["status"] == "False"
        and c.get("reason") == "Unschedulable"
        for c in pod.get("status", {}).get("conditions") or []
    )


def pods_path(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/pods"


def claims_path(ns: str) -> str:
    return f"{RESOURCE}/namespaces/{ns}/resourceclaims"


class Cluster:
    """A kubernetes API client plus the benchmark's create/measure/cleanup steps."""

    def __init__(self, kubeconfig: str, threads: int = 8) -> None:
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        cfg.connection_pool_maxsize = threads * 2
        self.api = k8s.ApiClient(cfg)
        self.pool = ThreadPoolExecutor(threads)

    def close(self) -> None:
        self.pool.shutdown()
        self.api.close()

    def _send(
        self,
        method: str,
        path: str,
        body: Any,
        query: Mapping[str, Any] | None,
        content_type: str,
    ) -> Any:
        _, url, headers, data, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        return self.api.call_api(method, url, header_params=headers, body=data)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One API request with a JSON body; returns the decoded response. Raises ApiException
        (with ``status``) for an HTTP error."""
        resp = self._send(method, path, body, query, content_type)
        resp.read()
        if resp.status >= 400:
            raise ApiException(http_resp=resp)
        data: dict[str, Any] = json.loads(resp.data) if resp.data else {}
        return data

    def stream(self, path: str, query: Mapping[str, Any]) -> Any:
        """A GET whose body is read as it arrives (a watch): the urllib3 response. Raises
        ApiException for an HTTP error (e.g. 504 "Too large resource version")."""
        resp = self._send("GET", path, None, query, "application/json")
        if resp.status >= 400:
            resp.read()
            raise ApiException(http_resp=resp)
        return resp.response

    def exists(self, path: str) -> bool:
        try:
            self.call("GET", path)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def gone(self, path: str) -> bool:
        return not self.exists(path)

    def parallel(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> None:
        for _ in self.pool.map(fn, items):
            pass

    def put_classes(self, classes: Sequence[dict[str, Any]]) -> None:
        """Create each DeviceClass, replacing one of the same name."""
        for c in classes:
            path = f"{RESOURCE}/deviceclasses/{c['metadata']['name']}"
            with contextlib.suppress(ApiException):
                self.call("DELETE", path)
            wait(f"{path} gone", partial(self.gone, path), 30, 0.05)
            self.call("POST", f"{RESOURCE}/deviceclasses", c)

    def put_policies(self, layout: Layout) -> float:
        """Replace the admission objects a benchmark installed by the layout's
        (:func:`layout_policies`), then wait until the API server applies them: a dry-run
        ``gpu-quarter`` claim (the layout's ``claim_spec``) comes back with
        ``capacity.requests.slots`` == :func:`layout_sized_slots` (None: without). Returns the
        seconds that took. Raises RuntimeError after 60 s."""
        start = time.monotonic()
        selector = {"labelSelector": POLICY_LABEL}
        for path in reversed(KINDS.values()):
            self.call("DELETE", path, query=selector)
        for obj in layout_policies(layout):
            obj["metadata"].setdefault("labels", {})[POLICY_LABEL] = "true"
            self.call("POST", KINDS[obj["kind"]], obj)
        expected = layout_sized_slots(layout, PROBE_CLASS)
        probe = claim_body("bench-policy-probe", layout.claim_spec(PROBE_CLASS))

        def applied() -> bool:
            try:
                got = self.call("POST", claims_path("default"), probe, {"dryRun": "All"})
            except ApiException as exc:
                # A validating policy can be in effect before its mutating twin (the sizing
                # policy refuses an unsized product claim until the size is written): not yet.
                if exc.status in (403, 422) and "ValidatingAdmissionPolicy" in str(exc.body):
                    return False
                raise
            return requested_slots(got["spec"]) == expected

        wait(f"a {PROBE_CLASS} claim sized slots={expected}", applied, 60, 0.2)
        return time.monotonic() - start

    def add_nodes(self, layout: Layout, run: str, count: int, gpus: int) -> list[str]:
        """Create ``count`` Ready nodes ``<run>-n<i>`` and publish their slices; returns the
        names once no node carries a taint (the controller-manager lifts not-ready)."""
        names = [f"{run}-n{i:03d}" for i in range(count)]
        self.parallel(lambda n: self.call("POST", "/api/v1/nodes", node_body(n, run)), names)
        slices = [s for n in names for s in layout.slices(n, gpus)]
        for s in slices:
            s["metadata"].setdefault("labels", {})[RUN_LABEL] = run
        self.parallel(lambda s: self.call("POST", f"{RESOURCE}/resourceslices", s), slices)
        wait("nodes untainted", lambda: self._untainted(run) == count, 120, 0.5)
        return names

    def _untainted(self, run: str) -> int:
        items = self.call("GET", "/api/v1/nodes", query={"labelSelector": f"{RUN_LABEL}={run}"})
        return sum(1 for n in items["items"] if not n["spec"].get("taints"))

    def namespace(self, name: str) -> None:
        body = {"metadata": {"name": name, "labels": {RUN_LABEL: name}}}
        self.call("POST", "/api/v1/namespaces", body)
        sa = f"/api/v1/namespaces/{name}/serviceaccounts/default"
        wait(f"{name}/default ServiceAccount", lambda: self.exists(sa), 60, 0.2)

    def create_pod(self, ns: str, body: dict[str, Any]) -> None:
        self.call("POST", pods_path(ns), body)

    def create_claim(self, ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        """Create a ResourceClaim; returns it as the API server stored it (after admission)."""
        return self.call("POST", claims_path(ns), claim_body(name, spec))

    def patch_pod(self, ns: str, name: str, patch: list[dict[str, Any]]) -> None:
        """Apply a JSON patch to a pod."""
        path = f"{pods_path(ns)}/{name}"
        self.call("PATCH", path, patch, content_type="application/json-patch+json")

    def read_pod(self, ns: str, name: str) -> dict[str, Any]:
        return self.call("GET", f"{pods_path(ns)}/{name}")

    def delete_pod(self, ns: str, name: str) -> None:
        self.call("DELETE", f"{pods_path(ns)}/{name}", query={"gracePeriodSeconds": 0})

    def read_claim(self, ns: str, name: str) -> dict[str, Any]:
        return self.call("GET", f"{claims_path(ns)}/{name}")

    def delete_claim(self, ns: str, name: str) -> None:
        self.call("DELETE", f"{claims_path(ns)}/{name}")

    def list_pods(self, ns: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.call("GET", pods_path(ns))["items"]
        return items

    def list_claims(self, ns: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.call("GET", claims_path(ns))["items"]
        return items

    def pods_resource_version(self, ns: str) -> str:
        """The resource version of a full list of the namespace's pods (served from the API
        server's watch cache, so a watch from it starts at once)."""
        version: str = self.call("GET", pods_path(ns))["metadata"]["resourceVersion"]
        return version

    def cleanup(self, run: str, ns: str | None) -> None:
        """Delete the run's pods and claims (namespace ``ns``), slices and nodes; returns when
        they are gone, so the next measurement starts from an empty scheduler cache."""
        if ns is not None:
            self.call("DELETE", pods_path(ns), query={"gracePeriodSeconds": 0})
            self.call("DELETE", claims_path(ns))
            wait("pods gone", lambda: not self.list_pods(ns), 120, 0.5)
            wait("claims gone", lambda: not self.list_claims(ns), 120, 0.5)
            self.call("DELETE", f"/api/v1/namespaces/{ns}")
        sel = {"labelSelector": f"{RUN_LABEL}={run}"}
        self.call("DELETE", f"{RESOURCE}/resourceslices", query=sel)
        self.call("DELETE", "/api/v1/nodes", query=sel)
        wait(
            "slices gone",
            lambda: not self.call("GET", f"{RESOURCE}/resourceslices", query=sel)["items"],
            120,
            0.5,
        )
        wait(
            "nodes gone",
            lambda: not self.call("GET", "/api/v1/nodes", query=sel)["items"],
            120,
            0.5,
        )


MAX_WATCH_RESTARTS = 50
"""Restarts of a :class:`BindWatch` (relist, rewatch) before it gives up."""


class BindWatch:
    """Watches a namespace's pods from a resource version; records when each pod first has
    ``spec.nodeName`` (monotonic seconds) and which pods were ever marked Unschedulable.

    A watch that ends early or gets an ERROR event (e.g. the API server's "Too large resource
    version" when its watch cache lags the list it was started from) is restarted from a fresh
    list, whose bound pods are recorded at that moment (``restarts`` counts them); ``error``
    holds the last failure."""

    def __init__(self, cluster: Cluster, ns: str, resource_version: str) -> None:
        self.bound: dict[str, float] = {}
        self.unschedulable: set[str] = set()
        self.restarts = 0
        self.error: str | None = None
        self._cluster, self._ns = cluster, ns
        self._stop = threading.Event()
        self._resp: Any = None
        try:
            self._resp = self._open(resource_version)
        except ApiException as e:
            self.error = f"watch refused: HTTP {e.status} {e.body}"
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _open(self, resource_version: str) -> Any:
        query = {"watch": "true", "resourceVersion": resource_version, "timeoutSeconds": 900}
        return self._cluster.stream(pods_path(self._ns), query)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._follow() and self._stop.is_set():
                    return
                self.restarts += 1
                if self.restarts > MAX_WATCH_RESTARTS:
                    return
                time.sleep(0.2)
                self._relist()
        except Exception as e:  # noqa: BLE001 - the stream ends when close() shuts it
            if not self._stop.is_set():
                self.error = f"{type(e).__name__}: {e}"

    def _relist(self) -> None:
        """Record the pods of a fresh list and reopen the watch from its resource version."""
        listed = self._cluster.call("GET", pods_path(self._ns))
        now = time.monotonic()
        for pod in listed["items"]:
            self._event(pod, now)
        try:
            self._resp = self._open(listed["metadata"]["resourceVersion"])
        except ApiException as e:
            self.error = f"watch refused: HTTP {e.status} {e.body}"
            self._resp = None

    def _follow(self) -> bool:
        """Consume the stream; False after an ERROR event or a refused watch, True when it
        ends."""
        if self._resp is None:
            return False
        for line in iter_resp_lines(self._resp):
            if self._stop.is_set():
                return True
            if not line.strip():
                continue
            event = json.loads(line)
            if event["type"] == "ERROR":
                self.error = json.dumps(event["object"].get("message"))
                return False
            self._event(event["object"], time.monotonic())
        return True

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _event(self, pod: dict[str, Any], now: float) -> None:
        name = pod["metadata"]["name"]
        if pod["spec"].get("nodeName"):
            self.bound.setdefault(name, now)
        elif unschedulable(pod):
            self.unschedulable.add(name)

    def close(self) -> None:
        """Stop the watch (shut its connection unless it already ended)."""
        self._stop.set()
        with contextlib.suppress(RuntimeError, AttributeError):
            self._resp.shutdown()
