"""Claims that never get their Unprepare, replayed on the real node
(kubernetes-sigs/dra-driver-nvidia-gpu#1278 and #840: a pod and its claim force-deleted while
the plugin was away, and the fraction held for six hours).

The plugin is kept off the first node (a NoSchedule taint its DaemonSet does not tolerate, and
its pod deleted), a pod with a ``gpu-eighth`` claim is force-deleted (its claim is deallocated
and garbage-collected), and a checkpoint record is planted for a claim that never existed. When
the plugin comes back, the orphan sweep (``orphanSweep.firstAfterSeconds``: 5 in this session,
then two reads 30 s apart) releases both completely: checkpoint record, CDI spec, MPS namespace
pipe directory. A live claim on the same GPU, whose pod ran throughout, is left alone.

Prints one line (``ORPHAN | claim | released by | seconds after the plugin came back``), shown
even when the test passes.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

import pytest

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    E2E,
    RELEASE_NAMESPACE,
    TIME_SLICING_GPUS,
    GpuNode,
    raw,
    set_node_taint,
    wait_for,
)

from dra_driver.enforce.rules.names import namespace_name  # noqa: E402
from dra_driver.model.plans import ClaimRef  # noqa: E402
from dra_driver.prepare.checkpoint import Checkpoint, read_boot_id  # noqa: E402

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

ON_GPU = 'device.attributes["gpu-fraction.dra.dev"].index == {}'
PAUSE_TAINT = {"key": "e2e.gpu-fraction.dra.dev/plugin-paused", "effect": "NoSchedule"}
"""Keeps the plugin's DaemonSet from starting a new pod on the node (its pods tolerate only
``nvidia.com/gpu``); the MPS service's pod, already running, stays."""


def set_pause_taint(e2e: E2E, node: str, on: bool) -> None:
    set_node_taint(e2e, node, PAUSE_TAINT, on)


def plant_record(node: GpuNode, like: str) -> str:
    """Add to the node's checkpoint a record for a claim that never existed (the plan of the
    claim ``like`` under a new UID, namespace and name); returns its UID. The plugin must be
    stopped (it keeps the checkpoint in memory)."""
    checkpoint = Checkpoint(node.state_dir, read_boot_id())
    assert checkpoint.load()
    model = checkpoint.claims[like]
    uid = str(uuid.uuid4())
    ref = ClaimRef("e2e-never-existed", "never-existed", uid)
    checkpoint.claims[uid] = replace(
        model, namespace=ref.namespace, name=ref.name, plan=replace(model.plan, claim=ref)
    )
    checkpoint.save()
    return uid


EVERYTHING = ["checkpoint record", "CDI spec", "MPS namespace pipe directory"]


def left_of(node: GpuNode, uid: str) -> list[str]:
    """What the node still holds of claim ``uid``."""
    left = []
    if uid in node.plugin_checkpoint():
        left.append("checkpoint record")
    if node.cdi_spec_path(uid).exists():
        left.append("CDI spec")
    if any(d.name == namespace_name(uid) for d in node.pipe_dirs()):
        left.append("MPS namespace pipe directory")
    return left


def released_by_sweep(e2e: E2E, node: GpuNode, uid: str) -> bool:
    lines = e2e.driver.plugin_log(node.name, 5000).splitlines()
    return any("will never get its Unprepare" in x and uid in x for x in lines)


def claim_exists(e2e: E2E, name: str) -> bool:
    names = [
        c["metadata"]["name"]
        for c in raw(e2e.res.list_namespaced_resource_claim(e2e.namespace, _preload_content=False))[
            "items"
        ]
    ]
    return name in names


def test_claims_whose_unprepare_never_comes_are_released(
    e2e: E2E, capsys: pytest.CaptureFixture[str]
) -> None:
    node = e2e.nodes[0]
    gpu = TIME_SLICING_GPUS[1]
    for pod in ("gone", "live"):
        e2e.template(pod, "gpu-eighth", selectors=[ON_GPU.format(gpu)])
        e2e.pod(pod, node, templates={"gpu": pod})
    for pod in ("gone", "live"):
        e2e.wait_running(pod, timeout=90)
    gone = e2e.claim_of("gone")
    live = e2e.claim_of("live")
    gone_uid, live_uid = gone["metadata"]["uid"], live["metadata"]["uid"]
    assert left_of(node, gone_uid) == left_of(node, live_uid) == EVERYTHING
    set_pause_taint(e2e, node.name, True)
    try:
        for pod in e2e.driver.plugin_pods(node.name):
            e2e.core.delete_namespaced_pod(pod["metadata"]["name"], RELEASE_NAMESPACE)
        wait_for("no plugin on the node", lambda: not node.plugin_pids(), timeout=60)
        e2e.delete_pod("gone", grace=0)  # force-deleted while the plugin is away
        e2e.wait_gone("gone", timeout=60)
        wait_for(
            "the force-deleted pod's claim garbage-collected",
            lambda: not claim_exists(e2e, gone["metadata"]["name"]),
            timeout=90,
        )
        assert gone_uid in node.plugin_checkpoint()  # nobody could unprepare it
        planted = plant_record(node, live_uid)
    finally:
        set_pause_taint(e2e, node.name, False)
    back = time.monotonic()
    e2e.driver.wait_rolled_out(timeout=120)
    seconds = {}
    for uid in (gone_uid, planted):
        wait_for(
            f"claim {uid} released completely",
            lambda uid=uid: not left_of(node, uid),
            timeout=120,
        )
        seconds[uid] = time.monotonic() - back
    assert released_by_sweep(e2e, node, planted)
    # the live claim is untouched, its pod still runs
    assert e2e.read_pod("live")["status"]["phase"] == "Running"
    assert left_of(node, live_uid) == EVERYTHING
    for name, uid in (("force-deleted pod's claim", gone_uid), ("planted record", planted)):
        by = "the orphan sweep" if released_by_sweep(e2e, node, uid) else "the kubelet"
        with capsys.disabled():
            print(f"\nORPHAN | {name} | released by {by} | {seconds[uid]:.1f} s after plugin back")
