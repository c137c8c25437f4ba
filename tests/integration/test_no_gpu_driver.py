"""A node without its GPU driver (NVIDIA/k8s-driver-manager#213,
kubernetes-sigs/dra-driver-nvidia-gpu#1144): after a reboot the NVIDIA driver is not loaded yet
while the kubelet still has claims to unprepare. A plugin that exits when NVML cannot start
answers no ``NodeUnprepareResources``, the pods stay Terminating and the driver install waits
on them.

The real plugin process (``dra-driver kubelet-plugin --gpus=simulated:H200x2``) is started with
the simulated node's ``driver-unloaded`` file, which makes discovery fail with NVML's own
``Driver Not Loaded`` error. It must start and register, unprepare the claim it prepared
before, refuse a new claim saying why, record why for ``dra-driver status``, and, once the
driver answers again, stop with exit code 3 so that the kubelet starts it afresh with its GPUs.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.app.plugin import RESTART_EXIT_CODE
from dra_driver.gpus.simnode import DRIVER_UNLOADED
from tests.integration.test_cli import CLI
from tests.integration.test_crash_kill import (
    DEVICES,
    Plugin,
    _errors,
    _prepare,
    _unprepare,
)
from tests.support import claimfactory as cf
from tests.support.apiserver_stub import ClaimServer
from tests.support.crashcheck import ABSENT, PREPARED
from tests.support.node import NODE, share_result

pytestmark = pytest.mark.integration


def status(root: Path) -> dict[str, object]:
    done = subprocess.run(
        [*CLI, "status", f"--state-dir={root}/s"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    doc: dict[str, object] = json.loads(done.stdout)
    return doc


@pytest.fixture
def root() -> Iterator[Path]:
    """A short directory: MPS socket paths below it must fit the kernel's 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="nodrv-") as d:
        yield Path(d)


def test_without_its_driver_the_plugin_unprepares_refuses_and_restarts_once_it_is_back(
    root: Path,
) -> None:
    tmp_path = root
    gpu0 = DEVICES["gpu-0-time-slicing"]
    before = cf.claim([share_result(gpu0, NODE, "quarter")])
    after = cf.claim([share_result(gpu0, NODE, "eighth")])
    with ClaimServer() as api:
        for c in (before, after):
            api.add(c)
        plugin = Plugin(tmp_path, api)
        plugin.launch()
        assert _errors(_prepare(plugin.ready(), [before]).result()) == {}
        assert plugin.proc is not None
        plugin.proc.terminate()
        assert plugin.proc.wait(timeout=30) == 0
        assert status(tmp_path)["gpuDriver"] == {
            "available": True,
            "problem": None,
            "since": status(tmp_path)["gpuDriver"]["since"],  # type: ignore[index]
        }

        marker = tmp_path / "s" / "simulated" / DRIVER_UNLOADED
        marker.touch()  # the node rebooted; the NVIDIA driver is not loaded yet
        plugin.launch()
        kubelet = plugin.ready()  # started and registered
        refused = _errors(_prepare(kubelet, [after]).result())
        problem = refused[after["metadata"]["uid"]]
        assert "this node offers no GPU now" in problem and "Driver Not Loaded" in problem
        assert plugin.state(after["metadata"]["uid"]) == ABSENT
        assert plugin.state(before["metadata"]["uid"]) == PREPARED
        assert _errors(_unprepare(kubelet, [before]).result()) == {}
        assert plugin.state(before["metadata"]["uid"]) == ABSENT
        driver = status(tmp_path)["gpuDriver"]
        assert isinstance(driver, dict) and driver["available"] is False
        assert "Driver Not Loaded" in driver["problem"]
        assert plugin.proc is not None and plugin.proc.poll() is None  # still serving

        marker.unlink()  # the driver is loaded
        started = time.monotonic()
        assert plugin.proc.wait(timeout=60) == RESTART_EXIT_CODE
        back = time.monotonic() - started
        log = plugin.log.read_text()
        assert "stopping the plugin to start afresh" in log
        plugin.launch()  # what the kubelet does with the container
        assert _errors(_prepare(plugin.ready(), [after]).result()) == {}
        assert plugin.state(after["metadata"]["uid"]) == PREPARED
        assert status(tmp_path)["gpuDriver"]["available"] is True  # type: ignore[index]
        print(f"\nNO-DRIVER | driver back -> plugin stopped to restart after {back:.1f} s")
        plugin.proc.terminate()
        plugin.proc.wait(timeout=30)
