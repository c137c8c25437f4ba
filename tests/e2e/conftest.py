"""End-to-end fixtures: a real local Kubernetes cluster (hack/local-cluster).

The `control_plane` fixture starts etcd, kube-apiserver, kube-controller-manager and
kube-scheduler once per test session, plus two real nodes, gpu-node-1 and gpu-node-2 (a
kubelet with containerd and runc each, hack/local-node). The binaries are built from their
official Go modules by hack/build-k8s and cached under ${DRA_DRIVER_CACHE:-~/.cache/dra-driver}:
the first build takes several minutes, later sessions start the cluster in seconds. The
container images (the plugin, the sandbox image, a busybox workload image) are built by
hack/build-image (`make image`) and imported into each node.

The builds run once after collection (only if a selected test uses `control_plane`), so
they are not cut short by the per-test timeout; their output is streamed to the terminal. If
something cannot be built or the cluster does not come up, every test using the fixture
fails with the error: there is no fake fallback.

Environment:
  DRA_E2E_CLUSTER_DIR   state dir to use instead of a fresh one under pytest's tmp. A
                        cluster already up there is reused and left running (fast reruns).
  DRA_E2E_KEEP_CLUSTER  if set, do not stop the cluster this session started.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

REPO = Path(__file__).resolve().parents[2]
LOCAL_CLUSTER = REPO / "hack" / "local-cluster"
BUILD_K8S = REPO / "hack" / "build-k8s"
BUILD_IMAGE = REPO / "hack" / "build-image"
COMPONENTS = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]
NODE_COMPONENTS = ["kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "helm"]
NODE_COMPONENTS += ["bridge", "host-local", "loopback"]
NODES = "gpu-node-1,gpu-node-2"
LEFTOVERS_WAIT_S = 30.0
"""Seconds the teardown waits for what `hack/local-cluster down` killed to be gone."""

_build_error: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: end-to-end test against a real local Kubernetes control plane"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.e2e)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build (or check) the control-plane binaries before any test timeout runs."""
    global _build_error
    if session.config.option.collectonly or not any(
        "control_plane" in getattr(item, "fixturenames", ()) for item in session.items
    ):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    t0 = time.monotonic()
    for cmd in (
        [str(BUILD_K8S), *COMPONENTS, *NODE_COMPONENTS],
        [sys.executable, str(BUILD_IMAGE)],
    ):
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line.rstrip())
            if reporter is not None:
                reporter.write_line(f"[e2e] {line.rstrip()}")
        if proc.wait() != 0:
            tail = "\n".join(lines[-60:])
            _build_error = f"{Path(cmd[-1]).name} failed (exit {proc.returncode}):\n{tail}"
            return
    if reporter is not None:
        reporter.write_line(f"[e2e] binaries and images ready in {time.monotonic() - t0:.0f}s")


@dataclass
class ControlPlane:
    state_dir: Path
    kubeconfig: Path
    _clients: list[k8s_client.ApiClient] = field(default_factory=list, repr=False)

    def api_client(self) -> k8s_client.ApiClient:
        """A new kubernetes.client.ApiClient authenticated as cluster admin."""
        api: k8s_client.ApiClient = k8s_config.new_client_from_config(
            config_file=str(self.kubeconfig)
        )
        self._clients.append(api)
        return api

    def close(self) -> None:
        for c in self._clients:
            with contextlib.suppress(Exception):
                c.close()
        self._clients.clear()


def _local_cluster(cmd: str, env: dict[str, str], log: Path) -> int:
    with open(log, "ab") as out:
        return subprocess.run(
            [sys.executable, str(LOCAL_CLUSTER), cmd],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        ).returncode


def _tail(path: Path, n: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if _build_error is not None:
        pytest.fail(_build_error, pytrace=False)
    fixed = os.environ.get("DRA_E2E_CLUSTER_DIR")
    if fixed:
        state = Path(fixed).absolute()
    else:
        state = tmp_path_factory.mktemp("control-plane") / "cluster"
    env = {**os.environ, "LOCAL_CLUSTER_DIR": str(state), "LOCAL_CLUSTER_NODES": NODES}
    log = tmp_path_factory.getbasetemp() / "local-cluster.log"

    reuse = bool(fixed) and _local_cluster("status", env, log) == 0
    if not reuse:
        # `up` also runs hack/build-k8s, a no-op here unless the build above was skipped.
        rc = _local_cluster("up", env, log)
        if rc != 0:
            pytest.fail(f"hack/local-cluster up failed (exit {rc}):\n{_tail(log)}", pytrace=False)

    cp = ControlPlane(state_dir=state, kubeconfig=state / "kubeconfig")
    try:
        yield cp
    finally:
        cp.close()
        if not reuse and not os.environ.get("DRA_E2E_KEEP_CLUSTER"):
            _local_cluster("down", env, log)
            # `down` removed everything the cluster and its nodes made. Processes it killed may
            # take a moment to exit (a fresh-clone CI run once found a node's containerd,
            # kubelet and holder still there; they were gone when looked at minutes later, the
            # cause not found): what counts is what stays.
            deadline = time.monotonic() + LEFTOVERS_WAIT_S
            while True:
                left = subprocess.run(
                    [sys.executable, str(REPO / "hack" / "local-node"), "leftovers"],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if left.returncode == 0 or time.monotonic() > deadline:
                    break
                time.sleep(1)
            if left.returncode != 0:
                pytest.fail(
                    f"hack/local-cluster down left:\n{left.stdout}\n"
                    f"its output ({log}):\n{_tail(log, 30)}",
                    pytrace=False,
                )
