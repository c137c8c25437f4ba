"""The demo's cluster and what it reads from it: the local cluster started and stopped, the
chart installed, pods and their phases, events, the tenant probes' lines, the plugin
restarted, the checkpoint as ``dra-driver status`` shows it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from devtools import localinstall
from devtools.demo.common import (
    API_ERRORS,
    HACK,
    NAMESPACE,
    NODE,
    PLUGIN_NAMESPACE,
    RELEASE,
    REPO,
    VALUES,
    out,
    raw,
    run_logged,
)
from devtools.waiting import wait_for
from dra_driver.mpsemu.probe import parse_line


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


def unschedulable(api: k8s.ApiClient, pod: str) -> bool:
    p = raw(k8s.CoreV1Api(api).read_namespaced_pod(pod, NAMESPACE, _preload_content=False))
    conditions = p["status"].get("conditions") or []
    return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)


def events(api: k8s.ApiClient, pod: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = raw(
        k8s.CoreV1Api(api).list_namespaced_event(
            NAMESPACE,
            field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod}",
            _preload_content=False,
        )
    )["items"]
    return items


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


def in_phase(api: k8s.ApiClient, pod: str, wanted: str) -> bool:
    return phase(api, pod) == wanted


def probe_attached(api: k8s.ApiClient, node_dir: Path, pod: str) -> bool:
    return any(attached(ln) for ln in probe_lines(node_dir, pod, container_of(api, pod)))


def container_of(api: k8s.ApiClient, pod: str) -> str:
    p = raw(k8s.CoreV1Api(api).read_namespaced_pod(pod, NAMESPACE, _preload_content=False))
    return str(p["spec"]["containers"][0]["name"])


def prepared_claims(node_dir: Path) -> dict[str, Any]:
    """The plugin's checkpoint as ``dra-driver status`` shows it: claim UID -> record."""
    status = subprocess.run(
        [sys.executable, "-m", "dra_driver", "status",
         f"--state-dir={node_dir / 'gpu-fraction-state'}"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    claims: dict[str, Any] = json.loads(status.stdout or "{}").get("claims", {})
    return claims
