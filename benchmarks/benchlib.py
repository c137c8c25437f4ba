"""Shared plumbing of the scheduler benchmarks (bench_scheduler, bench_packing, check_modes).

A *layout* is what the driver publishes, as three functions (a module passed as
``--layout file:PATH`` exposes them; ``--layout render-slices`` is the driver's own):

- ``slices(node: str, gpus: int) -> list[dict]``: the ResourceSlices (API JSON) of one node;
- ``classes() -> list[dict]``: the DeviceClasses it needs;
- ``claim_spec(class_name: str) -> dict``: the ResourceClaim ``spec`` a user writes for a
  product class name (``gpu-quarter``, ``gpu-half-sm-sharing``, ...), one request ``gpu``.

The cluster is the local control plane (hack/local-cluster: kube-apiserver, -controller-manager
and -scheduler v1.37.2 with their default client QPS) or any cluster given by a kubeconfig.
Nodes are kubelet-less Node objects (Ready, allocatable cpu/memory/pods): nothing runs, the
benchmarks measure scheduling only. Every object a run creates carries the label
``bench.dra.dev/run=<run>`` and is deleted by :func:`Cluster.cleanup`.
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
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from dra_driver.enforcement import detect_enforcement
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.config import load_node_config
from dra_driver.deviceclasses import build_device_classes
from dra_driver.gpus import Inventory
from dra_driver.slices import render_slices_json

REPO = Path(__file__).resolve().parents[1]
DRIVER = DEFAULT_DRIVER_NAME
RUN_LABEL = "bench.dra.dev/run"
GATE = "bench.dra.dev/hold"
GPU_MODEL = "H200"
MIB = 1024 * 1024
PRODUCT_SIZES = {"eighth": 0.125, "quarter": 0.25, "half": 0.5, "full": 1.0}
"""Portion of a card per product class stem (``gpu-<stem>[-sm-sharing]``)."""
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_DEVICES_PER_SLICE = 64
"""Kubernetes 1.37 limits: 8 counter sets per slice; 64 devices per slice once a device
consumes counters or allows multiple allocations."""


class Layout(Protocol):
    def slices(self, node: str, gpus: int) -> list[dict[str, Any]]: ...
    def classes(self) -> list[dict[str, Any]]: ...
    def claim_spec(self, class_name: str) -> dict[str, Any]: ...


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


def _tiers(inventory: Inventory) -> dict[str, str]:
    return detect_enforcement(inventory, simulated=True).tiers


def rendered_slices(node: str, gpus: int, config: str | None) -> list[dict[str, Any]]:
    """What ``dra-driver render-slices --node NODE --gpus simulated:H200xGPUS [--config]``
    prints (same function, same enforcement detection, called in-process)."""
    text = render_slices_json(node, f"simulated:{GPU_MODEL}x{gpus}", config, DRIVER, _tiers)
    result: list[dict[str, Any]] = json.loads(text)
    return result


def gpu_attributes(node: str, gpus: int) -> list[dict[str, Any]]:
    """Per GPU (by index), the attributes render-slices gives its whole-card product device,
    without ``product``, ``portion``, ``fractionModel`` and ``computeMode``."""
    devices = [d for s in rendered_slices(node, gpus, None) for d in s["spec"].get("devices", [])]
    drop = {"product", "portion", "fractionModel", "computeMode"}
    by_index = {
        d["attributes"]["index"]["int"]: {k: v for k, v in d["attributes"].items() if k not in drop}
        for d in devices
        if d["attributes"]["product"]["string"] == "full"
    }
    return [by_index[i] for i in range(gpus)]


def pool_slices(
    node: str, counter_sets: Sequence[dict[str, Any]], devices: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Slices of pool ``node``: counter sets first (8 per slice), then devices (64 per slice)."""
    parts: list[tuple[str, list[dict[str, Any]]]] = [
        ("sharedCounters", list(counter_sets[i : i + MAX_COUNTER_SETS_PER_SLICE]))
        for i in range(0, len(counter_sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    parts += [
        ("devices", list(devices[i : i + MAX_DEVICES_PER_SLICE]))
        for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)
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
    ``dra_driver.deviceclasses``. With a capacity-model configuration a product class name is
    written as ``gpu-memory[-sm-sharing]`` with ``capacity.requests.memory`` = the portion of
    the device's largest request, rounded DOWN to the request policy's step."""

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

    def classes(self) -> list[dict[str, Any]]:
        return build_device_classes(load_node_config(self.config))

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
    ``render-slices:CONFIG`` or ``file:PATH`` (a module)."""
    if spec == "render-slices":
        return RenderSlicesLayout(config)
    if spec.startswith("render-slices:"):
        return RenderSlicesLayout(spec.removeprefix("render-slices:"))
    if spec.startswith("file:"):
        if config is not None:
            raise SystemExit("--config applies to --layout render-slices only")
        return _module(Path(spec.removeprefix("file:")))  # type: ignore[return-value]
    raise SystemExit(f"--layout: 'render-slices' or 'file:PATH', got {spec!r}")


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"layout_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--layout: cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- cluster


RAW = {"_preload_content": False}
"""Keyword argument of the API calls whose response is not turned into a model (CPU)."""


def drain(resp: Any) -> None:
    """Read a raw response to its end, so its connection goes back to the pool."""
    resp.data  # noqa: B018


def raw(resp: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(resp.data)
    return data


def wait(what: str, fn: Callable[[], Any], timeout: float = 120.0, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


@contextlib.contextmanager
def local_cluster(kubeconfig: str | None, keep: bool) -> Iterator[str]:
    """Yields a kubeconfig path: the given one, or that of a local control plane started in
    a fresh state directory (stopped at the end unless ``keep``)."""
    if kubeconfig:
        yield kubeconfig
        return
    state = Path(os.environ.get("BENCH_CLUSTER_DIR", f"/tmp/dra-bench-{os.getpid()}"))
    env = {**os.environ, "LOCAL_CLUSTER_DIR": str(state)}
    script = [sys.executable, str(REPO / "hack" / "local-cluster")]
    subprocess.run([*script, "up"], env=env, check=True, stdout=subprocess.DEVNULL)
    try:
        yield str(state / "kubeconfig")
    finally:
        if not keep:
            subprocess.run([*script, "down"], env=env, check=False, stderr=subprocess.DEVNULL)


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


def unschedulable(pod: dict[str, Any]) -> bool:
    """True once the scheduler marked the pod PodScheduled=False/Unschedulable."""
    return any(
        c["type"] == "PodScheduled"
        and c["status"] == "False"
        and c.get("reason") == "Unschedulable"
        for c in pod.get("status", {}).get("conditions") or []
    )


class Cluster:
    """A kubernetes API client plus the benchmark's create/measure/cleanup steps."""

    def __init__(self, kubeconfig: str, threads: int = 8) -> None:
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        cfg.connection_pool_maxsize = threads * 2
        self.api = k8s.ApiClient(cfg)
        self.core = k8s.CoreV1Api(self.api)
        self.res = k8s.ResourceV1Api(self.api)
        self.pool = ThreadPoolExecutor(threads)

    def close(self) -> None:
        self.pool.shutdown()
        self.api.close()

    def parallel(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> None:
        for _ in self.pool.map(fn, items):
            pass

    def put_classes(self, classes: Sequence[dict[str, Any]]) -> None:
        """Create each DeviceClass, replacing one of the same name."""
        for c in classes:
            name = c["metadata"]["name"]
            with contextlib.suppress(ApiException):
                self.res.delete_device_class(name)
            wait(f"DeviceClass {name} gone", lambda n=name: not self._class_exists(n), 30, 0.05)
            self.res.create_device_class(c)

    def _class_exists(self, name: str) -> bool:
        try:
            self.res.read_device_class(name, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def add_nodes(self, layout: Layout, run: str, count: int, gpus: int) -> list[str]:
        """Create ``count`` Ready nodes ``<run>-n<i>`` and publish their slices; returns the
        names once no node carries a taint (the controller-manager lifts not-ready)."""
        names = [f"{run}-n{i:03d}" for i in range(count)]
        self.parallel(lambda n: drain(self.core.create_node(node_body(n, run), **RAW)), names)
        slices = [s for n in names for s in layout.slices(n, gpus)]
        for s in slices:
            s["metadata"].setdefault("labels", {})[RUN_LABEL] = run
        self.parallel(lambda s: drain(self.res.create_resource_slice(s, **RAW)), slices)
        wait("nodes untainted", lambda: self._untainted(run) == count, 120, 0.5)
        return names

    def _untainted(self, run: str) -> int:
        items = raw(
            self.core.list_node(label_selector=f"{RUN_LABEL}={run}", _preload_content=False)
        )
        return sum(1 for n in items["items"] if not n["spec"].get("taints"))

    def namespace(self, name: str) -> None:
        body = {"metadata": {"name": name, "labels": {RUN_LABEL: name}}}
        self.core.create_namespace(body)
        wait(f"{name}/default ServiceAccount", lambda: self._has_sa(name), 60, 0.2)

    def _has_sa(self, ns: str) -> bool:
        try:
            self.core.read_namespaced_service_account("default", ns, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def create_pod(self, ns: str, body: dict[str, Any]) -> None:
        """Create a pod (the response is not turned into a model: that costs CPU here)."""
        drain(self.core.create_namespaced_pod(ns, body, **RAW))

    def patch_pod(self, ns: str, name: str, patch: list[dict[str, Any]]) -> None:
        """Apply a JSON patch to a pod (response not turned into a model)."""
        drain(self.core.patch_namespaced_pod(name, ns, patch, **RAW))

    def list_pods(self, ns: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = raw(
            self.core.list_namespaced_pod(ns, _preload_content=False)
        )["items"]
        return items

    def count_claims(self, ns: str) -> int:
        return len(
            raw(self.res.list_namespaced_resource_claim(ns, _preload_content=False))["items"]
        )

    def cleanup(self, run: str, ns: str | None) -> None:
        """Delete the run's pods and claims (namespace ``ns``), slices and nodes; returns when
        they are gone, so the next measurement starts from an empty scheduler cache."""
        if ns is not None:
            self.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
            self.res.delete_collection_namespaced_resource_claim(ns)
            wait("pods gone", lambda: not self.list_pods(ns), 120, 0.5)
            wait("claims gone", lambda: self.count_claims(ns) == 0, 120, 0.5)
            self.core.delete_namespace(ns)
        sel = f"{RUN_LABEL}={run}"
        self.res.delete_collection_resource_slice(label_selector=sel)
        self.core.delete_collection_node(label_selector=sel)
        wait("slices gone", lambda: not self._slices(sel), 120, 0.5)
        wait(
            "nodes gone",
            lambda: (
                not raw(self.core.list_node(label_selector=sel, _preload_content=False))["items"]
            ),
            120,
            0.5,
        )

    def _slices(self, selector: str) -> list[Any]:
        items: list[Any] = raw(
            self.res.list_resource_slice(label_selector=selector, _preload_content=False)
        )["items"]
        return items


class BindWatch:
    """Watches a namespace's pods from a resource version; records when each pod first has
    ``spec.nodeName`` (monotonic seconds) and which pods were ever marked Unschedulable."""

    def __init__(self, cluster: Cluster, ns: str, resource_version: str) -> None:
        self.bound: dict[str, float] = {}
        self.unschedulable: set[str] = set()
        self._stop = threading.Event()
        self._resp = cluster.core.list_namespaced_pod(
            ns,
            watch=True,
            resource_version=resource_version,
            timeout_seconds=900,
            _preload_content=False,
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(Exception):  # the stream ends when close() shuts it
            for line in iter_resp_lines(self._resp):
                if line.strip():
                    self._event(json.loads(line)["object"], time.monotonic())
                if self._stop.is_set():
                    return

    def _event(self, pod: dict[str, Any], now: float) -> None:
        name = pod["metadata"]["name"]
        if pod["spec"].get("nodeName"):
            self.bound.setdefault(name, now)
        elif unschedulable(pod):
            self.unschedulable.add(name)

    def close(self) -> None:
        self._stop.set()
        self._resp.shutdown()
