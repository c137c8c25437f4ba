"""The driver's MPS enforcer against the MPS emulator (real daemon, server and tenant
processes; NVML stays a fake): a claim's namespace reaches a tenant with its limits, a daemon
crash is repaired by the health check and the tenant gets the same limits from the new server,
and release terminates the tenant and leaves nothing running."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.enforce.enforcer import MpsEnforcer, MpsOptions
from dra_driver.infra.runner import SubprocessRunner
from dra_driver.mpsemu import emulator_path
from tests.support.fakes.mps_control import FakeNvml
from tests.support.fakes.plans import GIB, device, gpu, plan
from tests.support.mpsemu import Probe, alive, private_root, wait_for

pytestmark = pytest.mark.integration

UID_A = "0a000000-0000-4000-8000-00000000000a"


@pytest.fixture
def root() -> Iterator[Path]:
    with private_root() as path:
        yield path


def test_claim_reaches_tenant_survives_daemon_crash_and_is_released(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = gpu(0)
    monkeypatch.setenv("MPS_EMULATOR_VISIBLE_GPUS", g.uuid)
    options = MpsOptions(
        root=str(root / "run"),
        control_binary=str(emulator_path()),
        cgroup_root=str(root / "cgroup"),
        command_timeout=20,
        server_checks=100,
        server_check_interval=0.05,
    )
    enforcer = MpsEnforcer(
        {g.uuid: "hard"}, FakeNvml({g.uuid: g.memory_bytes}), SubprocessRunner(), options
    )
    edits = enforcer.apply(plan(device(g, 10 * GIB, 20 * GIB), uid=UID_A))
    [mount] = edits["gpu-0-quarter-0"].mounts
    tenant = Probe(Path(mount.host_path))
    first = tenant.wait_line(lambda f: f.get("state") == "connected", 10)
    assert (first["pinned_memory_limit"], first["active_thread_percentage"]) == ("20G", "100")
    assert first["namespace"] == "c_" + UID_A.replace("-", "_")

    pipe = root / "run/mps/time-slicing/pipe"
    seen = len(tenant.lines)
    os.kill(int((pipe / "nvidia-cuda-mps-control.pid").read_text()), signal.SIGKILL)
    tenant.wait_line(lambda f: f.get("state") == "lost", 5, after=seen)
    # The tenant keeps retrying while the health check repairs: it may attach between the
    # repair's "namespace create" and "namespace set", before any limits exist; the enforcer
    # then terminates it before setting the limits (mps/objects.py, first_limits), and it
    # attaches again under them.
    health = enforcer.check_health()
    assert health[g.uuid].healthy and enforcer.daemon_restarts == 1
    again = tenant.wait_line(
        lambda f: (
            f.get("state") == "connected"
            and f.get("server_pid") != first["server_pid"]
            and f.get("pinned_memory_limit") == "20G"
        ),
        10,
        after=seen,
    )
    assert again["server_pid"] != first["server_pid"]
    assert again["active_thread_percentage"] == "100"
    # an attach before the limits (if the tenant was that quick) was ended before the limits
    # were set: the tenant's connection under them is a new one
    lines = tenant.lines[seen:]
    end = lines.index(again)
    for i, early in enumerate(lines[:end]):
        if early.get("state") == "connected":
            assert any(x.get("state") in ("terminated", "lost") for x in lines[i + 1 : end]), lines[
                i:end
            ]
    [[client]] = enforcer.clients().values()
    assert client.pid == tenant.pid

    seen = len(tenant.lines)
    enforcer.release(UID_A)
    tenant.wait_line(lambda f: f.get("state") == "terminated", 5, after=seen)
    assert not pipe.exists()
    server = int(again["server_pid"])
    wait_for("the server to exit", lambda: not alive(server), 5)
    assert tenant.stop() == 0
