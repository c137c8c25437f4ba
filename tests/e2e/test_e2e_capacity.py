"""End to end, capacity model: claims ask ``capacity.requests.memory`` of a shared GPU device;
the real scheduler rounds the request to the device's request policy and gives each claim a
share ID; the plugin prepares each share with its own CDI device and memory request."""

from __future__ import annotations

import pytest

from dra_driver.config import parse_bytes
from dra_driver.publisher import normalize_spec

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
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

MIB = 1024 * 1024
CONFIG = {"gpus": [{"selector": {"index": 0}, "fractionModel": "capacity"}]}


def test_capacity_shares_of_one_gpu(e2e: E2E, tmp_path: object) -> None:
    node = e2e.start_node("simulated:H200x2", node_config=CONFIG)
    stored = e2e.slices(node.name)
    # The API server accepted the capacity device (allowMultipleAllocations, requestPolicy)
    # exactly as rendered.
    rendered = node.rendered_slices()
    assert [normalize_spec(s["spec"], True) for s in stored] == [
        normalize_spec(s["spec"], True) for s in rendered
    ]
    gpu0 = slice_devices(stored)["gpu-0"]
    assert gpu0["allowMultipleAllocations"] is True
    assert attr(gpu0, "fractionModel") == "capacity"

    # 12Gi is on the grid (1Gi + n * 256Mi); 1500Mi is rounded up to 1536Mi.
    asks = {"a": "12Gi", "b": "20Gi", "c": "1500Mi"}
    for name, amount in asks.items():
        e2e.template(name, "gpu-memory", capacity=amount)
        e2e.pod(f"pod-{name}", node, templates={"gpu": name})
    got = {}
    for name in asks:
        e2e.wait_running(f"pod-{name}")
        got[name] = check_prepared(e2e, node, f"pod-{name}")

    expected = {"a": 12 * 1024, "b": 20 * 1024, "c": 1536}
    share_ids = set()
    for name, prepared in got.items():
        [result] = prepared.results
        assert result["device"] == "gpu-0"
        assert result["shareID"]
        share_ids.add(result["shareID"])
        consumed = parse_bytes(result["consumedCapacity"]["memory"], "consumedCapacity")
        assert consumed == expected[name] * MIB
        [device] = prepared.spec["devices"]
        assert device["name"].endswith(f"gpu-0-{result['shareID']}")
        [annotated] = prepared.annotation["devices"]
        assert annotated["shareID"] == result["shareID"]  # v1 Device.share_id
        env = cdi_env(prepared.spec)
        assert env["NVIDIA_GPU_MEMORY_REQUEST"] == str(expected[name])
        assert env["NVIDIA_GPU_MEMORY_LIMIT"] == str(expected[name])
    assert len(share_ids) == 3

    # A share larger than what is left of the card is not allocated.
    e2e.template("huge", "gpu-memory", capacity="120Gi")
    e2e.pod("pod-huge", node, templates={"gpu": "huge"})
    wait_for("pod-huge Unschedulable", lambda: unschedulable(e2e, "pod-huge"))

    for name in asks:
        e2e.delete_pod(f"pod-{name}")
    for name in asks:
        e2e.wait_gone(f"pod-{name}")
    assert not any(g.spec_path.exists() for g in got.values())
    # With the shares released the big one fits.
    e2e.wait_running("pod-huge", timeout=60)
    [result] = check_prepared(e2e, node, "pod-huge").results
    assert result["consumedCapacity"]["memory"] == "120Gi"
