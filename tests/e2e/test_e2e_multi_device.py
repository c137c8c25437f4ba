"""End to end, several devices in one claim: ``count: 4`` fractions on 4 distinct GPUs
(``distinctAttribute`` on the GPU UUID attribute) over a 4-GPU node."""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    DRIVER,
    E2E,
    attr,
    cdi_env,
    check_prepared,
    slice_devices,
    unschedulable,
    wait_for,
)

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

UUID_ATTRIBUTE = f"{DRIVER}/uuid"


FIRST_FOUR = 'device.attributes["gpu-fraction.dra.dev"].index < 4'


def test_four_fractions_on_four_distinct_gpus(e2e: E2E) -> None:
    node = e2e.nodes[1]
    devices = slice_devices(e2e.slices(node.name))
    e2e.template("spread", "gpu-quarter", count=4, distinct=UUID_ATTRIBUTE, selectors=[FIRST_FOUR])
    e2e.pod("spread", node, templates={"gpu": "spread"})
    e2e.wait_running("spread")
    got = check_prepared(e2e, "spread")
    assert len(got.results) == 4
    uuids = {attr(devices[r["device"]], "uuid") for r in got.results}
    assert len(uuids) == 4
    assert len(got.spec["devices"]) == 4
    # The container sees its four GPUs' device nodes, no other GPU's.
    gpu_nodes = [d for d in got.view.devices if d[len("/dev/nvidia") :].isdigit()]
    want = sorted(f"/dev/nvidia{attr(devices[r['device']], 'minor')}" for r in got.results)
    assert gpu_nodes == want
    for i in range(4):
        assert (
            cdi_env(got.spec, i)["NVIDIA_GPU_MEMORY_REQUEST"]
            == got.view.env["NVIDIA_GPU_MEMORY_REQUEST"]
        )

    # With the constraint, 5 cannot fit on 4 GPUs.
    e2e.template("five", "gpu-eighth", count=5, distinct=UUID_ATTRIBUTE, selectors=[FIRST_FOUR])
    e2e.pod("five", node, templates={"gpu": "five"})
    wait_for("pod five Unschedulable", lambda: unschedulable(e2e, "five"))
    assert not e2e.read_pod("five")["spec"].get("nodeName")

    e2e.delete_pod("spread")
    e2e.wait_gone("spread")
    wait_for("the claim unprepared", lambda: not got.spec_path.exists())
    assert got.uid not in node.plugin_checkpoint()
