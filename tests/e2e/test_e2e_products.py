"""End to end, products model: the plugin's slices in the real API server, one pod per product
class allocated by the real scheduler, prepared through the kubelet stand-in, CDI specs on disk,
and unprepared when the pods go (gracefully, with grace 0, or while the stand-in is down)."""

from __future__ import annotations

import json
import time
from fractions import Fraction

import pytest
from kubernetes import client as k8s

from dra_driver.gpus import SimulatedGpuSource
from dra_driver.publisher import normalize_spec
from dra_driver.slices import product_memory_bytes

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    DRIVER,
    E2E,
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


def test_slices_are_accepted_as_rendered(e2e: E2E) -> None:
    node = e2e.start_node("simulated:H200x2")
    stored = e2e.slices(node.name)
    inventory = SimulatedGpuSource("simulated:H200x2", seed=node.name).discover()
    rendered = node.rendered_slices()
    assert [s["metadata"]["name"] for s in stored] == [s["metadata"]["name"] for s in rendered]
    for have, want in zip(stored, rendered, strict=True):
        assert normalize_spec(have["spec"], True) == normalize_spec(want["spec"], True)
    assert len({s["spec"]["pool"]["generation"] for s in stored}) == 1
    devices = slice_devices(stored)
    assert len(devices) == 2 * 15  # 8 eighths + 4 quarters + 2 halves + 1 full per GPU
    assert {attr(d, "uuid") for d in devices.values()} == {g.uuid for g in inventory.gpus}
    counters = [c for s in stored for c in s["spec"].get("sharedCounters") or []]
    assert sorted(c["name"] for c in counters) == ["gpu-0", "gpu-1"]
    # The node looks like a kubelet's: Ready, with a renewed Lease.
    n = e2e.core.read_node(node.name)
    ready = next(c for c in n.status.conditions if c.type == "Ready")
    assert ready.status == "True"
    lease = k8s.CoordinationV1Api(e2e.api).read_namespaced_lease(node.name, "kube-node-lease")
    assert lease.spec.holder_identity == node.name


def test_each_product_class_prepared_and_unprepared(e2e: E2E) -> None:
    node = e2e.start_node("simulated:H200x2")
    inventory = SimulatedGpuSource("simulated:H200x2", seed=node.name).discover()
    card = inventory.gpus[0]
    # full first, so it takes a GPU of its own; the rest (7/8) share the other one.
    for product in ("full", "half", "quarter", "eighth"):
        e2e.template(product, f"gpu-{product}")
        e2e.pod(f"pod-{product}", node, templates={"gpu": product})
        e2e.wait_running(f"pod-{product}")
    gpus_used: dict[str, int] = {}
    specs = []
    for product, portion in PRODUCTS.items():
        got = check_prepared(e2e, node, f"pod-{product}")
        [result] = got.results
        assert result["device"].split("-")[2] == product
        gpus_used[product] = int(result["device"].split("-")[1])
        env = cdi_env(got.spec)
        memory_mib = product_memory_bytes(card, portion) // MIB
        assert env["NVIDIA_GPU_MEMORY_REQUEST"] == str(memory_mib)
        assert env["NVIDIA_GPU_MEMORY_LIMIT"] == str(memory_mib)  # limit defaults to request
        assert env["GPU_FRACTION_COMPUTE_MODE"] == "time-slicing"
        specs.append(got.spec_path)
    assert gpus_used["full"] not in {gpus_used[p] for p in ("half", "quarter", "eighth")}
    assert len(node.cdi_specs()) == 4

    # Graceful deletion: the stand-in sees the pods terminating, unprepares, deletes them.
    for product in PRODUCTS:
        e2e.delete_pod(f"pod-{product}")
    for product in PRODUCTS:
        e2e.wait_gone(f"pod-{product}")
    assert not any(p.exists() for p in specs)
    assert node.cdi_specs() == {}
    assert node.plugin_checkpoint() == {}
    assert node.standin.prepared_claims() == {}


def test_v1beta1_only_kubelet(e2e: E2E) -> None:
    """A kubelet that speaks only v1beta1 still registers the plugin and prepares through it."""
    node = e2e.start_node("simulated:H200x1", versions=("v1beta1.DRAPlugin",))
    assert node.standin.registry.plugin(DRIVER).version == "v1beta1.DRAPlugin"
    e2e.template("q", "gpu-quarter")
    e2e.pod("p", node, templates={"gpu": "q"})
    e2e.wait_running("p")
    got = check_prepared(e2e, node, "p")
    e2e.delete_pod("p", grace=0)  # gone at once: the stand-in unprepares a vanished pod
    wait_for("CDI spec removed", lambda: not got.spec_path.exists())


def test_standin_restart_unprepares_pods_deleted_meanwhile(e2e: E2E) -> None:
    node = e2e.start_node("simulated:H200x1", plugin_args=["--publish-interval=1"])
    e2e.template("h", "gpu-half")
    e2e.pod("keep", node, templates={"gpu": "h"})
    e2e.pod("drop", node, templates={"gpu": "h"})
    e2e.wait_running("keep")
    e2e.wait_running("drop")
    keep = check_prepared(e2e, node, "keep")
    drop = check_prepared(e2e, node, "drop")
    checkpoint = node.standin.checkpoint.path
    assert checkpoint is not None
    assert set(json.loads(checkpoint.read_text())["claims"]) == {keep.uid, drop.uid}

    node.standin.delete_node_on_stop = False  # a restarting kubelet keeps its Node
    node.standin.stop()
    e2e.delete_pod("drop", grace=0)
    e2e.wait_gone("drop")
    assert drop.spec_path.exists()  # nobody told the plugin yet
    node.standin = type(node.standin)(
        e2e.api,
        node.name,
        node.registry_dir,
        checkpoint_path=checkpoint,
        resync_interval=1.0,
        delete_node_on_stop=True,
    ).start()
    wait_for(
        "the restarted stand-in to unprepare the vanished pod's claim",
        lambda: not drop.spec_path.exists(),
    )
    assert keep.spec_path.exists()
    assert set(node.standin.prepared_claims()) == {keep.uid}
    # A restarting kubelet wipes the node's slices; the plugin publishes them again.
    wait_for("slices republished", lambda: pool_complete(e2e.slices(node.name)), timeout=15)


def test_deleted_slices_come_back_at_once(e2e: E2E) -> None:
    """Slices deleted behind the plugin's back (a kubelet restart wipes them) are republished
    within seconds by the plugin's watch, not after its 30 s publish interval."""
    node = e2e.start_node("simulated:H200x1")
    before = sorted(s["metadata"]["name"] for s in e2e.slices(node.name))
    assert before
    e2e.res.delete_resource_slice(before[0])
    time.sleep(0.5)
    wait_for(
        "slices republished",
        lambda: sorted(s["metadata"]["name"] for s in e2e.slices(node.name)) == before,
        timeout=8,
    )


def test_slices_survive_node_reregistration(e2e: E2E) -> None:
    """A Node deleted and registered again (new UID) gets its slices back, owned by the new
    Node, and keeps them (slices owned by the old Node would be garbage-collected)."""
    node = e2e.start_node("simulated:H200x1", plugin_args=["--publish-interval=1"])

    def owners() -> set[str | None]:
        return {
            (s["metadata"].get("ownerReferences") or [{}])[0].get("uid")
            for s in e2e.slices(node.name)
        }

    old_uid = e2e.core.read_node(node.name).metadata.uid
    assert owners() == {old_uid}
    node.standin.stop()  # deletes the Node; the GC deletes the slices it owns
    wait_for("slices of the old Node gone", lambda: old_uid not in owners(), timeout=15)
    node.standin = type(node.standin)(
        e2e.api, node.name, node.registry_dir, delete_node_on_stop=True
    ).start()
    new_uid = wait_for("Node registered again", lambda: e2e.core.read_node(node.name).metadata.uid)
    assert new_uid != old_uid
    wait_for("slices owned by the new Node", lambda: owners() == {new_uid}, timeout=15)
    time.sleep(2)  # a few publish rounds and GC passes
    assert owners() == {new_uid}, "slices vanished again"


def test_plugin_restart_keeps_prepared_claims(e2e: E2E) -> None:
    """The plugin restarts (new sockets, same state dir): the stand-in registers it again, its
    slices are left alone, and it still unprepares a claim prepared before the restart."""
    node = e2e.start_node("simulated:H200x1")
    e2e.template("q", "gpu-quarter")
    e2e.pod("p", node, templates={"gpu": "q"})
    e2e.wait_running("p")
    got = check_prepared(e2e, node, "p")
    before = {
        s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in e2e.slices(node.name)
    }
    old = node.standin.registry.plugin(DRIVER)
    assert node.stop_plugin() == 0
    wait_for("deregistration", lambda: node.standin.registry.plugin(DRIVER) is None)
    node.start_plugin()
    new = wait_for("re-registration", lambda: node.standin.registry.plugin(DRIVER), timeout=30)
    assert old is not None and new.registered_at > old.registered_at
    assert got.spec_path.exists()
    time.sleep(1)  # a publish round: nothing to write
    after = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in e2e.slices(node.name)}
    assert after == before
    e2e.delete_pod("p")
    e2e.wait_gone("p")
    assert not got.spec_path.exists()
    assert node.plugin_checkpoint() == {}


def test_claim_shared_by_two_pods(e2e: E2E) -> None:
    """One ResourceClaim used by two pods: prepared once, unprepared with the last pod."""
    node = e2e.start_node("simulated:H200x1")
    e2e.claim("shared", "gpu-quarter")
    e2e.pod("one", node, claims={"gpu": "shared"})
    e2e.pod("two", node, claims={"gpu": "shared"})
    e2e.wait_running("one")
    e2e.wait_running("two")
    a = check_prepared(e2e, node, "one")
    b = check_prepared(e2e, node, "two")
    assert a.uid == b.uid and a.spec == b.spec
    assert len(node.cdi_specs()) == 1
    e2e.delete_pod("one")
    e2e.wait_gone("one")
    node.standin.sync_now()
    time.sleep(1)
    assert a.spec_path.exists(), "unprepared while pod two still uses the claim"
    e2e.delete_pod("two")
    e2e.wait_gone("two")
    assert not a.spec_path.exists()
