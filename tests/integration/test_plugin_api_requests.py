"""What the kubelet plugin asks of a real API server, read from its audit log: publishing rounds
that change nothing make no request (the slices come from the watch's cache), someone else's
deletion of a slice is repaired at once through the watch, the Node is read again only then,
and every request names the driver in its User-Agent.

A nodeless control plane (hack/local-cluster) with an audit policy, a kubelet-less Node, and
``dra-driver kubelet-plugin`` as a process for it with publishing rounds every second.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from dra_driver import DEFAULT_DRIVER_NAME as DRIVER
from tests.support.audit import (
    PLUGIN_AGENTS,
    audit_events,
    audited_cluster,
    received,
    request_kind,
    requests_of,
)
from tests.support.waiting import wait_for

NODE = "audit-node"
ROUND_S = 1


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[k8s.ApiClient, Path, subprocess.Popen[bytes]]]:
    """(admin client, state root, the plugin process), the plugin's slices published."""
    with tempfile.TemporaryDirectory(prefix="dap", dir="/tmp") as tmp:
        root = Path(tmp)
        with audited_cluster(root) as kubeconfig:
            api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
            api.user_agent = "test-admin"
            k8s.CoreV1Api(api).create_node({"metadata": {"name": NODE}})
            log = (root / "plugin.log").open("wb")
            plugin = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dra_driver",
                    "kubelet-plugin",
                    f"--node-name={NODE}",
                    "--gpus=simulated:H200x2",
                    f"--kubeconfig={kubeconfig}",
                    f"--plugin-dir={root}/p",
                    f"--registry-dir={root}/r",
                    f"--cdi-root={root}/cdi",
                    f"--state-dir={root}/s",
                    f"--mps-root={root}/run",
                    f"--publish-interval={ROUND_S}",
                    "--simulated-enforcer=recording",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
            try:
                wait_for("the plugin's two slices", lambda: len(slices(api)) == 2, 60)
                yield api, root, plugin
            finally:
                plugin.terminate()
                plugin.wait(30)
                log.close()
                api.close()


def slices(api: k8s.ApiClient) -> list[Any]:
    items: list[Any] = (
        k8s.ResourceV1Api(api)
        .list_resource_slice(field_selector=f"spec.nodeName={NODE},spec.driver={DRIVER}")
        .items
    )
    return items


def plugin_requests(root: Path, start: float, end: float = float("inf")) -> dict[str, int]:
    return dict(requests_of(audit_events(root / "audit.log"), PLUGIN_AGENTS, start, end))


def test_rounds_that_change_nothing_make_no_request(
    node: tuple[k8s.ApiClient, Path, subprocess.Popen[bytes]],
) -> None:
    api, root, plugin = node
    time.sleep(3 * ROUND_S)  # the first round and the watch's start are over
    start = time.time()
    time.sleep(8 * ROUND_S)  # 8 publishing rounds
    assert plugin.poll() is None
    assert plugin_requests(root, start, time.time()) == {}
    agents = {e.get("userAgent", "") for e in audit_events(root / "audit.log")}
    assert not {a for a in agents if a.startswith(("OpenAPI-Generator", "python-urllib3"))}
    assert any(a.startswith("dra-driver/") and "(kubelet-plugin)" in a for a in agents)


def test_a_slice_deleted_by_someone_else_is_recreated_through_the_watch(
    node: tuple[k8s.ApiClient, Path, subprocess.Popen[bytes]],
) -> None:
    api, root, _ = node
    victim = slices(api)[0].metadata.name
    start = time.time()
    k8s.ResourceV1Api(api).delete_resource_slice(victim)
    wait_for(f"{victim} recreated", lambda: victim in {s.metadata.name for s in slices(api)}, 10)
    time.sleep(3 * ROUND_S)
    got = [
        request_kind(e)
        for e in audit_events(root / "audit.log")
        if e.get("userAgent", "").startswith(PLUGIN_AGENTS) and received(e) >= start
    ]
    # The watch delivered the deletion: no list before the repair; the Node read again (a Node
    # that went away takes its slices with it, and the new one has another UID); the slice
    # created, the pool's other slice updated to the new pool generation. A round that came
    # before the watch showed those writes back lists once; nothing else.
    assert got[:3] == ["get nodes", "create resourceslices", "update resourceslices"], got
    assert got[3:] in ([], ["list resourceslices"]), got
