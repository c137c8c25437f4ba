"""End to end, compute modes: a node whose GPU 1 runs sm-sharing (MPS) next to a time-slicing
GPU 0; sm-sharing classes land on GPU 1 with the claim's MPS parameters in the CDI env."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dra_driver.gpus import SimulatedGpuSource
from dra_driver.slices import product_memory_bytes

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    E2E,
    attr,
    cdi_env,
    check_prepared,
    slice_devices,
)

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

MIB = 1024 * 1024
CONFIG = {"gpus": [{"selector": {"index": 1}, "computeMode": "sm-sharing"}]}


def test_sm_sharing_and_time_slicing_side_by_side(e2e: E2E) -> None:
    node = e2e.start_node("simulated:H200x2", node_config=CONFIG)
    devices = slice_devices(e2e.slices(node.name))
    assert {attr(d, "computeMode") for n, d in devices.items() if n.startswith("gpu-1-")} == {
        "sm-sharing"
    }
    card = SimulatedGpuSource("simulated:H200x2", seed=node.name).discover().gpus[1]
    quarter = product_memory_bytes(card, Fraction(1, 4))

    e2e.template(
        "mps",
        "gpu-quarter-sm-sharing",
        parameters={"activeThreadPercentage": 50, "memoryLimit": "48Gi"},
    )
    e2e.template("plain", "gpu-quarter-sm-sharing")
    e2e.template("ts", "gpu-quarter")
    for name in ("mps", "plain", "ts"):
        e2e.pod(name, node, templates={"gpu": name})
    for name in ("mps", "plain", "ts"):
        e2e.wait_running(name)

    mps = check_prepared(e2e, node, "mps")
    [result] = mps.results
    assert result["device"].startswith("gpu-1-quarter-")
    env = cdi_env(mps.spec)
    assert env["GPU_FRACTION_COMPUTE_MODE"] == "sm-sharing"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["NVIDIA_GPU_MEMORY_REQUEST"] == str(quarter // MIB)
    assert env["NVIDIA_GPU_MEMORY_LIMIT"] == str(48 * 1024)
    assert "CUDA_MPS_PIPE_DIRECTORY" in env
    mounts = mps.spec["devices"][0]["containerEdits"].get("mounts", [])
    assert any(m["containerPath"] == env["CUDA_MPS_PIPE_DIRECTORY"] for m in mounts)

    plain = check_prepared(e2e, node, "plain")
    assert plain.results[0]["device"].startswith("gpu-1-quarter-")
    plain_env = cdi_env(plain.spec)
    assert plain_env["GPU_FRACTION_COMPUTE_MODE"] == "sm-sharing"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in plain_env
    assert plain_env["NVIDIA_GPU_MEMORY_LIMIT"] == plain_env["NVIDIA_GPU_MEMORY_REQUEST"]

    ts = check_prepared(e2e, node, "ts")
    assert ts.results[0]["device"].startswith("gpu-0-quarter-")
    assert cdi_env(ts.spec)["GPU_FRACTION_COMPUTE_MODE"] == "time-slicing"

    for name in ("mps", "plain", "ts"):
        e2e.delete_pod(name)
    for name in ("mps", "plain", "ts"):
        e2e.wait_gone(name)
    assert node.cdi_specs() == {}
