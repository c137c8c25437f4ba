"""hack/demo's display of the published devices (make demo broke on the new model: it read a
per-device memory capacity that shared products devices no longer have) and of the refused pod."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

from dra_driver.configload import parse_node_config
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.slices import build_slices

DEMO = Path(__file__).resolve().parents[3] / "hack" / "demo"


def _demo() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("hack_demo", str(DEMO))
    spec = importlib.util.spec_from_loader("hack_demo", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


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
