"""What the demo prints of the cluster: the published devices, each pod's placement from the
scheduler's allocation to what its container sees, the claims' ``status.devices``, the
occupancy report, the refused pod's event."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from devtools.demo.cluster import attached, container_log
from devtools.demo.common import API_ERRORS, NAMESPACE, NODE, PREPARE_FAILED, REPO, gib, out, raw
from devtools.waiting import wait_for
from dra_driver import DEFAULT_DRIVER_NAME as DRIVER


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


def refusals(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The kubelet's prepare-failed events among a pod's events (other warnings, such as the
    controller's transient FailedResourceClaimCreation for a template it has not seen yet,
    are not the driver's refusal)."""
    return [e for e in events if e.get("reason") == PREPARE_FAILED]


def event_source(event: dict[str, Any]) -> str:
    """Who reported ``event``: ``source.component`` (``kubelet``) or the reporting controller."""
    source = (event.get("source") or {}).get("component") or event.get("reportingComponent")
    return str(source or "unknown")
