"""A node without its GPU driver, on the real node (NVIDIA/k8s-driver-manager#213,
kubernetes-sigs/dra-driver-nvidia-gpu#1144: a plugin that exits when NVML cannot start answers
no Unprepare, pods stay Terminating and the driver install waits on them).

The simulated node's ``driver-unloaded`` file makes discovery fail with NVML's ``Driver Not
Loaded``; the plugin is then restarted (SIGKILL; the kubelet starts it again). It must come up,
publish no devices, let a pod with a prepared claim end (Unprepare answered), and once the
file is gone restart itself and publish its GPUs, so that a new fraction runs.

Prints one line (``NO-DRIVER | ...``), shown even when the test passes.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    E2E,
    TIME_SLICING_GPUS,
    GpuNode,
    attr,
    slice_devices,
    unschedulable,
    wait_for,
)

from dra_driver.gpus.simnode import DRIVER_RELOADED, DRIVER_UNLOADED  # noqa: E402

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

ON_GPU = 'device.attributes["gpu-fraction.dra.dev"].index == {}'
RELOADED_OFFSET = 16


def test_a_node_without_its_driver_unprepares_and_publishes_its_gpus_once_it_is_back(
    e2e: E2E, capsys: pytest.CaptureFixture[str]
) -> None:
    node = e2e.nodes[0]
    gpu = TIME_SLICING_GPUS[3]
    e2e.template("held", "gpu-eighth", selectors=[ON_GPU.format(gpu)])
    e2e.pod("held", node, templates={"gpu": "held"}, run_as_user=1000)
    e2e.wait_running("held", timeout=90)
    uid = e2e.claim_of("held")["metadata"]["uid"]
    marker = node.state_dir / "simulated" / DRIVER_UNLOADED
    try:
        marker.touch()  # as after a reboot, before the NVIDIA driver is loaded
        old = set(node.kill_plugin())
        t0 = time.monotonic()
        wait_for(
            "the plugin back, publishing no devices",
            lambda: (set(node.plugin_pids()) - old) and not slice_devices(e2e.slices(node.name)),
            timeout=90,
        )
        up_without = time.monotonic() - t0
        e2e.delete_pod("held")
        e2e.wait_gone("held", timeout=90)  # the kubelet's Unprepare was answered
        assert uid not in node.plugin_checkpoint() and not node.cdi_spec_path(uid).exists()
        e2e.template("new", "gpu-eighth", selectors=[ON_GPU.format(gpu)])
        e2e.pod("new", node, templates={"gpu": "new"}, run_as_user=1000)
        wait_for("no device for the new pod", lambda: unschedulable(e2e, "new"), timeout=60)
    finally:
        marker.unlink(missing_ok=True)  # the driver is loaded
    t1 = time.monotonic()
    wait_for(
        "the plugin's GPUs published again",
        lambda: bool(slice_devices(e2e.slices(node.name))),
        timeout=120,
    )
    e2e.wait_running("new", timeout=120)
    back = time.monotonic() - t1
    with capsys.disabled():
        print(
            f"\nNO-DRIVER | plugin up without devices {up_without:.1f} s after its restart; a "
            f"pod with a prepared claim ended (Unprepare answered); driver back -> GPUs "
            f"published and a new fraction running after {back:.1f} s"
        )


def _gpu_nodes(spec: dict[str, Any]) -> set[str]:
    return {
        n["path"]
        for d in spec["devices"]
        for n in d["containerEdits"].get("deviceNodes", [])
        if n["path"].removeprefix("/dev/nvidia").isdigit()
    }


def _plugin_starts(e2e: E2E, node: GpuNode) -> int:
    """How often the plugin container of ``node`` has started in its pod (restarts + 1)."""
    [pod] = e2e.driver.plugin_pods(node.name)
    status = next(s for s in pod["status"].get("containerStatuses") or [] if s["name"] == "plugin")
    return int(status["restartCount"]) + (1 if status.get("state", {}).get("running") else 0)


def _minor_of(e2e: E2E, node: GpuNode, gpu: int) -> int | None:
    """The device minor the node's slices publish for GPU index ``gpu``."""
    for d in slice_devices(e2e.slices(node.name)).values():
        if attr(d, "index") == gpu:
            return int(attr(d, "minor"))
    return None


def test_a_driver_reloaded_under_the_plugin_renumbers_specs_and_new_fractions(
    e2e: E2E, capsys: pytest.CaptureFixture[str]
) -> None:
    """The NVIDIA driver is reloaded with another numbering of its device nodes while a claim
    is prepared (the simulated node's ``driver-reloaded`` file): the plugin restarts itself,
    the prepared claim's CDI spec names the GPU's new node, and a new fraction gets it."""
    node = e2e.nodes[0]
    gpu = TIME_SLICING_GPUS[2]
    e2e.template("held", "gpu-eighth", selectors=[ON_GPU.format(gpu)])
    e2e.pod("held", node, templates={"gpu": "held"}, run_as_user=1000)
    e2e.wait_running("held", timeout=90)
    uid = e2e.claim_of("held")["metadata"]["uid"]
    assert _gpu_nodes(json.loads(node.cdi_spec_path(uid).read_text())) == {f"/dev/nvidia{gpu}"}
    marker = node.state_dir / "simulated" / DRIVER_RELOADED
    spec_path = node.cdi_spec_path(uid)
    starts = _plugin_starts(e2e, node)
    try:
        marker.write_text(f"{RELOADED_OFFSET}\n")  # the reloaded driver's numbering
        t0 = time.monotonic()
        wait_for(
            "the plugin restarted itself",
            lambda: _plugin_starts(e2e, node) > starts,
            timeout=120,
        )
        restarted = time.monotonic() - t0
        wait_for(
            "the claim's CDI spec naming the new minor",
            lambda: (
                _gpu_nodes(json.loads(spec_path.read_text()))
                == {f"/dev/nvidia{gpu + RELOADED_OFFSET}"}
            ),
            timeout=60,
        )
        assert _minor_of(e2e, node, gpu) == gpu + RELOADED_OFFSET
        e2e.template("new", "gpu-eighth", selectors=[ON_GPU.format(gpu)])
        e2e.pod("new", node, templates={"gpu": "new"}, run_as_user=1000)
        e2e.wait_running("new", timeout=90)
        assert f"/dev/nvidia{gpu + RELOADED_OFFSET}" in e2e.view("new").devices
        assert f"/dev/nvidia{gpu}" not in e2e.view("new").devices
    finally:
        starts = _plugin_starts(e2e, node)
        marker.unlink(missing_ok=True)
        wait_for(  # the driver's first numbering back, for the tests after this one
            "the plugin back on the first numbering",
            lambda: _plugin_starts(e2e, node) > starts and _minor_of(e2e, node, gpu) == gpu,
            timeout=120,
        )
    with capsys.disabled():
        print(
            f"\nDRIVER-RELOAD | minors renumbered under a prepared claim: plugin restarted "
            f"itself and published the new minors after {restarted:.1f} s; the claim's CDI spec "
            f"names /dev/nvidia{gpu + RELOADED_OFFSET}, and so does a new fraction's container"
        )
