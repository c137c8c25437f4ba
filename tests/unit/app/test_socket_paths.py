"""Unix socket paths stay within the kernel's limit: ``sockaddr_un.sun_path`` is 108 bytes
including the NUL, so 107 usable (unix(7)). MPS binds ``<pipe dir>/control`` for its daemon,
each server and each namespace (NVIDIA MPS docs, "MPS v3 Namespaces"); the plugin binds its
registration and DRA sockets (issue 10, item 12)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.app.sockets import SUN_PATH_MAX, check_socket_paths, socket_paths
from dra_driver.enforce.rules.edits import namespace_pipe_dir
from dra_driver.enforce.rules.targets import MpsOptions, targets_for_claim
from dra_driver.kubelet.server import SocketPaths
from tests.support.fakes.plans import GIB, device, gpu, plan

UID = "ffffffff-ffff-4fff-8fff-ffffffffffff"
DEFAULTS = SocketPaths.for_driver(
    DEFAULT_DRIVER_NAME, "/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", UID
)


def test_multi_gpu_claim_namespace_socket_fits_under_the_default_root() -> None:
    """A claim on two GPUs gets its own server m_<uid>; its namespace's socket must fit."""
    p = plan(device(gpu(0), GIB), device(gpu(1), GIB, name="gpu-1-part-0"), uid=UID)
    targets = targets_for_claim(p, {gpu(0).uuid: "hard", gpu(1).uuid: "hard"})
    assert all(t.dedicated for t in targets)
    control = namespace_pipe_dir(targets[0], MpsOptions()) + "/control"
    assert len(control.encode()) <= SUN_PATH_MAX, control


def test_every_socket_of_the_default_layout_fits() -> None:
    paths = socket_paths(DEFAULTS, MpsOptions(), range(16))
    assert max(len(p.encode()) for p, _ in paths) <= SUN_PATH_MAX
    check_socket_paths(DEFAULTS, MpsOptions(), range(16))  # does not raise
    names = {Path(p).parent.name for p, _ in paths}
    assert {"pipe", "gpu_15", "claim"} <= names  # daemon, server, claim-server namespace
    assert any(n.startswith("c_") for n in names)


def test_longest_path_is_named_with_the_limit() -> None:
    root = "/" + "r" * 79
    with pytest.raises(ValueError) as err:
        check_socket_paths(DEFAULTS, MpsOptions(root=root), range(8))
    longest = max((p for p, _ in socket_paths(DEFAULTS, MpsOptions(root=root), range(8))), key=len)
    message = str(err.value)
    assert "\n" not in message
    assert f"{longest} would be {len(longest)} bytes" in message
    assert "107" in message and "--mps-root" in message


def _run_plugin(tmp: str, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "dra_driver", "kubelet-plugin", "--node-name=n1"]
    argv += ["--gpus=simulated:H200x1", f"--state-dir={tmp}/s", f"--cdi-root={tmp}/cdi"]
    return subprocess.run([*argv, *flags], capture_output=True, text=True, timeout=60)


@pytest.mark.integration  # starts a real process
@pytest.mark.parametrize(
    ("flag", "origin"),
    [("--mps-root", "--mps-root"), ("--plugin-dir", "--plugin-dir")],
)
def test_too_long_paths_are_refused_at_start_up(flag: str, origin: str) -> None:
    with tempfile.TemporaryDirectory(prefix="dras-") as tmp:
        long_dir = tmp + "/" + "x" * (80 - len(tmp) - 1)
        assert len(long_dir) == 80
        others = {
            "--mps-root": f"{tmp}/run",
            "--plugin-dir": f"{tmp}/p",
            "--registry-dir": f"{tmp}/r",
        }
        others[flag] = long_dir
        done = _run_plugin(tmp, *(f"{k}={v}" for k, v in others.items()))
        assert done.returncode == 2, done.stderr[-2000:]
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("error: cannot start the kubelet plugin: unix socket path ")
        assert long_dir in line and "107" in line and origin in line
        assert not Path(long_dir).exists()  # nothing was created under the refused path
