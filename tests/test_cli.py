"""The ``dra-driver`` command line, run as a user runs it (subprocesses)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.kubelet.server import SocketPaths
from tests.apiserver_stub import ClaimServer
from tests.conftest import kubelet_connect

CLI = [sys.executable, "-m", "dra_driver"]


@pytest.mark.parametrize("sub", [[], ["kubelet-plugin"], ["render-slices"], ["status"]])
def test_help_everywhere(sub: list[str]) -> None:
    out = subprocess.run([*CLI, *sub, "--help"], capture_output=True, text=True, check=True)
    assert "usage: dra-driver" in out.stdout


def test_render_slices_prints_api_json() -> None:
    out = subprocess.run(
        [*CLI, "render-slices", "--node", "n1", "--gpus", "simulated:H200x2"],
        capture_output=True,
        text=True,
        check=True,
    )
    slices = json.loads(out.stdout)
    assert slices and all(s["kind"] == "ResourceSlice" for s in slices)
    assert {s["spec"]["driver"] for s in slices} == {DEFAULT_DRIVER_NAME}
    assert "null" not in out.stdout


def test_render_slices_bad_spec_is_a_clear_error() -> None:
    out = subprocess.run(
        [*CLI, "render-slices", "--node", "n1", "--gpus", "simulated:H900x2"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "unknown simulated GPU model 'H900'" in out.stderr


def test_plugin_stops_cleanly_on_sigterm() -> None:
    with tempfile.TemporaryDirectory(prefix="drac-") as tmp, ClaimServer() as api:
        root = Path(tmp)
        kubeconfig = root / "kubeconfig"
        host = api.api_client().configuration.host
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": host}}],
                    "users": [{"name": "u", "user": {}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        paths = SocketPaths.for_driver(DEFAULT_DRIVER_NAME, f"{tmp}/p", f"{tmp}/r")
        proc = subprocess.Popen(
            [
                *CLI,
                "kubelet-plugin",
                "--node-name=n1",
                "--gpus=simulated:H200x1",
                f"--kubeconfig={kubeconfig}",
                f"--plugin-dir={tmp}/p",
                f"--registry-dir={tmp}/r",
                f"--cdi-root={tmp}/cdi",
                f"--state-dir={tmp}/s",
                "--publish-interval=3600",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while not paths.registration.exists() and time.monotonic() < deadline:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.1)
            kubelet = kubelet_connect(paths)
            assert kubelet.info.endpoint == str(paths.dra)
            kubelet.channel.close()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        assert not paths.registration.exists()
        assert not paths.dra.exists()
        stderr = proc.stderr.read() if proc.stderr else ""
        assert "plugin stopped; sockets removed" in stderr


def test_render_slices_bad_node_name_is_a_clear_error() -> None:
    out = subprocess.run(
        [*CLI, "render-slices", "--node", "Bad_Node", "--gpus", "simulated:H200x1"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "node name 'Bad_Node' is not a DNS subdomain" in out.stderr
