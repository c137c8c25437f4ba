"""Start-up as one object: a failure after the servers started releases everything that had
started (issue: 'no cleanup path if start-up fails after the servers started')."""

from __future__ import annotations

import socket
import tempfile
import threading
from pathlib import Path

import pytest

from dra_driver.app.plugin import PluginOptions, RunningPlugin
from dra_driver.enforce import MpsOptions

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def _options(root: Path, metrics_port: int) -> PluginOptions:
    (root / "kubeconfig").write_text(KUBECONFIG)
    return PluginOptions(
        driver_name="gpu-fraction.dra.dev",
        node_name="node-a",
        gpus="simulated:H200x1",
        kubeconfig=str(root / "kubeconfig"),
        plugin_dir=str(root / "plugins"),
        registry_dir=str(root / "registry"),
        cdi_root=str(root / "cdi"),
        state_dir=str(root / "state"),
        node_config=None,
        metrics_port=metrics_port,
        metrics_bind_address="127.0.0.1",
        mps=MpsOptions(root=str(root / "run")),  # never the host's /run/gpu-fraction
    )


def _plugin_threads() -> set[str]:
    names = {"mps-supervisor", "publisher", "slice-watch"}
    return {t.name for t in threading.enumerate() if t.name in names and t.is_alive()}


def test_busy_metrics_port_releases_the_sockets_and_servers() -> None:
    with (
        tempfile.TemporaryDirectory(prefix="dra-") as tmp,
        socket.socket() as busy,
    ):
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        root = Path(tmp)
        opts = _options(root, busy.getsockname()[1])
        stop = threading.Event()
        with pytest.raises(OSError), RunningPlugin(opts, stop):
            pass
        assert stop.is_set()
        sockets = [p for p in root.rglob("*") if p.is_socket()]
        assert sockets == []  # the registration and DRA sockets were created, then removed
        assert (root / "plugins" / "gpu-fraction.dra.dev").is_dir()  # it did get that far


def test_leaving_stops_every_thread_and_removes_the_sockets() -> None:
    with tempfile.TemporaryDirectory(prefix="dra-") as tmp:
        root = Path(tmp)
        stop = threading.Event()
        with RunningPlugin(_options(root, 0), stop) as plugin:
            assert plugin.gpu_count == 1
            assert [p for p in root.rglob("*") if p.is_socket()]
        assert [p for p in root.rglob("*") if p.is_socket()] == []
        assert "publisher" not in _plugin_threads()
