"""A kubelet with another root directory (kubernetes-sigs/dranet#250,
kubernetes-sigs/dra-driver-nvidia-gpu#464), on a real node started for this test: its kubelet
runs with ``--root-dir=/var/lib/kubelet2`` (``LOCAL_NODE_KUBELET_ROOT_DIR``), and an empty
directory of the node's own lies over ``/var/lib/kubelet``.

A second release of the chart runs the plugin there alone (no classes or policies of its own;
the session's release has them): with ``kubeletDir: /var/lib/kubelet2`` the kubelet registers
it, its slices are published and a fraction pod runs, and nothing is written under
``/var/lib/kubelet``; with the default ``kubeletDir`` the kubelet never calls it and the plugin
says so (log, ``dra-driver status``).

Prints one line (``KUBELET-ROOT | ...``), shown even when the test passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    DRIVER,
    E2E,
    ContainerView,
    GpuNode,
    helm,
    install_second_release,
    node_with_release,
    raw,
    running,
    slice_devices,
    wait_for,
)

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

ROOT_DIR = "/var/lib/kubelet2"
NODE = "gpu-node-root2"
LABEL = "gpu-fraction.dra.dev/e2e-root2-node"
RELEASE = "gfd-root2"
NAMESPACE = "gpu-fraction-e2e-root2"
EIGHTH_MIB = 143_131 // 8  # simulated H200: 143131 MiB


@pytest.fixture
def root2_node(control_plane: Any, e2e: E2E) -> Iterator[GpuNode]:
    """The node with kubelet ``--root-dir`` :data:`ROOT_DIR`; removed after the test (its
    pods first, then the second release, then the node)."""
    env = {"LOCAL_NODE_KUBELET_ROOT_DIR": ROOT_DIR, "LOCAL_NODE_LABELS": f"{LABEL}=true"}
    with node_with_release(control_plane, e2e, NODE, RELEASE, NAMESPACE, env) as node:
        yield node


def _install(control_plane: Any, values_dir: Path, kubelet_dir: str) -> None:
    path = values_dir / f"root2-{kubelet_dir.rsplit('/', 1)[-1]}.yaml"
    install_second_release(
        control_plane,
        RELEASE,
        NAMESPACE,
        LABEL,
        path,
        kubeletDir=kubelet_dir,
        kubeletRegistrationTimeoutSeconds=5,
    )


def _plugin_pods(e2e: E2E) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = raw(
        e2e.core.list_namespaced_pod(
            NAMESPACE,
            field_selector=f"spec.nodeName={NODE}",
            label_selector="app.kubernetes.io/component=kubelet-plugin",
            _preload_content=False,
        )
    )["items"]
    return pods


def _plugin_events(e2e: E2E) -> list[dict[str, Any]]:
    """Events on the second release's plugin pods."""
    names = {p["metadata"]["name"] for p in _plugin_pods(e2e)}
    items: list[dict[str, Any]] = raw(
        e2e.core.list_namespaced_event(NAMESPACE, _preload_content=False)
    )["items"]
    return [e for e in items if e["involvedObject"].get("name") in names]


def _plugin_running(e2e: E2E, kubelet_dir: str) -> bool:
    """The second release's plugin pod on :data:`NODE` runs with ``kubelet_dir``, alone."""
    pods = _plugin_pods(e2e)
    return (
        len(pods) == 1
        and not pods[0]["metadata"].get("deletionTimestamp")
        and running(pods[0])
        and f"--registry-dir={kubelet_dir}/plugins_registry"
        in pods[0]["spec"]["containers"][0]["args"]
    )


def _status(node: GpuNode) -> dict[str, Any]:
    """``dra-driver status`` of the node's state directory, as an admin runs it."""
    out = subprocess.run(
        [sys.executable, "-m", "dra_driver", "status", f"--state-dir={node.state_dir}"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def _files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def test_kubelet_dir_follows_the_kubelets_root_dir_and_a_wrong_one_is_reported(
    e2e: E2E,
    root2_node: GpuNode,
    control_plane: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = root2_node
    default_dir = node.root / "kubelet-default"  # the node's /var/lib/kubelet
    t0 = time.monotonic()
    _install(control_plane, tmp_path, ROOT_DIR)
    wait_for("the plugin running", lambda: _plugin_running(e2e, ROOT_DIR), timeout=120)
    wait_for(
        "the kubelet's call recorded",
        lambda: (_status(node).get("kubeletRegistration") or {}).get("registered") is True,
        timeout=60,
    )
    registered = time.monotonic() - t0
    wait_for(
        "the node's devices published",
        lambda: slice_devices(e2e.slices(NODE)),
        timeout=60,
    )
    e2e.template("eighth", "gpu-eighth")
    e2e.pod("p", node, templates={"gpu": "eighth"}, run_as_user=1000)
    e2e.wait_running("p", timeout=90)
    claim = e2e.claim_of("p")
    uid = claim["metadata"]["uid"]
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, NODE)
    assert node.cdi_spec_path(uid).exists() and uid in node.plugin_checkpoint()
    text = wait_for(
        "the container's view",
        lambda: t if "VIEW-END" in (t := node.container_log(e2e.namespace, "p", "main")) else None,
        timeout=30,
    )
    view = ContainerView.parse(text)
    assert "/dev/nvidia0" in view.devices and view.env["NVIDIA_GPU_MEMORY_LIMIT"] == str(EIGHTH_MIB)
    sockets = _files_under(node.root / "kubelet" / "plugins_registry")
    assert any(s.startswith(DRIVER) and s.endswith("-reg.sock") for s in sockets), sockets
    # Nothing of the driver under the node's /var/lib/kubelet (the kubelet itself keeps a
    # few paths there whatever its --root-dir: device-plugins/, its serving key).
    ours = [f for f in _files_under(default_dir) if f.startswith("plugins") or DRIVER in f]
    assert ours == [], _files_under(default_dir)
    e2e.delete_pod("p")
    e2e.wait_gone("p", timeout=90)  # the kubelet reached the plugin for Unprepare too
    assert uid not in node.plugin_checkpoint() and not node.cdi_spec_path(uid).exists()

    # An install with the chart's default kubeletDir, wrong on this node. Where the kubelet
    # never made /var/lib/kubelet/plugins_registry, the plugin pod cannot start, and its event
    # names the path.
    helm(control_plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait")
    wait_for("the first plugin gone", lambda: not _plugin_pods(e2e), timeout=60)
    t1 = time.monotonic()
    _install(control_plane, tmp_path, "/var/lib/kubelet")
    missing = wait_for(
        "the plugin pod's FailedMount event",
        lambda: next(
            (e["message"] for e in _plugin_events(e2e) if e["reason"] == "FailedMount"), None
        ),
        timeout=60,
    )
    assert "/var/lib/kubelet/plugins_registry" in missing and "does not exist" in missing
    # Where that directory exists (left from a kubelet that used /var/lib/kubelet before), the
    # plugin starts, and says that the kubelet never calls it.
    (default_dir / "plugins_registry").mkdir(parents=True)
    wait_for("the plugin running", lambda: _plugin_running(e2e, "/var/lib/kubelet"), timeout=120)
    state = wait_for(
        "the plugin's report",
        lambda: r if (r := _status(node).get("kubeletRegistration") or {}).get("problem") else None,
        timeout=60,
    )
    reported = time.monotonic() - t1
    assert state["registered"] is False
    assert "/var/lib/kubelet/plugins_registry/" in state["socket"]
    assert "its --root-dir is not /var/lib/kubelet;" in state["problem"]
    assert "chart value kubeletDir" in state["problem"]
    [plugin] = _plugin_pods(e2e)
    log = node.container_log(NAMESPACE, plugin["metadata"]["name"], "plugin")
    assert "kubelet never called the plugin" in log, log[-2000:]
    with capsys.disabled():
        print(
            f"\nKUBELET-ROOT | kubeletDir={ROOT_DIR}: registered {registered:.1f} s after install,"
            f" fraction pod ran and was unprepared, nothing under /var/lib/kubelet | "
            f"kubeletDir=/var/lib/kubelet: pod event {missing[:90]!r}; with that directory "
            f"present, reported {reported:.1f} s after install: {state['problem'][:100]}..."
        )
