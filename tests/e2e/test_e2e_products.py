"""End to end, products model on a real node: the plugin's slices in the real API server, one
pod per product class allocated by the real scheduler, prepared by the plugin through the real
kubelet, seen from inside the container, and unprepared when the pods go."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from dra_driver.gpus import SimulatedGpuSource
from dra_driver.model.devices import product_memory_bytes
from dra_driver.publish.publisher import normalize_spec

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    E2E,
    GPUS,
    NODE_CONFIG,
    REPO,
    attr,
    cdi_env,
    check_prepared,
    pool_complete,
    slice_devices,
    wait_for,
)

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

MIB = 1024 * 1024
PRODUCTS = {"full": Fraction(1), "half": Fraction(1, 2), "quarter": Fraction(1, 4)}
PRODUCTS["eighth"] = Fraction(1, 8)
ON_GPU = 'device.attributes["gpu-fraction.dra.dev"].index == {}'


def rendered(node: str, tmp: Path) -> list[dict[str, Any]]:
    """``dra-driver render-slices`` for a node of the session: what the plugin says it
    publishes."""
    config = tmp / "node-config.yaml"
    config.write_text(
        yaml.safe_dump(
            {"apiVersion": "gpu-fraction.dra.dev/v1alpha1", "kind": "NodeConfig", **NODE_CONFIG}
        )
    )
    cmd = [sys.executable, "-m", "dra_driver", "render-slices", f"--node={node}", f"--gpus={GPUS}"]
    done = subprocess.run(
        [*cmd, f"--config={config}"], cwd=REPO, capture_output=True, text=True, check=True
    )
    slices: list[dict[str, Any]] = json.loads(done.stdout)
    return slices


def test_slices_are_accepted_as_rendered(e2e: E2E, tmp_path: Path) -> None:
    for node in e2e.nodes:
        stored = e2e.slices(node.name)
        want = rendered(node.name, tmp_path)
        assert [s["metadata"]["name"] for s in stored] == [s["metadata"]["name"] for s in want]
        for have, exp in zip(stored, want, strict=True):
            assert normalize_spec(have["spec"], True) == normalize_spec(exp["spec"], True)
        devices = slice_devices(stored)
        inventory = SimulatedGpuSource(GPUS, seed=node.name).discover()
        assert {attr(d, "uuid") for d in devices.values()} == {g.uuid for g in inventory.gpus}
        # The node is a real kubelet's: Ready, with a Lease it renews.
        n = e2e.core.read_node(node.name)
        ready = next(c for c in n.status.conditions if c.type == "Ready")
        assert ready.status == "True"
        lease = wait_for(
            f"the Lease of {node.name}",
            lambda n=node.name: k8s.CoordinationV1Api(e2e.api).read_namespaced_lease(
                n, "kube-node-lease"
            ),
        )
        assert lease.spec.holder_identity == node.name
        assert n.status.node_info.kubelet_version == "v1.37.2"


def test_each_product_class_prepared_and_unprepared(e2e: E2E) -> None:
    node = e2e.nodes[0]
    card = SimulatedGpuSource(GPUS, seed=node.name).discover().gpus[0]
    # full on GPU 0; the rest (7/8) share GPU 1.
    for product in PRODUCTS:
        gpu = 0 if product == "full" else 1
        e2e.template(product, f"gpu-{product}", selectors=[ON_GPU.format(gpu)])
        e2e.pod(f"pod-{product}", node, templates={"gpu": product})
    for product in PRODUCTS:
        e2e.wait_running(f"pod-{product}")
    got = {}
    for product, portion in PRODUCTS.items():
        got[product] = check_prepared(e2e, f"pod-{product}")
        [result] = got[product].results
        gpu = 0 if product == "full" else 1
        # The GPU's shared time-slicing device; the class's size came from the sizing policy.
        assert result["device"] == f"gpu-{gpu}-time-slicing"
        assert result["consumedCapacity"] == {"slots": str(int(portion * 8))}
        memory_mib = product_memory_bytes(card, portion) // MIB
        view = got[product].view
        assert view.env["NVIDIA_GPU_MEMORY_REQUEST"] == str(memory_mib)
        assert view.env["NVIDIA_GPU_MEMORY_LIMIT"] == str(memory_mib)  # limit defaults to request
        assert view.env["GPU_FRACTION_COMPUTE_MODE"] == "time-slicing"
        assert view.devices == sorted(
            [f"/dev/nvidia{gpu}", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"]
        )
    assert len({p for g in got.values() for p in g.pipe_dirs()}) == 4  # one per claim

    for product in PRODUCTS:
        e2e.delete_pod(f"pod-{product}")
    for product in PRODUCTS:
        e2e.wait_gone(f"pod-{product}")
    wait_for("claims unprepared", lambda: not any(e2e.prepared_here().values()))
    for g in got.values():
        assert not g.spec_path.exists()
        assert not any(p.exists() for p in g.pipe_dirs())
        assert g.uid not in node.plugin_checkpoint()


def test_deleted_slices_come_back_at_once(e2e: E2E) -> None:
    """Slices deleted behind the plugin's back (a kubelet restart wipes them) are republished
    within seconds by the plugin's watch, not after its publish interval."""
    node = e2e.nodes[1]
    before = sorted(s["metadata"]["name"] for s in e2e.slices(node.name))
    assert before
    e2e.res.delete_resource_slice(before[0])
    time.sleep(0.5)
    wait_for(
        "slices republished",
        lambda: sorted(s["metadata"]["name"] for s in e2e.slices(node.name)) == before,
        timeout=8,
    )
    # The republished slice starts a new pool generation; the others follow within a round.
    wait_for("a whole pool again", lambda: pool_complete(e2e.slices(node.name)), timeout=10)


def test_claim_shared_by_two_pods(e2e: E2E) -> None:
    """One ResourceClaim used by two pods: prepared once, unprepared with the last pod. Two
    containers may use it at once only with ``maxConsumers: 2`` (test_e2e_sharing)."""
    node = e2e.nodes[1]
    e2e.claim("shared", "gpu-quarter", parameters={"maxConsumers": 2})
    e2e.pod("one", node, claims={"gpu": "shared"})
    e2e.pod("two", node, claims={"gpu": "shared"})
    e2e.wait_running("one")
    e2e.wait_running("two")
    a = check_prepared(e2e, "one")
    b = check_prepared(e2e, "two")
    assert a.uid == b.uid and a.spec == b.spec
    assert a.view == b.view
    e2e.delete_pod("one")
    e2e.wait_gone("one")
    time.sleep(2)
    assert a.spec_path.exists(), "unprepared while pod two still uses the claim"
    assert cdi_env(a.spec)["GPU_FRACTION_COMPUTE_MODE"] == "time-slicing"
    e2e.delete_pod("two")
    e2e.wait_gone("two")
    wait_for("the claim unprepared", lambda: not a.spec_path.exists())
