"""The demo as a list of steps: the images and binaries built, then :data:`STEPS` on the running
cluster, then the pods deleted and the cluster stopped (or left running)."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from devtools import localinstall
from devtools.demo.cluster import (
    apply_file,
    cluster,
    events,
    in_phase,
    install_driver,
    phase,
    plugin_pods,
    prepared_claims,
    probe_attached,
    restart_plugin,
    running,
    unschedulable,
)
from devtools.demo.common import (
    API_ERRORS,
    DEMO,
    HACK,
    NAMESPACE,
    NODE,
    PLUGIN_NAMESPACE,
    PREPARE_FAILED,
    RELEASE,
    REPO,
    VALUES,
    out,
    raw,
    run_logged,
)
from devtools.demo.show import (
    event_source,
    occupancy,
    refusals,
    show_claim_status,
    show_placements,
    show_slices,
)
from devtools.waiting import WaitTimeout, wait_for

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
