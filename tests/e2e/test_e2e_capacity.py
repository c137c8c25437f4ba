"""End to end, capacity model: claims ask ``capacity.requests.memory`` of a shared GPU device;
the real scheduler rounds the request to the device's request policy and gives each claim a
share ID; the plugin prepares each share with its own CDI device and memory request."""

from __future__ import annotations

import pytest

from dra_driver.config.load import parse_bytes

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    E2E,
    attr,
    check_prepared,
    slice_devices,
    unschedulable,
    wait_for,
)

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

MIB = 1024 * 1024
ON_GPU4 = 'device.attributes["gpu-fraction.dra.dev"].index == 4'


def test_capacity_shares_of_one_gpu(e2e: E2E) -> None:
    node = e2e.nodes[0]
    gpu4 = slice_devices(e2e.slices(node.name))["gpu-4-sm-sharing"]
    assert gpu4["allowMultipleAllocations"] is True
    assert attr(gpu4, "fractionModel") == "capacity"

    # 12Gi is on the grid (1Gi + n * 256Mi); 1500Mi is rounded up to 1536Mi.
    asks = {"a": "12Gi", "b": "20Gi", "c": "1500Mi"}
    for name, amount in asks.items():
        e2e.template(name, "gpu-memory-sm-sharing", capacity=amount, selectors=[ON_GPU4])
        e2e.pod(f"pod-{name}", node, templates={"gpu": name})
    got = {}
    for name in asks:
        e2e.wait_running(f"pod-{name}")
        got[name] = check_prepared(e2e, f"pod-{name}")

    expected = {"a": 12 * 1024, "b": 20 * 1024, "c": 1536}
    share_ids = set()
    for name, prepared in got.items():
        [result] = prepared.results
        assert result["device"] == "gpu-4-sm-sharing"
        assert result["shareID"]
        share_ids.add(result["shareID"])
        consumed = parse_bytes(result["consumedCapacity"]["memory"], "consumedCapacity")
        assert consumed == expected[name] * MIB
        [device] = prepared.spec["devices"]
        assert device["name"].endswith(f"gpu-4-sm-sharing-{result['shareID']}")
        env = prepared.view.env
        assert env["NVIDIA_GPU_MEMORY_REQUEST"] == str(expected[name])
        assert env["NVIDIA_GPU_MEMORY_LIMIT"] == str(expected[name])
    assert len(share_ids) == 3
    # Three shares of one GPU: three MPS namespaces, each container mounts only its own.
    assert len({m for g in got.values() for m in g.view.mounts}) == 3

    # A share larger than what is left of the card is not allocated.
    e2e.template("huge", "gpu-memory-sm-sharing", capacity="120Gi", selectors=[ON_GPU4])
    e2e.pod("pod-huge", node, templates={"gpu": "huge"})
    wait_for("pod-huge Unschedulable", lambda: unschedulable(e2e, "pod-huge"))

    for name in asks:
        e2e.delete_pod(f"pod-{name}")
    for name in asks:
        e2e.wait_gone(f"pod-{name}")
    wait_for("shares unprepared", lambda: not any(g.spec_path.exists() for g in got.values()))
    # With the shares released the big one fits.
    e2e.wait_running("pod-huge", timeout=60)
    [result] = check_prepared(e2e, "pod-huge").results
    assert result["consumedCapacity"]["memory"] == "120Gi"
