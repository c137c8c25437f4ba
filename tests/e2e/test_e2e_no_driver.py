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

import time

import pytest

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    E2E,
    TIME_SLICING_GPUS,
    slice_devices,
    unschedulable,
    wait_for,
)

from dra_driver.gpus.simnode import DRIVER_UNLOADED  # noqa: E402

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

ON_GPU = 'device.attributes["gpu-fraction.dra.dev"].index == {}'


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
