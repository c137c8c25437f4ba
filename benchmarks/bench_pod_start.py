"""Pod start latency on a real node with and without a GPU-fraction claim; DaemonSet rollout.

Starts the local cluster with one real node (hack/local-cluster + hack/local-node: kubelet,
containerd, runc), installs the driver's Helm chart (simulated 8 x H200), then creates pods
one at a time, in turn a plain pod (baseline, measured in the same run), a pod whose
``gpu-eighth`` claim joins GPU 0 (whose MPS server already serves the warm-up pod's claim), and,
while idle GPUs remain (GPUs 1-7, one each), a pod whose claim is the first on its GPU (its
compute mode set, its MPS server started); it times create -> Running (all containers running,
polled every 20 ms). Claims choose their GPU with a selector on the driver's ``index``
attribute. Where the time goes: a watch of the namespace's pods and claims stamps each pod's
phases as the API server reports them (claim created by the resourceclaim controller, claim
allocated, pod bound to the node, pod Running); the table gives each phase's p50 per kind,
and of the kubelet's NodePrepareResources call to the plugin (from the kubelet's metrics, read
before each pod's create and after it runs). Then the kubelet's DRA histograms of the run.
Then ``helm upgrade`` with a changed value and the time until the DaemonSet has rolled out
(new pod running, old one gone). Prints the tables; asserts nothing. Times are seconds.

Usage: .venv/bin/python benchmarks/bench_pod_start.py [--pods 20] [--keep-cluster] [--smoke]

``--smoke`` measures 1 pod of each kind (after the warm-up pair) and the rollout; it needs a
real node like the full run (the e2e tests run it; numbers not checked). The last line is
``pod_start_p50_ratio_to_plain: <number>`` (p50 of a claim joining GPU 0 / p50 of plain pods).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from devtools import localinstall  # noqa: E402

NODE = "bench-node"
GPUS = 8
DRIVER = "gpu-fraction.dra.dev"
NAMESPACE = "bench"
RELEASE_NS = "gpu-fraction-dra"
SCRIPT = "trap 'exit 0' TERM; while :; do sleep 1; done"


def raw(resp: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(resp.data)
    return data


def wait(what: str, fn: Any, timeout: float = 120.0, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(every)
    raise RuntimeError(f"timed out waiting for {what}")


def running(core: k8s.CoreV1Api, name: str) -> bool:
    pod = raw(core.read_namespaced_pod(name, NAMESPACE, _preload_content=False))
    statuses = pod["status"].get("containerStatuses") or []
    return bool(statuses) and all(s.get("state", {}).get("running") for s in statuses)


def pod_body(name: str, gpu: int | None) -> dict[str, Any]:
    """A busybox pod; with a ``gpu-eighth`` claim on GPU ``gpu`` unless None."""
    container: dict[str, Any] = {
        "name": "main",
        "image": "localhost/busybox:1.35.0",
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", SCRIPT],
    }
    spec: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "terminationGracePeriodSeconds": 1,
        "dnsPolicy": "Default",
        "containers": [container],
    }
    if gpu is not None:
        container["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": f"eighth-{gpu}"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def model(kind: Any, body: dict[str, Any]) -> Any:
    """The client's model ``kind`` of ``body`` (``from_dict`` is typed Optional: it returns None
    only for None)."""
    obj = kind.from_dict(body)
    assert obj is not None
    return obj


def eighth_template(gpu: int) -> dict[str, Any]:
    """ResourceClaimTemplate ``eighth-<gpu>``: one ``gpu-eighth`` on GPU ``gpu``."""
    on = f'device.attributes["{DRIVER}"].index == {gpu}'
    exactly = {"deviceClassName": "gpu-eighth", "selectors": [{"cel": {"expression": on}}]}
    return {
        "metadata": {"name": f"eighth-{gpu}"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


PHASES = ("claim created", "claim allocated", "pod bound", "pod Running")
"""A pod's phases as the timeline stamps them, in order."""


class Timeline:
    """Monotonic times at which the API server's watch events first showed each pod's phases
    (:data:`PHASES`); a claim counts for the pod named in its owner reference."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self.api = api
        self.seen: dict[str, dict[str, float]] = {}
        self.lock = threading.Lock()
        for target in (self._pods, self._claims):
            threading.Thread(target=self._quietly, args=(target,), daemon=True).start()

    @staticmethod
    def _quietly(watch: Any) -> None:
        """Run ``watch`` until its stream breaks (the cluster going down at the end; a break
        before shows as a pod whose Running the watch never reports)."""
        try:
            watch()
        except Exception:  # noqa: BLE001
            return

    def stamp(self, pod: str, phase: str) -> None:
        with self.lock:
            self.seen.setdefault(pod, {}).setdefault(phase, time.monotonic())

    def phases(self, pod: str, t0: float) -> dict[str, float]:
        """Seconds from ``t0`` (the create call) to each phase seen of ``pod``."""
        with self.lock:
            return {k: v - t0 for k, v in self.seen.get(pod, {}).items()}

    def _pods(self) -> None:
        core = k8s.CoreV1Api(self.api)
        for event in k8s_watch.Watch().stream(core.list_namespaced_pod, NAMESPACE):
            pod = event["object"]
            if pod.spec.node_name:
                self.stamp(pod.metadata.name, "pod bound")
            statuses = pod.status.container_statuses or []
            if statuses and all(s.state.running for s in statuses):
                self.stamp(pod.metadata.name, "pod Running")

    def _claims(self) -> None:
        resource = k8s.ResourceV1Api(self.api)
        # "object": no model class (this client has none for resource.k8s.io/v1 claims)
        stream = k8s_watch.Watch(return_type="object").stream(
            resource.list_namespaced_resource_claim, NAMESPACE
        )
        for event in stream:
            claim = event["raw_object"]
            owners = claim["metadata"].get("ownerReferences") or [{}]
            pod = owners[0].get("name", "")
            self.stamp(pod, "claim created")
            if claim.get("status", {}).get("allocation"):
                self.stamp(pod, "claim allocated")


def start_time(
    core: k8s.CoreV1Api, name: str, gpu: int | None, timeline: Timeline | None = None
) -> float:
    """Seconds from create to Running of a new pod ``name``; with ``timeline``, its phases and
    the kubelet's Prepare call to the plugin (read from the kubelet's metrics before the
    create and after Running, outside the timed part) are kept in :data:`PHASE_TIMES`."""
    before = prepare_call_seconds(core.api_client) if timeline is not None else 0.0
    t0 = time.monotonic()
    core.create_namespaced_pod(NAMESPACE, model(k8s.V1Pod, pod_body(name, gpu)))
    wait(f"pod {name} Running", lambda: running(core, name))
    took = time.monotonic() - t0
    if timeline is not None:
        # the watch may report Running a moment after the poll saw it
        wait(f"pod {name} Running on the watch", lambda: "pod Running" in timeline.seen[name], 10)
        phases = timeline.phases(name, t0)
        if gpu is not None:
            phases[PREPARE_CALL] = prepare_call_seconds(core.api_client) - before
        PHASE_TIMES.setdefault(kind_of(name), []).append(phases)
    return took


PREPARE_CALL = "Prepare call"
"""The kubelet's NodePrepareResources call to the plugin, as the kubelet timed it."""


def prepare_call_seconds(api: k8s.ApiClient) -> float:
    """Seconds the kubelet spent in NodePrepareResources calls to the driver so far (the sum of
    its ``dra_grpc_operations_duration_seconds`` histogram for that method)."""
    total = 0.0
    for line in kubelet_metrics(api).splitlines():
        if line.startswith("dra_grpc_operations_duration_seconds_sum{") and (
            "NodePrepareResources" in line
        ):
            total += float(line.rpartition(" ")[2])
    return total


PHASE_TIMES: dict[str, list[dict[str, float]]] = {}
"""Kind of pod -> the phases of each of its pods (:meth:`Timeline.phases`)."""


def kind_of(name: str) -> str:
    return name.rpartition("-")[0]


DRA_METRICS = ("dra_operations_duration_seconds", "dra_grpc_operations_duration_seconds")
"""The kubelet's histograms of its DRA work: each operation (PrepareResources: the gRPC call to
the plugin and the kubelet's own checkpoint) and each gRPC call to a plugin (the plugin's
Prepare as the kubelet sees it; the local install serves no plugin metrics)."""


def kubelet_metrics(api: k8s.ApiClient) -> str:
    """The kubelet's /metrics, read from its port on this machine with the kubeconfig's client
    certificate (the API server's node proxy resolves the node's name, which no DNS knows)."""
    node = raw(k8s.CoreV1Api(api).read_node(NODE, _preload_content=False))
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    tls = ssl.create_default_context()
    tls.check_hostname = False
    tls.verify_mode = ssl.CERT_NONE  # the kubelet's self-signed serving certificate
    tls.load_cert_chain(api.configuration.cert_file, api.configuration.key_file)
    url = f"https://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, context=tls, timeout=10) as resp:
        text: str = resp.read().decode()
    return text


def dra_means(text: str) -> dict[str, tuple[int, float]]:
    """Series of :data:`DRA_METRICS` in a /metrics ``text`` (labels as text) -> (count, mean
    seconds)."""
    values: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        for metric in DRA_METRICS:
            for suffix in ("_sum", "_count"):
                if name == metric + suffix:
                    labels, _, value = rest.rpartition(" ")
                    values[(f"{metric}{{{labels}", suffix)] = float(value)
    means = {}
    for (series, suffix), total in values.items():
        count = values.get((series, "_count"), 0.0)
        if suffix == "_sum" and count:
            means[series] = (int(count), total / count)
    return means


def gone(core: k8s.CoreV1Api, name: str) -> None:
    """Delete pod ``name`` and wait until it and its claims are gone (its fraction freed)."""
    core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)

    def done() -> bool:
        pods = raw(core.list_namespaced_pod(NAMESPACE, _preload_content=False))["items"]
        claims = raw(
            k8s.ResourceV1Api(core.api_client).list_namespaced_resource_claim(
                NAMESPACE, _preload_content=False
            )
        )["items"]
        mine = [c for c in claims if c["metadata"]["name"].startswith(f"{name}-")]
        return all(p["metadata"]["name"] != name for p in pods) and not mine

    wait(f"pod {name} and its claim gone", done, timeout=120, every=0.1)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def rollout(api: k8s.ApiClient, kubeconfig: Path, values: Path) -> float:
    core = k8s.CoreV1Api(api)

    def plugin_pods() -> list[dict[str, Any]]:
        """The kubelet plugin's pods (the MPS service's pods are not rolled by an upgrade)."""
        items: list[dict[str, Any]] = raw(
            core.list_namespaced_pod(
                RELEASE_NS,
                label_selector="app.kubernetes.io/component=kubelet-plugin",
                _preload_content=False,
            )
        )["items"]
        return items

    old = {p["metadata"]["uid"] for p in plugin_pods()}
    t0 = time.monotonic()
    localinstall.helm(
        kubeconfig, "upgrade", "gpu-fraction-dra", str(localinstall.CHART), "-n", RELEASE_NS,
        "-f", str(values), "--set", "logLevel=debug",
    )  # fmt: skip

    def done() -> bool:
        pods = plugin_pods()
        uids = {p["metadata"]["uid"] for p in pods}
        return (
            len(pods) == 1
            and not uids & old
            and all(
                s.get("state", {}).get("running")
                for p in pods
                for s in p["status"].get("containerStatuses") or [{}]
            )
        )

    wait("rollout", done, timeout=180, every=0.05)
    return time.monotonic() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=20, help="pods of each kind")
    parser.add_argument("--keep-cluster", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="1 pod each (numbers not checked)")
    args = parser.parse_args()
    if args.smoke:
        args.pods = 1
    work = Path(tempfile.mkdtemp(prefix="dra-bench-"))
    state = work / "cluster"
    env = {
        **os.environ,
        "LOCAL_CLUSTER_DIR": str(state),
        "LOCAL_CLUSTER_NODES": NODE,
        "LOCAL_NODE_LABELS": "nvidia.com/gpu.present=true",  # the chart's node selector
    }
    cluster = [sys.executable, str(REPO / "hack" / "local-cluster")]
    subprocess.run([sys.executable, str(REPO / "hack" / "build-image")], check=True)
    subprocess.run([*cluster, "up"], env=env, check=True)
    try:
        kubeconfig = state / "kubeconfig"
        api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
        core = k8s.CoreV1Api(api)
        values = work / "values.yaml"
        values.write_text(
            yaml.safe_dump(
                {
                    **localinstall.local_values(state),
                    "gpus": "simulated:H200x8",
                    "logLevel": "info",
                    # the admin's grant (docs/admin-guide.md, "Tenants"): the namespace with
                    # the tenant label and Pod Security baseline (the pods run as busybox's
                    # root), and its quota
                    "tenants": {
                        "namespaces": {NAMESPACE: {"gpu-eighth": 1000}},
                        "createNamespaces": True,
                        "podSecurity": "baseline",
                    },
                }
            )
        )
        localinstall.install(kubeconfig, "gpu-fraction-dra", RELEASE_NS, values)
        wait(
            "slices",
            lambda: raw(k8s.ResourceV1Api(api).list_resource_slice(_preload_content=False))[
                "items"
            ],
            timeout=180,
            every=0.2,
        )
        wait("default SA", lambda: core.list_namespaced_service_account(NAMESPACE).items)
        for gpu in range(GPUS):
            k8s.ResourceV1Api(api).create_namespaced_resource_claim_template(
                NAMESPACE, model(k8s.V1ResourceClaimTemplate, eighth_template(gpu))
            )
        # Warm-up: the first pod of each kind pays one-time costs (image snapshot, CNI); the
        # warm-up claim starts GPU 0's MPS server, which the joining claims then share.
        start_time(core, "warm-plain", None)
        start_time(core, "warm-claim", 0)
        timeline = Timeline(api)
        plain, joining, first = [], [], []
        for i in range(args.pods):
            plain.append(start_time(core, f"plain-{i}", None, timeline))
            joining.append(start_time(core, f"claim-{i}", 0, timeline))
            gone(core, f"claim-{i}")  # GPU 0 keeps room: the warm-up claim and this one
            if i + 1 < GPUS:
                first.append(start_time(core, f"first-{i + 1}", i + 1, timeline))
        # before the rollout replaces the plugin (and its counters)
        try:
            dra = dra_means(kubelet_metrics(api))
        except (OSError, KeyError, k8s.ApiException) as exc:
            print(f"the kubelet's metrics could not be read: {exc}")
            dra = {}
        took = rollout(api, kubeconfig, values)
        print("\npod start latency, create -> Running, one real node")
        print(f"{'':44} {'pods':>5} {'p50':>8} {'p90':>8} {'mean':>8} {'p50/plain':>10}")
        rows = (
            ("plain pod (baseline)", plain),
            ("gpu-eighth joining a GPU whose server runs", joining),
            ("gpu-eighth, first claim on an idle GPU", first),
        )
        for label, xs in rows:
            ratio = pct(xs, 0.5) / pct(plain, 0.5)
            print(
                f"{label:44} {len(xs):5} {pct(xs, 0.5):7.2f}s {pct(xs, 0.9):7.2f}s "
                f"{statistics.mean(xs):7.2f}s {ratio:9.2f}x"
            )
        print(
            "\nwhere the time goes: p50 seconds from create to each phase (API watch events), "
            "and of the kubelet's Prepare call to the plugin (its metrics)"
        )
        print(f"{'':8} " + " ".join(f"{p:>16}" for p in (*PHASES, PREPARE_CALL)))
        for kind, runs in PHASE_TIMES.items():
            cells = []
            for phase in (*PHASES, PREPARE_CALL):
                xs = [r[phase] for r in runs if phase in r]
                cells.append(f"{pct(xs, 0.5):15.3f}s" if xs else f"{'-':>16}")
            print(f"{kind:8} " + " ".join(cells))
        print("\nthe kubelet's DRA work (its /metrics, every call of the run): count, mean")
        for series, (count, mean) in sorted(dra.items()):
            print(f"  {series[:110]:110} {count:5} {mean * 1000:8.1f} ms")
        print(f"DaemonSet rollout on helm upgrade (1 node, running pods kept): {took:.1f}s")
        print(f"pod_start_p50_ratio_to_plain: {pct(joining, 0.5) / pct(plain, 0.5):.2f}")
    finally:
        if not args.keep_cluster:
            subprocess.run([*cluster, "down"], env=env, check=False)
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
