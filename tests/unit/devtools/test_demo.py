"""hack/demo's display of the published devices (make demo broke on the new model: it read a
per-device memory capacity that shared products devices no longer have) and of the refused pod."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import yaml

from devtools import demo
from dra_driver.config.load import parse_node_config
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.publish.slices import build_slices

REPO = Path(__file__).resolve().parents[3]


def _demo() -> ModuleType:
    return demo


def _devices(config: dict[str, object] | None) -> list[dict[str, object]]:
    doc = {"apiVersion": "gpu-fraction.dra.dev/v1alpha1", "kind": "NodeConfig", **(config or {})}
    inventory = SimulatedGpuSource("simulated:H200x1", seed="n").discover()
    slices = build_slices(inventory, parse_node_config(doc), "gpu-fraction.dra.dev", "n")
    return [d for s in slices for d in s["spec"].get("devices", [])]


def test_every_published_device_has_a_capacity_text() -> None:
    demo = _demo()
    products = [demo.capacity_text(d) for d in _devices(None)]
    assert products == ["slots 8 (a claim takes 1, 2, 4, 8)"] * 2  # one device per mode
    [memory] = {
        demo.capacity_text(d) for d in _devices({"defaults": {"fractionModel": "capacity"}})
    }
    assert memory.startswith("memory ") and memory.endswith("Mi")


def test_the_refusal_shown_is_the_kubelets_not_an_earlier_warning() -> None:
    """make demo showed the controller's transient 'resourceclaimtemplate "too-tight" not
    found' (the pod was created before the controller saw its template) as the kubelet's
    refusal, and the summary then claimed 'memory limit below its request'."""
    demo = _demo()
    early = {
        "type": "Warning",
        "reason": "FailedResourceClaimCreation",
        "source": {"component": "resource_claim"},
        "message": 'resourceclaimtemplate.resource.k8s.io "too-tight" not found',
    }
    refused = {
        "type": "Warning",
        "reason": "FailedPrepareDynamicResources",
        "source": {"component": "kubelet", "host": "gpu-node-1"},
        "message": "memory limit 8Gi is below the request",
    }
    assert demo.refusals([early, refused]) == [refused]
    assert demo.refusals([early]) == []
    assert demo.event_source(refused) == "kubelet"
    assert demo.event_source({"reportingComponent": "resource_claim"}) == "resource_claim"


def test_only_the_tools_progress_lines_are_shown() -> None:
    """make demo showed ~150 'go: downloading' lines, pip's and apt's output among its steps."""
    demo = _demo()
    shown = [
        "build-k8s: building kubelet v1.37.2 (first time ~6-15 min on 2 cores)...",
        "build-image: plugin image localhost/gpu-fraction-dra:0.1.0 (cached)",
        "local-cluster: control plane ready in 12.0 s",
        "local-node: gpu-node-1 Ready",
    ]
    hidden = [
        "go: downloading k8s.io/api v0.37.2",
        "debconf: delaying package configuration, since apt-utils is not installed",
        "  SetuptoolsDeprecationWarning: License classifiers are deprecated.",
        "export KUBECONFIG=/tmp/x/kubeconfig",
        "warning: build-k8s: not at the start",
    ]
    assert [line for line in shown + hidden if demo.is_progress(line)] == shown


def _probe(pid: str, state: str) -> str:
    return (
        f"tenant-probe: t=2026-01-01T00:00:00+00:00 server=gpu_0 server_pid={pid} "
        f"namespace=c_x pinned_memory_limit=24G active_thread_percentage=100 state={state}"
    )


def test_a_probe_kept_its_server_only_if_every_later_line_is_attached_to_it() -> None:
    demo = _demo()
    before = _probe("41", "connected")
    assert demo.kept_server(before, [_probe("41", "same"), _probe("41", "same")])
    assert not demo.kept_server(before, [])  # no report since: nothing shows it kept it
    assert not demo.kept_server(before, [_probe("41", "same"), _probe("41", "lost")])
    assert not demo.kept_server(before, [_probe("41", "same"), _probe("97", "connected")])


def test_demo_workloads_use_the_images_make_image_builds() -> None:
    """The demo's pods run images imported into the node, never pulled: their references must
    be the ones hack/build-image writes (a version bump would leave the pods ErrImageNeverPull)."""
    root = REPO
    built = {
        subprocess.run(
            [sys.executable, str(root / "hack" / "build-image"), "--print-ref", image],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for image in ("busybox", "tenant")
    }
    used = {
        c["image"]
        for path in sorted((root / "demo").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc["kind"] == "Pod"
        for c in doc["spec"]["containers"]
    }
    assert used and used <= built, (used, built)


def test_the_demo_and_occupancy_round_a_card_alike() -> None:
    """The same card showed as 139.8 GiB in the demo and 139.7Gi in occupancy."""
    from dra_driver.cluster.occupancy import gib

    card = 143_131 * 2**20  # a simulated H200's memory, bytes
    assert _demo().gib(card) == gib(card) == "139.7Gi"
