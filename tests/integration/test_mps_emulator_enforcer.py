"""The driver's MPS enforcer against the MPS emulator (real daemon, server and tenant
processes; NVML stays a fake): a claim's namespace reaches a tenant with its limits, a daemon
crash is repaired by the health check and the tenant gets the same limits from the new server,
and release terminates the tenant and leaves nothing running; a claim that floods its server's
client table is cut back to its cap in one client check, and its neighbour gets in."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.enforce.enforcer import MpsEnforcer, MpsOptions
from dra_driver.enforce.mps.simnvml import SimulatedNvml
from dra_driver.enforce.rules.base import ClientTermination
from dra_driver.infra.runner import SubprocessRunner
from dra_driver.model.gpu import Gpu
from dra_driver.model.plans import ClaimRef
from dra_driver.mpsemu.paths import emulator_path
from dra_driver.observe.accounting import FractionUsage, fraction_rows, normalized_sm
from dra_driver.observe.usage import MpsUsageSource
from tests.support.fakes.mps_control import FakeNvml
from tests.support.fakes.plans import GIB, device, gpu, plan
from tests.support.mpsemu import HeldClients, Probe, alive, private_root, wait_for

pytestmark = pytest.mark.integration

UID_A = "0a000000-0000-4000-8000-00000000000a"
UID_B = "0b000000-0000-4000-8000-00000000000b"


@pytest.fixture
def root() -> Iterator[Path]:
    with private_root() as path:
        yield path


def emulated_enforcer(root: Path, g: Gpu, monkeypatch: pytest.MonkeyPatch) -> MpsEnforcer:
    """The real MpsEnforcer on GPU ``g``, with the MPS emulator's daemon as its control
    program (real processes under ``root``)."""
    monkeypatch.setenv("MPS_EMULATOR_VISIBLE_GPUS", g.uuid)
    options = MpsOptions(
        root=str(root / "run"),
        control_binary=str(emulator_path()),
        cgroup_root=str(root / "cgroup"),
        command_timeout=20,
        server_checks=100,
        server_check_interval=0.05,
    )
    return MpsEnforcer(
        {g.uuid: "hard"}, FakeNvml({g.uuid: g.memory_bytes}), SubprocessRunner(), options
    )


def test_claim_reaches_tenant_survives_daemon_crash_and_is_released(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = gpu(0)
    enforcer = emulated_enforcer(root, g, monkeypatch)
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


def test_a_flooding_claim_is_cut_to_its_cap_and_its_neighbour_gets_in(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26, item 2: a tenant's clients fill the GPU server's table (60), so a neighbour
    claim's tenant is refused; one client check terminates the flood's newest clients beyond
    its cap (a quarter of the card: 15), and the neighbour attaches and stays."""
    g = gpu(0, memory_mib=80 * 1024)
    reported: list[tuple[ClaimRef, str, list[int], int]] = []
    enforcer = emulated_enforcer(root, g, monkeypatch)
    enforcer.report_terminations(lambda *call: reported.append(call))
    a = plan(device(g, 20 * GIB), uid=UID_A)
    b = plan(device(g, 10 * GIB), uid=UID_B, name="serve")
    [pipe_a] = [m.host_path for m in enforcer.apply(a)["gpu-0-quarter-0"].mounts]
    [pipe_b] = [m.host_path for m in enforcer.apply(b)["gpu-0-quarter-0"].mounts]
    flood = []
    for _ in range(20):  # 20 processes of one client each, one after the other ...
        flood.append(HeldClients(Path(pipe_a) / "control"))
        assert flood[-1].answered()[0].startswith("WELCOME")
    bulk = HeldClients(Path(pipe_a) / "control", 40)  # ... then one of 40: the table is full
    assert all(line.startswith("WELCOME") for line in bulk.answered())
    neighbour = Probe(Path(pipe_b))
    refused = neighbour.wait_line(lambda f: f.get("state") == "rejected", 10)
    assert "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED" in refused["reason"]

    done = enforcer.check_clients()
    ended = [bulk.pid, *(h.pid for h in reversed(flood[15:]))]  # newest first
    claim_a = ClaimRef("team-a", "train", UID_A)
    assert done == [ClientTermination(claim_a, g.uuid, tuple(ended), 15, "over_claim_cap")]
    assert reported == [(claim_a, g.uuid, ended, 15)]

    # each process hears of its own clients' end on its own connection, in no set order: wait
    # for all 45 notices (waiting for the bulk's alone let a flood process's come after; CI)
    def told() -> int:
        return bulk.terminated() + sum(h.terminated() for h in flood)

    wait_for("the server to tell them", lambda: told() >= 45, 5)
    assert bulk.terminated() == 40
    assert [h.terminated() for h in flood] == [0] * 15 + [1] * 5
    neighbour.wait_line(lambda f: f.get("state") == "connected", 10)  # the flood still holds 15
    clients = enforcer.clients()
    assert sorted(c.pid for c in clients[(UID_A, g.uuid)]) == sorted(h.pid for h in flood[:15])
    assert [c.pid for c in clients[(UID_B, g.uuid)]] == [neighbour.pid]

    seen = len(neighbour.lines)
    assert enforcer.check_clients() == []  # within their caps: the neighbour is never touched
    neighbour.wait_line(lambda f: f.get("state") == "same", 5, after=seen)
    assert all(f.get("state") == "same" for f in neighbour.lines[seen:])
    assert neighbour.stop() == 0
    for h in [*flood, bulk]:
        h.stop()


def test_two_tenants_usage_flows_from_the_emulated_server_to_the_metrics(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27: tenants say what they use (``tenant-probe --use-memory --use-sm``); the
    emulated server holds each to its namespace's limits as MPS would; the simulated NVML
    reports what was granted, and the usage source maps it to claims through their MPS
    clients."""
    g = gpu(0, memory_mib=80 * 1024)
    monkeypatch.setenv("MPS_EMULATOR_VISIBLE_GPUS", g.uuid)
    pipes = [root / "run/mps/time-slicing/pipe", root / "run/mps/sm-sharing/pipe"]
    nvml = SimulatedNvml(root / "nvml", lambda: [g.uuid], pipes)
    options = MpsOptions(
        root=str(root / "run"),
        control_binary=str(emulator_path()),
        cgroup_root=str(root / "cgroup"),
        command_timeout=20,
    )
    enforcer = MpsEnforcer({g.uuid: "hard"}, nvml, SubprocessRunner(), options)
    a = plan(device(g, 20 * GIB), uid=UID_A, name="train")
    b = plan(device(g, 10 * GIB), uid=UID_B, name="serve")
    pipe_a = Path(enforcer.apply(a)["gpu-0-quarter-0"].mounts[0].host_path)
    pipe_b = Path(enforcer.apply(b)["gpu-0-quarter-0"].mounts[0].host_path)
    probes = [
        Probe(pipe_a, args=["--use-memory", "2Gi", "--use-sm", "40"]),
        Probe(pipe_b, args=["--use-memory", "11Gi", "--use-sm", "30"]),  # past its 10G limit
        Probe(pipe_b, args=["--use-memory", "1Gi", "--use-sm", "10"]),
    ]
    try:
        got = [p.wait_line(lambda f: f.get("state", "").startswith("us"), 10) for p in probes]
        assert (got[0]["state"], got[0]["used_memory"], got[0]["sm"]) == (
            "using",
            str(2 * GIB),
            "40",
        )
        assert got[1]["state"] == "use-refused" and "CUDA_ERROR_OUT_OF_MEMORY" in got[1]["reason"]
        assert (got[2]["state"], got[2]["used_memory"]) == ("using", str(GIB))
        usage = MpsUsageSource(enforcer, nvml).snapshot([a, b])
        assert usage[(UID_A, g.uuid)] == FractionUsage(used_bytes=2 * GIB, clients=1, sm_percent=40)
        assert usage[(UID_B, g.uuid)] == FractionUsage(used_bytes=GIB, clients=2, sm_percent=10)
        [row_a, _] = fraction_rows([a, b])
        assert normalized_sm(40, row_a) == 100  # a quarter of the card using 40% of its SMs
    finally:
        for p in probes:
            p.stop()
        enforcer.release(UID_A)
        enforcer.release(UID_B)
