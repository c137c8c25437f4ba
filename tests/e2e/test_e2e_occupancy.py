"""End to end, ``dra-driver occupancy`` on the real nodes: the chart-installed plugins publish,
the real scheduler allocates, the real kubelets run the pods; the command (a subprocess with
the session's kubeconfig, no node access) shows who holds which fraction and why a pod waits."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import E2E, check_prepared, unschedulable, wait_for  # noqa: E402

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

ON_GPU = 'device.attributes["gpu-fraction.dra.dev"].index == {}'
GPU = 3


def occupancy(e2e: E2E, *args: str) -> str:
    kubeconfig = e2e.driver.control_plane.kubeconfig
    out = subprocess.run(
        [sys.executable, "-m", "dra_driver", "occupancy", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_occupancy_shows_running_claims_and_why_a_pod_waits(e2e: E2E) -> None:
    node = e2e.nodes[0]
    e2e.template("quarter", "gpu-quarter", selectors=[ON_GPU.format(GPU)])
    e2e.template("full", "gpu-full", selectors=[ON_GPU.format(GPU)])
    e2e.pod("q", node, templates={"gpu": "quarter"})
    e2e.wait_running("q")
    claim = check_prepared(e2e, "q").claim
    e2e.pod("f", node, templates={"gpu": "full"})
    wait_for("pod f Unschedulable", lambda: unschedulable(e2e, "f"))

    doc = json.loads(occupancy(e2e, "-o", "json", "--node", node.name))
    gpu = next(g for g in doc["gpus"] if g["index"] == GPU)
    assert gpu["mode"] == "time-slicing"
    held = {(c["namespace"], c["name"]): c for c in gpu["claims"]}
    mine = held[(e2e.namespace, claim["metadata"]["name"])]
    assert mine["pods"] == ["q"]
    assert gpu["promisedBytes"] + gpu["freeBytes"] == gpu["memoryBytes"]
    pending = {p["name"]: p for p in doc["pending"] if p["namespace"] == e2e.namespace}
    assert set(pending) == {"f"}
    # The claim's own CEL selector (pinning GPU 3) is not evaluated by occupancy: other GPUs
    # of the node have room, so it reports the scheduler's message instead of guessing.
    assert pending["f"]["reason"] == "unknown", pending["f"]
    assert "cannot allocate all claims" in pending["f"]["detail"], pending["f"]

    text = occupancy(e2e, "--node", node.name)
    print(text)
    assert f"{e2e.namespace}/{claim['metadata']['name']}" in text
    assert f"{e2e.namespace}/f  gpu-full  unknown:" in text
