"""What each fraction uses (issue 27, part 1), end to end on a real node: two tenants on one
GPU say what they allocate and compute (``tenant-probe --use-memory --use-sm``), the emulated
MPS server holds each to its namespace's limits, the plugin reads the simulated NVML every
``usageIntervalSeconds`` and exports per-claim metrics, and ``dra-driver occupancy`` shows
them through the API server's pod proxy.

Local nodes share the machine's network, so the session's release serves no metrics (two
plugins would collide on one port); this test starts a node of its own with a second release
of the chart that serves them (one plugin on the port, host network). Prints ``USAGE | ...``
lines, shown even when the test passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    E2E,
    GpuNode,
    install_second_release,
    node_with_release,
    raw,
    running,
    wait_for,
)

from devtools.localnode import free_port  # noqa: E402
from dra_driver.cluster.occupancyusage import ClaimUse, parse_metrics  # noqa: E402
from dra_driver.mpsemu.probe import parse_line  # noqa: E402

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

NODE = "gpu-node-usage"
LABEL = "gpu-fraction.dra.dev/e2e-usage-node"
RELEASE = "gfd-usage"
NAMESPACE = "gpu-fraction-e2e-usage"
GIB = 1 << 30
TENANTS = {
    # pod: (class, probe arguments)
    "trainer": ("gpu-quarter", ["--use-memory", "2Gi", "--use-sm", "20"]),
    "notebook": ("gpu-eighth", ["--use-memory", "16Gi", "--use-sm", "5"]),
}


@pytest.fixture
def usage_node(control_plane: Any, e2e: E2E, tmp_path: Path) -> Iterator[tuple[GpuNode, int]]:
    """A node of this test with the second release serving metrics on a free port; removed
    after the test (its pods first, then the release, then the node)."""
    env = {"LOCAL_NODE_LABELS": f"{LABEL}=true"}
    with node_with_release(control_plane, e2e, NODE, RELEASE, NAMESPACE, env) as node:
        port = free_port()
        install_second_release(
            control_plane,
            RELEASE,
            NAMESPACE,
            LABEL,
            tmp_path / "usage-values.yaml",
            metricsPort=port,
            usageIntervalSeconds=2,
        )
        yield node, port


def plugin_pod(e2e: E2E) -> dict[str, Any] | None:
    pods = raw(
        e2e.core.list_namespaced_pod(
            NAMESPACE,
            field_selector=f"spec.nodeName={NODE}",
            label_selector="app.kubernetes.io/component=kubelet-plugin",
            _preload_content=False,
        )
    )["items"]
    return pods[0] if len(pods) == 1 and running(pods[0]) else None


def scrape(e2e: E2E, pod: dict[str, Any], port: int) -> str:
    """The plugin's ``/metrics`` through the API server's pod proxy (as occupancy reads it)."""
    resp = e2e.core.connect_get_namespaced_pod_proxy_with_path(
        f"{pod['metadata']['name']}:{port}", NAMESPACE, "metrics", _preload_content=False
    )
    text: str = resp.data.decode()
    return text


def probe_state(node: GpuNode, e2e: E2E, pod: str) -> dict[str, str] | None:
    lines = [parse_line(x) for x in node.container_log(e2e.namespace, pod, "main").splitlines()]
    used = [f for f in lines if f.get("state") in ("using", "use-refused")]
    return used[-1] if used else None


def test_two_tenants_usage_in_the_metrics_and_in_occupancy(
    e2e: E2E,
    control_plane: Any,
    usage_node: tuple[GpuNode, int],
    capsys: pytest.CaptureFixture[str],
) -> None:
    node, port = usage_node
    plugin = wait_for("the usage node's plugin Running", lambda: plugin_pod(e2e), timeout=120)
    for pod, (cls, args) in TENANTS.items():
        e2e.template(pod, cls)
        spec = {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": pod}],
        }
        e2e.create_pod(pod, spec, probe=True, probe_args=args)
    for pod in TENANTS:
        e2e.wait_running(pod, timeout=90)
    granted = {
        pod: wait_for(f"{pod}'s probe told its use", lambda p=pod: probe_state(node, e2e, p), 60)
        for pod in TENANTS
    }
    assert granted["trainer"]["state"] == "using" and granted["trainer"]["sm"] == "20"
    assert granted["notebook"]["state"] == "using"
    claims = {pod: e2e.claim_of(pod)["metadata"]["uid"] for pod in TENANTS}

    def usage() -> dict[str, ClaimUse] | None:
        got = parse_metrics(scrape(e2e, plugin, port))
        mine = {
            pod: next((u for (uid, _), u in got.items() if uid == claims[pod]), None)
            for pod in TENANTS
        }
        return mine if all(u and u.sm_percent for u in mine.values()) else None

    seen = wait_for("both claims' usage in the plugin's metrics", usage, timeout=60)
    trainer, notebook = seen["trainer"], seen["notebook"]
    assert (trainer.used_bytes, trainer.sm_percent) == (2 * GIB, 20)
    assert trainer.sm_normalized == pytest.approx(80, abs=0.5)  # 20% of the card, a quarter bought
    assert not trainer.near_ceiling and trainer.idle_seconds == 0
    assert (notebook.used_bytes, notebook.sm_percent) == (16 * GIB, 5)
    assert notebook.sm_normalized == pytest.approx(40, abs=0.5)
    assert notebook.near_ceiling  # 16 GiB of an eighth's 17.4
    out = subprocess.run(
        [sys.executable, "-m", "dra_driver", "occupancy", "--kubeconfig",
         str(control_plane.kubeconfig), "--node", NODE],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = {
        w[2].split("/")[1].rsplit("-gpu-", 1)[0]: w
        for w in (line.split() for line in out.stdout.splitlines())
        if len(w) > 8 and w[2].startswith(f"{e2e.namespace}/")
    }
    assert rows["trainer"][-3:] == ["2.0Gi", "80", "-"], out.stdout
    assert rows["notebook"][-3:] == ["16.0Gi", "40", "near-ceiling"], out.stdout
    doc = json.loads(
        subprocess.run(
            [sys.executable, "-m", "dra_driver", "occupancy", "--kubeconfig",
             str(control_plane.kubeconfig), "--node", NODE, "-o", "json"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout
    )  # fmt: skip
    assert doc["usageUnknown"] == {}
    with capsys.disabled():
        print(f"\nUSAGE | dra-driver occupancy --node {NODE}\n{out.stdout}")
        for pod, u in seen.items():
            print(f"USAGE | {pod} | used {u.used_bytes} B, SM {u.sm_percent}% raw, "
                  f"{u.sm_normalized:.0f}% normalized, near ceiling {u.near_ceiling}")  # fmt: skip
