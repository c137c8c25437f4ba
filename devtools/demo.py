"""`make demo`: GPU fractions end to end on a local Kubernetes cluster with a real node.

1. builds the container images (hack/build-image: the plugin, the sandbox image, a busybox and
   the tenant image) and the cluster's binaries (hack/build-k8s, kubectl included), then
   starts kube-apiserver, kube-scheduler, kube-controller-manager and etcd plus one real node,
   gpu-node-1: a kubelet with containerd and runc (hack/local-cluster, hack/local-node). Build
   output goes to the log file; one line per step is shown;
2. installs the driver with its Helm chart (deployments/helm/gpu-fraction-dra, values
   deployments/helm/demo-values.yaml: two simulated H200 GPUs, compute mode auto): the
   DaemonSets run the plugin image on the node, the MPS node service (the MPS emulator on this
   GPU-less node) and the kubelet plugin, which registers with the kubelet and publishes
   ResourceSlices;
3. shows the ResourceSlices and applies the example workloads (demo/*.yaml);
4. shows which pod got which fraction of which GPU and, from inside each container, what it
   sees of it: its /dev/nvidia* nodes, its memory and mode variables, its MPS pipe mount, and
   the tenant probe's own line (the memory limit and SM percentage its MPS namespace gave it,
   the MPS server's PID); and the kubelet's event for the misconfigured pod;
5. restarts the plugin (deletes its pod) and shows that every probe stayed connected to the
   same MPS server;
6. deletes the pods and shows that the kubelet's unprepare removed every CDI spec, checkpoint
   record and pipe directory (with --keep-cluster the pods stay, and the command that removes
   them is printed);
7. tears everything down (also on errors and Ctrl-C). Logs are kept and their path printed.

Usage: .venv/bin/python hack/demo [--keep-cluster]
"""

from __future__ import annotations

import argparse
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from devtools import localinstall
from devtools.waiting import WaitTimeout, wait_for
from dra_driver import DEFAULT_DRIVER_NAME as DRIVER
from dra_driver.cluster import gib as occupancy_gib
from dra_driver.mpsemu.probe import parse_line

REPO = Path(__file__).resolve().parents[1]
HACK = REPO / "hack"
API_ERRORS = (ApiException,)
"""Errors of the API server a wait retries (it may be starting or busy)."""
NODE = "gpu-node-1"
NAMESPACE = "gpu-demo"
RELEASE = "gpu-fraction-dra"
DEMO = REPO / "demo"
VALUES = REPO / "deployments" / "helm" / "demo-values.yaml"
PLUGIN_NAMESPACE = "gpu-fraction-dra"
MIB = 1024**2
T = TypeVar("T")


# ------------------------------------------------------------------------------ output


class Out:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.step_no = 0

    def step(self, title: str) -> None:
        self.step_no += 1
        bold, plain = ("\033[1m", "\033[0m") if sys.stdout.isatty() else ("", "")
        print(f"\n{bold}[{self.step_no}] {title}{plain}  (+{self.elapsed():.1f}s)", flush=True)

    def line(self, text: str = "", indent: int = 4) -> None:
        print(" " * indent + text, flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


out = Out()


def raw(resp: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(resp.data)
    return data


def gib(n: int) -> str:
    """GiB as ``dra-driver occupancy`` prints them (one decimal, rounded down: one rounding)."""
    return occupancy_gib(n)


# ------------------------------------------------------------------------------ pieces


PROGRESS = re.compile(r"^(build-k8s|build-image|local-cluster|local-node|install-node-prereqs): ")
"""A line of the project's own build and cluster tools (their progress); everything else they
print (Go's module downloads, compiler and package-manager output) goes to the log only."""


def is_progress(line: str) -> bool:
    """Whether ``line`` of a tool's output is shown (:data:`PROGRESS`), not only logged."""
    return bool(PROGRESS.match(line))


def run_logged(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    """Run ``cmd``, appending all its output to ``log`` and showing its progress lines
    indented; on failure show the log's last lines. Returns the exit code."""
    with log.open("a") as sink:
        sink.write(f"$ {' '.join(cmd)}\n")
        sink.flush()
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            sink.write(line)
            if is_progress(line):
                out.line(line.rstrip(), 6)
        rc = proc.wait()
    if rc != 0:
        out.line(f"{Path(cmd[0]).name} failed (exit {rc}); the end of its log {log.name}:", 6)
        for line in log.read_text(errors="replace").splitlines()[-20:]:
            out.line(line, 8)
    return rc


@contextmanager
def cluster(state: Path, keep: bool, log: Path) -> Iterator[Path]:
    """hack/local-cluster up (control plane + node gpu-node-1) ... down; output to ``log``."""
    env = {
        **os.environ,
        "LOCAL_CLUSTER_DIR": str(state),
        "LOCAL_CLUSTER_NODES": NODE,
        # What GPU Feature Discovery would label; the chart's default node selector.
        "LOCAL_NODE_LABELS": "nvidia.com/gpu.present=true",
    }
    cmd = [sys.executable, str(HACK / "local-cluster")]
    try:
        if run_logged([*cmd, "up"], log, env) != 0:
            raise RuntimeError("hack/local-cluster up failed (see above)")
        yield state / "kubeconfig"
    finally:
        if not keep:
            down = subprocess.run([*cmd, "down"], env=env, capture_output=True, text=True)
            if down.returncode != 0:  # say what was left behind
                out.line(f"WARNING: hack/local-cluster down failed:\n{down.stderr.strip()}")


def install_driver(kubeconfig: Path, state: Path, work: Path) -> None:
    """``helm install`` of the chart with deployments/helm/demo-values.yaml plus the local
    cluster's values (the image from `make image`, the API server's address)."""
    local = work / "local-values.yaml"
    local.write_text(yaml.safe_dump(localinstall.local_values(state)))
    localinstall.install(kubeconfig, RELEASE, PLUGIN_NAMESPACE, VALUES, "-f", str(local))


def container_log(node_dir: Path, pod: str, container: str) -> list[str]:
    return localinstall.container_log(node_dir, NAMESPACE, pod, container)


def apply_file(kubectl: Path, kubeconfig: Path, path: Path) -> list[str]:
    """``kubectl apply -f path``, as a user applies the examples (so that applying them again
    on a kept cluster is a no-op); returns kubectl's lines (``pod/notebook created``).

    Raises:
        RuntimeError: kubectl failed (its message included).
    """
    done = subprocess.run(
        [str(kubectl), "apply", "-f", str(path)],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl apply -f {path} failed: {done.stderr.strip()}")
    return [line.replace(".resource.k8s.io", "") for line in done.stdout.splitlines()]


# ------------------------------------------------------------------------------ the story


def show_slices(api: k8s.ApiClient) -> None:
    res = k8s.ResourceV1Api(api)
    slices = raw(
        res.list_resource_slice(field_selector=f"spec.nodeName={NODE}", _preload_content=False)
    )["items"]
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    counters = [c for s in slices for c in s["spec"].get("sharedCounters") or []]
    for s in slices:
        spec = s["spec"]
        what = (
            f"{len(spec['sharedCounters'])} counter sets"
            if spec.get("sharedCounters")
            else f"{len(spec.get('devices') or [])} devices"
        )
        out.line(
            f"ResourceSlice {s['metadata']['name']}: pool {spec['pool']['name']} "
            f"gen {spec['pool']['generation']}, {what}"
        )
    by_gpu: dict[int, list[dict[str, Any]]] = {}
    for d in devices:
        by_gpu.setdefault(attr(d, "index"), []).append(d)
    for index, devs in sorted(by_gpu.items()):
        first = devs[0]
        modes = ",".join(sorted({attr(d, "computeMode") for d in devs}))
        out.line(
            f"GPU {index}  {attr(first, 'productName')}  {attr(first, 'uuid')}  "
            f"{gib(attr(first, 'gpuMemory'))}  modes={modes}  "
            f"model={attr(first, 'fractionModel')}  "
            f"memoryEnforcement={attr(first, 'memoryEnforcement')}"
        )
        for d in devs:
            out.line(f"{d['name']:<22} shared, {capacity_text(d)}", 8)
    out.line(f"{len(devices)} devices, counter sets: {', '.join(c['name'] for c in counters)}")


def capacity_text(device: dict[str, Any]) -> str:
    """A shared device's consumable capacity: ``slots 8 (claims take 1, 2, 4 or 8)`` or
    ``memory 143131Mi``."""
    name, capacity = next(iter(device["capacity"].items()))
    policy = capacity.get("requestPolicy") or {}
    if name == "slots":
        sizes = ", ".join(policy.get("validValues") or [])
        return f"slots {capacity['value']} (a claim takes {sizes})"
    return f"{name} {capacity['value']}"


def attr(device: dict[str, Any], name: str) -> Any:
    return next(iter(device["attributes"][name].values()))


def show_placements(api: k8s.ApiClient, pods: list[str], node_dir: Path) -> None:
    core, res = k8s.CoreV1Api(api), k8s.ResourceV1Api(api)
    slices = raw(
        res.list_resource_slice(field_selector=f"spec.nodeName={NODE}", _preload_content=False)
    )["items"]
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
    header = f"{'POD':<10} {'CLAIM':<24} {'DEVICE':<18} {'GPU':<4} {'MODE':<13} SHARE"
    out.line(header)
    details = []
    for name in pods:
        pod = raw(core.read_namespaced_pod(name, NAMESPACE, _preload_content=False))
        for status in pod["status"].get("resourceClaimStatuses") or []:
            claim = raw(
                res.read_namespaced_resource_claim(
                    status["resourceClaimName"], NAMESPACE, _preload_content=False
                )
            )
            for result in claim["status"]["allocation"]["devices"]["results"]:
                d = devices[result["device"]]
                consumed = result.get("consumedCapacity") or {}
                share = (
                    f"{consumed['slots']} of {d['capacity']['slots']['value']} slots"
                    if "slots" in consumed
                    else str(consumed.get("memory", "-"))
                )
                out.line(
                    f"{name:<10} {status['resourceClaimName']:<24} {result['device']:<18} "
                    f"{attr(d, 'index'):<4} {attr(d, 'computeMode'):<13} {share}"
                )
            details.append((name, pod, claim))
    for name, pod, claim in details:
        uid = claim["metadata"]["uid"]
        path = node_dir / "cdi" / f"{DRIVER}-claim_{uid}.json"
        spec = json.loads(path.read_text())
        container = pod["spec"]["containers"][0]["name"]
        out.line("")
        out.line(
            f"{name}: CDI spec on the node: /var/run/cdi/{path.name} "
            f"(cdiVersion {spec['cdiVersion']})"
        )
        for d in spec["devices"]:
            for h in d["containerEdits"].get("hooks", []):
                args = h.get("args", [])
                if "gpu-fraction-record" in args:  # the /bin/sh one-liner of the janitor
                    text = f"{h['hookName']}: {h['path']} records the container's cgroup"
                elif "gpu-fraction-user" in args:  # the root-client watch's one-liner
                    text = f"{h['hookName']}: {h['path']} records the UID the container runs as"
                else:
                    text = f"{h['hookName']}: {Path(h['path']).name} {' '.join(args[1:])}"
                out.line(f"hook       {text if len(text) < 100 else text[:96] + ' ...'}", 6)
        out.line(f"inside container {container!r} (its own output):", 6)
        lines = container_log(node_dir, name, container)
        for line in lines[: lines.index("ready")] if "ready" in lines else lines:
            out.line(line if len(line) < 110 else line[:106] + " ...", 8)
        first = next((ln for ln in lines if attached(ln)), None)
        out.line("its tenant probe, attached to the claim's MPS namespace (its own line):", 6)
        out.line(first or "(no probe line yet)", 8)
        status = pod["status"]["containerStatuses"][0]
        cid = status["containerID"].split("://", 1)[1]
        records = sorted(
            (node_dir / "gpu-fraction-state" / "simulated" / "hook-records").glob(f"{cid}.*")
        )
        for rec in records:
            got = dict(x.split("=", 1) for x in rec.read_text().splitlines() if "=" in x)
            request, limit = got["NVIDIA_GPU_MEMORY_REQUEST"], got["NVIDIA_GPU_MEMORY_LIMIT"]
            out.line(
                f"memory-limit hook ran for GPU {got['gpu'][:12]}...: request {request} MiB, "
                f"limit {limit} MiB",
                6,
            )


def claim_of(api: k8s.ApiClient, pod: str) -> dict[str, Any]:
    p = raw(k8s.CoreV1Api(api).read_namespaced_pod(pod, NAMESPACE, _preload_content=False))
    (status,) = p["status"]["resourceClaimStatuses"]
    return raw(
        k8s.ResourceV1Api(api).read_namespaced_resource_claim(
            status["resourceClaimName"], NAMESPACE, _preload_content=False
        )
    )


def device_statuses(api: k8s.ApiClient, pod: str) -> list[dict[str, Any]]:
    """The driver's ``status.devices`` entries of the pod's claim (written after Prepare)."""
    devices = (claim_of(api, pod).get("status") or {}).get("devices") or []
    return [d for d in devices if d["driver"] == DRIVER]


def show_claim_status(api: k8s.ApiClient, pods: list[str]) -> None:
    for pod in pods:
        entries = wait_for(
            f"{pod}'s claim device status",
            partial(device_statuses, api, pod),
            30,
            retry_on=API_ERRORS,
        )
        for e in entries:
            data, (cond,) = e["data"], e["conditions"]
            pct = data.get("activeThreadPercentage")
            out.line(
                f"{pod:<10} {e['device']:<18} GPU {data['gpu']['index']} "
                f"{data['gpu']['productName']}  memory limit {data['memory']['limit']}  "
                f"{data['computeMode']}{f' {pct}% SMs' if pct else ''}  "
                f"enforcement {data['enforcement']}  "
                f"{cond['type']}={cond['status']} ({cond['reason']})"
            )


def unschedulable(api: k8s.ApiClient, pod: str) -> bool:
    p = raw(k8s.CoreV1Api(api).read_namespaced_pod(pod, NAMESPACE, _preload_content=False))
    conditions = p["status"].get("conditions") or []
    return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)


def occupancy(kubeconfig: Path) -> str:
    """``dra-driver occupancy`` as a user runs it (the API server only)."""
    result = subprocess.run(
        # --no-usage: the local cluster's plugins serve no metrics (nodes share one network)
        [sys.executable, "-m", "dra_driver", "occupancy", "--no-usage",
         f"--kubeconfig={kubeconfig}"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"dra-driver occupancy failed: {result.stderr.strip()}")
    return result.stdout


def events(api: k8s.ApiClient, pod: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = raw(
        k8s.CoreV1Api(api).list_namespaced_event(
            NAMESPACE,
            field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod}",
            _preload_content=False,
        )
    )["items"]
    return items


PREPARE_FAILED = "FailedPrepareDynamicResources"
"""Reason of the kubelet's event when the driver refused to prepare a pod's claim."""


def refusals(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The kubelet's prepare-failed events among a pod's events (other warnings, such as the
    controller's transient FailedResourceClaimCreation for a template it has not seen yet,
    are not the driver's refusal)."""
    return [e for e in events if e.get("reason") == PREPARE_FAILED]


def event_source(event: dict[str, Any]) -> str:
    """Who reported ``event``: ``source.component`` (``kubelet``) or the reporting controller."""
    source = (event.get("source") or {}).get("component") or event.get("reportingComponent")
    return str(source or "unknown")


def phase(api: k8s.ApiClient, pod: str) -> str:
    try:
        p = raw(k8s.CoreV1Api(api).read_namespaced_pod(pod, NAMESPACE, _preload_content=False))
    except ApiException as exc:
        if exc.status == 404:
            return "Gone"
        raise
    return str(p["status"].get("phase"))


def plugin_pods(api: k8s.ApiClient, component: str = "kubelet-plugin") -> list[dict[str, Any]]:
    """The release's pods of ``component`` (``kubelet-plugin``, ``mps-service``) not being
    deleted."""
    items = raw(
        k8s.CoreV1Api(api).list_namespaced_pod(
            PLUGIN_NAMESPACE,
            label_selector=f"app.kubernetes.io/component={component}",
            _preload_content=False,
        )
    )["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if p["status"].get("phase") == "Running"]


def probe_lines(node_dir: Path, pod: str, container: str) -> list[str]:
    """The tenant probe's lines in a container's output, as printed."""
    return [ln for ln in container_log(node_dir, pod, container) if parse_line(ln)]


def attached(line: str) -> bool:
    """Whether a probe line says the probe is attached to its MPS server."""
    return parse_line(line).get("state") in ("connected", "same")


def kept_server(before: str, after: list[str]) -> bool:
    """Whether every probe line in ``after`` is attached to the server process of ``before``
    (and there is at least one)."""
    pid = parse_line(before).get("server_pid")
    return bool(after) and all(
        attached(ln) and parse_line(ln).get("server_pid") == pid for ln in after
    )


def restart_plugin(api: k8s.ApiClient, node_dir: Path, pods: list[str]) -> dict[str, bool]:
    """Delete the plugin's pod while the probes run; once the DaemonSet's new pod runs, show
    each probe's server before and after. Returns pod -> whether its probe kept its server."""
    core = k8s.CoreV1Api(api)
    containers = {pod: container_of(api, pod) for pod in pods}
    since = {pod: len(probe_lines(node_dir, pod, c)) for pod, c in containers.items()}
    before = {pod: probe_lines(node_dir, pod, c)[-1] for pod, c in containers.items()}
    old = {p["metadata"]["uid"]: p["metadata"]["name"] for p in plugin_pods(api)}
    service = [p["metadata"]["name"] for p in plugin_pods(api, "mps-service")]
    t = time.monotonic()
    for name in old.values():
        core.delete_namespaced_pod(name, PLUGIN_NAMESPACE)
        out.line(f"deleted the plugin pod {PLUGIN_NAMESPACE}/{name}")
    new = wait_for(
        "the plugin's new pod Running",
        lambda: [p for p in running(plugin_pods(api)) if p["metadata"]["uid"] not in old],
        120,
        retry_on=API_ERRORS,
    )
    out.line(
        f"new plugin pod {new[0]['metadata']['name']} Running after {time.monotonic() - t:.1f}s; "
        f"the MPS service pod {', '.join(service)} was not touched"
    )
    time.sleep(3)  # three more reports of every probe with the new plugin running
    kept = {}
    for pod, c in containers.items():
        after = probe_lines(node_dir, pod, c)[since[pod] :]
        kept[pod] = kept_server(before[pod], after)
        pid_before = parse_line(before[pod]).get("server_pid")
        pids_after = sorted({parse_line(ln).get("server_pid", "-") for ln in after})
        out.line(
            f"{pod:<10} server PID {pid_before} before, {', '.join(pids_after)} after; "
            f"{len(after)} reports since, {'all attached' if kept[pod] else 'NOT all attached'}"
        )
        if after:
            out.line(after[-1], 6)
    return kept


GOOD = ["notebook", "inference", "trainer"]
"""The demo's pods that run on GPU fractions (demo/*.yaml); ``misconfigured`` is refused and
``waiting`` stays Pending."""


def build_images(work: Path, logs: Path) -> None:
    out.step("Container images (plugin, sandbox, busybox, tenant) from Debian and PyPI packages")
    t = time.monotonic()
    if run_logged([sys.executable, str(HACK / "build-image")], logs / "build.log") != 0:
        raise RuntimeError("hack/build-image failed (see above)")
    kept_logs = Path(tempfile.gettempdir()) / f"{work.name}-logs"  # where main moves logs/
    out.line(f"images ready in {time.monotonic() - t:.1f}s (build output: {kept_logs}/build.log)")


def build_binaries(logs: Path) -> Path:
    """The cluster's binaries built; returns kubectl."""
    out.step("Cluster binaries (kubelet, control plane, kubectl, helm, containerd) from Go modules")
    t = time.monotonic()
    if run_logged([str(HACK / "build-k8s")], logs / "build.log") != 0:
        raise RuntimeError("hack/build-k8s failed (see above)")
    kubectl = localinstall.link_kubectl()
    out.line(f"binaries ready in {time.monotonic() - t:.1f}s; kubectl v1.37.2: {kubectl}")
    return kubectl


@dataclass
class Demo:
    """What the steps share once the local cluster runs; ``summary`` is what :func:`main`
    reports at the end."""

    work: Path
    logs: Path
    kubectl: Path
    state: Path
    kubeconfig: Path
    api: k8s.ApiClient
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def node_dir(self) -> Path:
        return self.state / "nodes" / NODE


def show_node(d: Demo) -> None:
    version = k8s.VersionApi(d.api).get_code().git_version
    info = raw(k8s.CoreV1Api(d.api).read_node(NODE, _preload_content=False))["status"]
    out.line(f"Kubernetes {version}; node {NODE} Ready: kubelet "
             f"{info['nodeInfo']['kubeletVersion']}, "
             f"{info['nodeInfo']['containerRuntimeVersion']}")  # fmt: skip


def install(d: Demo) -> None:
    out.step(
        "helm install the driver "
        f"({localinstall.CHART.relative_to(REPO)}, {VALUES.relative_to(REPO)})"
    )
    install_driver(d.kubeconfig, d.state, d.work)
    t = time.monotonic()
    api = d.api
    wait_for(
        "the MPS service pod Running",
        lambda: running(plugin_pods(api, "mps-service")),
        120,
        retry_on=API_ERRORS,
    )
    wait_for("the plugin pod Running", lambda: running(plugin_pods(api)), 120, retry_on=API_ERRORS)
    wait_for(
        "ResourceSlices",
        lambda: raw(
            k8s.ResourceV1Api(api).list_resource_slice(
                field_selector=f"spec.nodeName={NODE}", _preload_content=False
            )
        )["items"],
        60,
        retry_on=API_ERRORS,
    )
    out.line(f"MPS service and plugin pods Running, plugin registered with the kubelet, "
             f"slices published in {time.monotonic() - t:.1f}s")  # fmt: skip


def published(d: Demo) -> None:
    out.step("ResourceSlices published by the plugin (accepted by the API server)")
    show_slices(d.api)


def workloads(d: Demo) -> None:
    out.step("Workloads (demo/)")
    for path in sorted(DEMO.glob("[0-9]*.yaml")):
        made = apply_file(d.kubectl, d.kubeconfig, path)
        out.line(f"kubectl apply -f {path.relative_to(REPO)}: {', '.join(made)}")
    for pod in GOOD:
        wait_for(
            f"pod {pod} Running", partial(in_phase, d.api, pod, "Running"), 90, retry_on=API_ERRORS
        )
        wait_for(
            f"the tenant probe of {pod} attached to its MPS server",
            partial(probe_attached, d.api, d.node_dir, pod),
            60,
            retry_on=API_ERRORS,
        )


def placements(d: Demo) -> None:
    warn = wait_for(
        f"the kubelet's {PREPARE_FAILED} event of the misconfigured pod",
        lambda: refusals(events(d.api, "misconfigured")),
        60,
        retry_on=API_ERRORS,
    )
    out.step("Placements: scheduler allocation -> kubelet NodePrepareResources -> container")
    show_placements(d.api, GOOD, d.node_dir)
    out.line("")
    out.line(
        f"misconfigured: {phase(d.api, 'misconfigured')}; event "
        f"{warn[0]['type']} {warn[0]['reason']} from {event_source(warn[0])}"
        f" (x{warn[0].get('count', 1)}):"
    )
    out.line(warn[0]["message"], 6)
    d.summary["running"] = GOOD
    d.summary["specs"] = len(list((d.node_dir / "cdi").glob("*.json")))
    d.summary["refused"] = warn[0]["message"]


def claim_status(d: Demo) -> None:
    out.step("What each claim says: status.devices (kubectl get resourceclaim -o yaml)")
    show_claim_status(d.api, GOOD)


def restart(d: Demo) -> None:
    out.step("Restart the plugin: the tenants stay on their MPS servers")
    kept = restart_plugin(d.api, d.node_dir, GOOD)
    d.summary["kept"] = f"{sum(kept.values())}/{len(kept)}"


def who_holds_what(d: Demo) -> None:
    out.step("Who holds what, and why a pod waits: dra-driver occupancy")
    wait_for(
        "pod waiting Unschedulable",
        lambda: unschedulable(d.api, "waiting"),
        60,
        retry_on=API_ERRORS,
    )
    text = occupancy(d.kubeconfig)
    for line in text.splitlines():
        out.line(line)
    d.summary["occupancy"] = text
    for f in d.node_dir.glob("pod-logs/gpu-fraction-dra_*/plugin/*.log"):
        shutil.copy(f, d.logs / "plugin.log")


def left_running(d: Demo) -> None:
    out.step("The cluster, the driver and the pods stay")
    out.line(f"export KUBECONFIG={d.kubeconfig}")
    out.line(f"{REPO / '.venv/bin/dra-driver'} occupancy   # who holds what")
    out.line(f"{d.kubectl} get pods,resourceclaims -n {NAMESPACE}")
    out.line("remove the demo's workloads (the kubelet unprepares their claims):")
    out.line(f"{d.kubectl} delete -f {DEMO}", 6)
    out.line("stop the cluster (also removes the driver):")
    out.line(f"LOCAL_CLUSTER_DIR={d.state} {HACK / 'local-cluster'} down", 6)
    d.summary["left"] = 0


def prepared_claims(node_dir: Path) -> dict[str, Any]:
    """The plugin's checkpoint as ``dra-driver status`` shows it: claim UID -> record."""
    status = subprocess.run(
        [sys.executable, "-m", "dra_driver", "status",
         f"--state-dir={node_dir / 'gpu-fraction-state'}"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    claims: dict[str, Any] = json.loads(status.stdout or "{}").get("claims", {})
    return claims


def delete_pods(d: Demo) -> None:
    out.step("Delete the pods: the kubelet stops them and calls NodeUnprepareResources")
    core = k8s.CoreV1Api(d.api)
    for pod in [*GOOD, "misconfigured", "waiting"]:
        core.delete_namespaced_pod(pod, NAMESPACE)
    for pod in [*GOOD, "misconfigured", "waiting"]:
        wait_for(f"pod {pod} gone", partial(in_phase, d.api, pod, "Gone"), 60, retry_on=API_ERRORS)
    with contextlib.suppress(WaitTimeout):
        wait_for(
            "claims unprepared", lambda: not prepared_claims(d.node_dir), 30, retry_on=API_ERRORS
        )
    left = sorted(p.name for p in (d.node_dir / "cdi").glob("*"))
    pipes = sorted((d.node_dir / "gpu-fraction-run").glob("mps/*/pipe/*/*"))
    claims = prepared_claims(d.node_dir)
    out.line(f"pods deleted; CDI specs left: {len(left)} {left or ''}")
    out.line(f"plugin checkpoint (dra-driver status): {len(claims)} prepared claims")
    out.line(f"MPS pipe directories left: {len(pipes)}")
    d.summary["left"] = len(left) + len(claims) + len(pipes)
    for f in d.node_dir.glob("logs/*.log"):
        shutil.copy(f, d.logs / f"node-{f.name}")


def teardown(d: Demo) -> None:
    out.step("Teardown")
    out.line("helm uninstall; stopping the node and the control plane")
    localinstall.helm(
        d.kubeconfig, "uninstall", RELEASE, "--namespace", PLUGIN_NAMESPACE, check=False
    )


STEPS: list[Callable[[Demo], None]] = [
    show_node,
    install,
    published,
    workloads,
    placements,
    claim_status,
    restart,
    who_holds_what,
]
"""The demo on a running cluster, in order; then :func:`left_running` with ``--keep-cluster``,
else :func:`delete_pods` and :func:`teardown`."""


def run_demo(work: Path, logs: Path, keep: bool) -> dict[str, Any]:
    """Build what the demo needs, start the local cluster, run :data:`STEPS` on it; returns
    the summary."""
    build_images(work, logs)
    kubectl = build_binaries(logs)
    out.step("Local cluster: control plane + a real node (kubelet, containerd, runc)")
    state = work / "cluster"
    with cluster(state, keep, logs / "build.log") as kubeconfig:
        api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
        demo = Demo(work, logs, kubectl, state, kubeconfig, api)
        for step in [*STEPS, *([left_running] if keep else [delete_pods, teardown])]:
            step(demo)
    if not keep:
        out.line("cluster down")
    return demo.summary


def in_phase(api: k8s.ApiClient, pod: str, wanted: str) -> bool:
    return phase(api, pod) == wanted


def probe_attached(api: k8s.ApiClient, node_dir: Path, pod: str) -> bool:
    return any(attached(ln) for ln in probe_lines(node_dir, pod, container_of(api, pod)))


def container_of(api: k8s.ApiClient, pod: str) -> str:
    p = raw(k8s.CoreV1Api(api).read_namespaced_pod(pod, NAMESPACE, _preload_content=False))
    return str(p["spec"]["containers"][0]["name"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster running")
    args = parser.parse_args()

    def interrupt(signum: int, frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # let the cleanup finish
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, interrupt)
    work = Path(tempfile.mkdtemp(prefix="dra-demo-"))
    logs = work / "logs"
    logs.mkdir()
    print(f"GPU fraction DRA driver demo  (work dir {work})", flush=True)
    ok = False
    try:
        summary = run_demo(work, logs, args.keep_cluster)
        ok = summary.get("left") == 0 and summary["kept"].split("/")[0] == str(
            len(summary["running"])
        )
        out.step("Summary")
        out.line(
            f"pods run on GPU fractions:   {', '.join(summary['running'])} "
            f"({summary['specs']} CDI specs written)"
        )
        why = (
            "memory limit below its request"
            if "below the request" in summary["refused"]
            else summary["refused"][:120]
        )
        out.line(f"refused with a pod event:    misconfigured ({why})")
        waiting = [ln for ln in summary["occupancy"].splitlines() if "/waiting " in ln]
        out.line(f"Pending, with its reason:    {' '.join(waiting[0].split()) if waiting else '-'}")
        out.line(f"plugin restarted, probes:    {summary['kept']} kept their MPS server")
        if args.keep_cluster:
            out.line("pods kept:                   the cluster runs (commands above)")
        else:
            out.line(f"left after deleting pods:    {summary['left']} (CDI specs, claims, pipes)")
        out.line(f"total time:                  {out.elapsed():.0f}s")
    except KeyboardInterrupt:
        print("\ninterrupted; cleaning up", flush=True)
    except Exception as exc:
        print(f"\ndemo failed: {exc}", file=sys.stderr, flush=True)
        log = logs / "plugin.log"
        tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
        if tail:
            print("last plugin log lines:\n  " + "\n  ".join(tail), file=sys.stderr)
    finally:
        keep = logs.with_name(f"{work.name}-logs")
        shutil.move(str(logs), str(Path(tempfile.gettempdir()) / keep.name))
        if not args.keep_cluster:  # a kept cluster lives in the work dir
            shutil.rmtree(work, ignore_errors=True)
        print(f"logs: {Path(tempfile.gettempdir()) / keep.name}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
