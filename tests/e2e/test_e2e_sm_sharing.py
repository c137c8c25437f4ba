"""End to end, compute modes: sm-sharing product GPUs (8-11 of the session's nodes) next to
time-slicing ones (0-3); sm-sharing classes land on sm-sharing GPUs with the claim's MPS
parameters in the container's environment."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dra_driver.gpus import SimulatedGpuSource
from dra_driver.model.devices import product_memory_bytes

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    E2E,
    GPUS,
    attr,
    check_prepared,
    slice_devices,
    wait_for,
)

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

MIB = 1024 * 1024
ON_GPU = 'device.attributes["gpu-fraction.dra.dev"].index == {}'


def test_sm_sharing_and_time_slicing_side_by_side(e2e: E2E) -> None:
    node = e2e.nodes[0]
    devices = slice_devices(e2e.slices(node.name))
    assert {attr(d, "computeMode") for n, d in devices.items() if n.startswith("gpu-9-")} == {
        "sm-sharing"
    }
    card = SimulatedGpuSource(GPUS, seed=node.name).discover().gpus[9]
    quarter = product_memory_bytes(card, Fraction(1, 4))

    e2e.template(
        "mps",
        "gpu-quarter-sm-sharing",
        parameters={"activeThreadPercentage": 50, "memoryLimit": "48Gi"},
        selectors=[ON_GPU.format(9)],
    )
    e2e.template("plain", "gpu-quarter-sm-sharing", selectors=[ON_GPU.format(9)])
    e2e.template("ts", "gpu-quarter", selectors=[ON_GPU.format(1)])
    for name in ("mps", "plain", "ts"):
        e2e.pod(name, node, templates={"gpu": name})
    for name in ("mps", "plain", "ts"):
        e2e.wait_running(name)

    mps = check_prepared(e2e, "mps")
    [result] = mps.results
    assert result["device"] == "gpu-9-sm-sharing"
    env = mps.view.env
    assert env["GPU_FRACTION_COMPUTE_MODE"] == "sm-sharing"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["NVIDIA_GPU_MEMORY_REQUEST"] == str(quarter // MIB)
    assert env["NVIDIA_GPU_MEMORY_LIMIT"] == str(48 * 1024)
    assert "CUDA_MPS_PIPE_DIRECTORY" in env
    mounts = mps.spec["devices"][0]["containerEdits"].get("mounts", [])
    assert any(m["containerPath"] == env["CUDA_MPS_PIPE_DIRECTORY"] for m in mounts)

    plain = check_prepared(e2e, "plain")
    assert plain.results[0]["device"] == "gpu-9-sm-sharing"
    plain_env = plain.view.env
    assert plain_env["GPU_FRACTION_COMPUTE_MODE"] == "sm-sharing"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in plain_env
    assert plain_env["NVIDIA_GPU_MEMORY_LIMIT"] == plain_env["NVIDIA_GPU_MEMORY_REQUEST"]

    ts = check_prepared(e2e, "ts")
    assert ts.results[0]["device"] == "gpu-1-time-slicing"
    assert ts.view.env["GPU_FRACTION_COMPUTE_MODE"] == "time-slicing"
    # Two claims on GPU 9 in the sm-sharing daemon, one on GPU 1 in the time-slicing one:
    # three separate pipe directories, each mounted in its own container only.
    assert "/sm-sharing/" in mps.view.mounts[0] and "/time-slicing/" in ts.view.mounts[0]
    assert len({mps.view.mounts[0], plain.view.mounts[0], ts.view.mounts[0]}) == 3

    for name in ("mps", "plain", "ts"):
        e2e.delete_pod(name)
    for name in ("mps", "plain", "ts"):
        e2e.wait_gone(name)
    wait_for("claims unprepared", lambda: not any(e2e.prepared_here().values()))
