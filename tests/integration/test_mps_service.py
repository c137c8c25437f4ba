"""The MPS node service (``dra-driver mps-service``) and its client, the enforcer, as real
processes over the MPS emulator: the enforcer never starts a daemon; a tenant's server survives
a new enforcer (a plugin restart); a daemon killed is restarted by the service (a new
generation) and the enforcer's health check re-applies the claim; the restarted daemon serves
the claims' namespaces with their limits from its start (its -a file declares them); a killed
server of one GPU leaves the other GPUs' tenants and claims alone; while the service is down
every MPS GPU is reported unhealthy, with a message naming the service, and a claim fails at
once, naming it too; once the service is back, the GPUs recover on their own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.enforce import MpsError
from dra_driver.enforce.enforcer import MpsEnforcer, MpsOptions
from dra_driver.enforce.mps.simnvml import SimulatedNvml
from dra_driver.enforce.mpsservice.readiness import read_state, state_path
from dra_driver.enforce.rules.outages import SERVER_RESTARTED, MpsOutage
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.infra.runner import SubprocessRunner
from dra_driver.model.plans import ClaimPlan
from dra_driver.mpsemu.paths import emulator_path
from tests.support.fakes.plans import GIB, device, plan
from tests.support.mpsemu import Probe, alive, private_root, wait_for

pytestmark = pytest.mark.integration

NODE = "n1"
GPUS = "simulated:H200x2"
UID_A = "0a000000-0000-4000-8000-00000000000a"
UID_B = "0b000000-0000-4000-8000-00000000000b"
UID_C = "0c000000-0000-4000-8000-00000000000c"
NS_A = "c_" + UID_A.replace("-", "_")


@pytest.fixture
def root() -> Iterator[Path]:
    with private_root() as path:
        yield path


def start_service(root: Path) -> subprocess.Popen[bytes]:
    log = (root / "service.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "dra_driver", "mps-service", f"--node-name={NODE}",
         f"--gpus={GPUS}", f"--mps-root={root}/run", "--interval=0.2", "--log-format=console"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip


def ready(root: Path, generation_above: int = 0) -> dict[str, object] | None:
    """The readiness file's JSON once both daemons run (and the generation passed a value)."""
    try:
        doc: dict[str, object] = json.loads(state_path(root / "run/mps").read_text())
    except (OSError, ValueError):
        return None
    daemons = doc.get("daemons") or {}
    done = len(daemons) == 2 and int(str(doc["generation"])) > generation_above  # type: ignore[arg-type]
    return doc if done and not doc.get("stopping") else None


def enforcer(root: Path) -> MpsEnforcer:
    """The plugin's enforcer as a new plugin process makes it (service mode, simulated NVML)."""
    gpus = SimulatedGpuSource(GPUS, seed=NODE).discover().gpus
    options = MpsOptions(
        root=str(root / "run"),
        control_binary=str(emulator_path()),
        cgroup_root=str(root / "cgroup"),
        service=True,
        dmem_backend=False,
        command_timeout=20,
        server_checks=100,
        server_check_interval=0.05,
    )
    nvml = SimulatedNvml(root / "nvml", lambda: [g.uuid for g in gpus])
    return MpsEnforcer({g.uuid: "hard" for g in gpus}, nvml, SubprocessRunner(), options)


def test_the_service_outlives_its_client_and_its_daemons(root: Path) -> None:
    service = start_service(root)
    first_state = wait_for("the service's daemons", lambda: ready(root), 30)
    gpu0 = SimulatedGpuSource(GPUS, seed=NODE).discover().gpus[0]
    claim = plan(device(gpu0, 10 * GIB, 10 * GIB), uid=UID_A)

    # a plugin applies a claim; its tenant attaches
    edits = enforcer(root).apply(claim)
    [mount] = next(iter(edits.values())).mounts
    tenant = Probe(Path(mount.host_path))
    first = tenant.wait_line(lambda f: f.get("state") == "connected", 10)
    assert first["pinned_memory_limit"] == "10G"

    # a new plugin (restart): restore leaves the tenant on its server
    seen = len(tenant.lines)
    plugin = enforcer(root)
    plugin.restore([claim])
    assert plugin.check_health()[gpu0.uuid].healthy
    wait_for("two more probe lines", lambda: len(tenant.lines) >= seen + 2, 10)
    assert all(f.get("server_pid") == first["server_pid"] for f in tenant.lines[seen:])

    # the service restarts a daemon that dies; the health check re-applies the claim
    state = read_state(state_path(root / "run/mps"))
    daemon = state.daemons["time-slicing"]
    os.kill(daemon.pid, signal.SIGKILL)
    tenant.wait_line(lambda f: f.get("state") == "lost", 10, after=seen)
    after = wait_for(
        "the daemon restarted by the service",
        lambda: ready(root, generation_above=int(str(first_state["generation"]))),
        30,
    )
    assert after["daemons"]["time-slicing"]["restarts"] == 1  # type: ignore[index]
    wait_for("the claim re-applied", lambda: plugin.check_health()[gpu0.uuid].healthy, 20)
    # the tenant keeps retrying, and may attach between the re-apply's namespace create and
    # its limits: the enforcer ends such a connection (enforce/mps/objects.py, first_limits), and
    # the tenant attaches again under the limits; wait for that one
    again = tenant.wait_line(
        lambda f: (
            f.get("state") == "connected"
            and f.get("server_pid") != first["server_pid"]
            and f.get("pinned_memory_limit") == "10G"
        ),
        15,
        after=seen,
    )
    lines = tenant.lines[seen:]
    end = lines.index(again)
    for i, early in enumerate(lines[:end]):
        if early.get("state") == "connected" and early.get("pinned_memory_limit") != "10G":
            assert any(x.get("state") in ("terminated", "lost") for x in lines[i + 1 : end])

    # the service stops: its daemons and servers end, every MPS GPU is unhealthy, a new
    # claim fails at once naming the service
    service.send_signal(signal.SIGTERM)
    assert service.wait(timeout=30) == 0
    assert read_state(state_path(root / "run/mps")).stopping
    server = int(again["server_pid"])
    wait_for("the servers to end", lambda: not alive(server), 10)
    health = plugin.check_health()
    assert len(health) == 2 and not any(h.healthy for h in health.values())
    assert all("MPS service not ready" in h.detail for h in health.values())
    gpu1 = SimulatedGpuSource(GPUS, seed=NODE).discover().gpus[1]
    with pytest.raises(MpsError, match="MPS service not ready on this node"):
        plugin.apply(plan(device(gpu1, 5 * GIB, 5 * GIB), uid=UID_B))

    # back: the GPUs recover by themselves, and the tenant gets its limits again
    service = start_service(root)
    wait_for("the new service's daemons", lambda: ready(root), 30)
    wait_for("healthy GPUs", lambda: all(h.healthy for h in plugin.check_health().values()), 20)
    tenant.wait_line(
        lambda f: f.get("state") == "connected" and f.get("server_pid") != again["server_pid"],
        15,
    )
    assert tenant.stop() == 0
    service.send_signal(signal.SIGTERM)
    assert service.wait(timeout=30) == 0


def test_a_daemon_restarted_by_the_service_serves_the_claims_namespaces_from_its_start(
    root: Path,
) -> None:
    """The restarted daemon's -a file declares the claim's server and namespace with its
    limits: they exist when the service reports the daemon ready, with no health check run,
    and the tenant, retrying all along, never attaches without its limits."""
    service = start_service(root)
    first_state = wait_for("the service's daemons", lambda: ready(root), 30)
    gpu0 = SimulatedGpuSource(GPUS, seed=NODE).discover().gpus[0]
    plugin = enforcer(root)
    [mount] = next(
        iter(plugin.apply(plan(device(gpu0, 6 * GIB, 10 * GIB), uid=UID_A)).values())
    ).mounts
    tenant = Probe(Path(mount.host_path))
    first = tenant.wait_line(lambda f: f.get("state") == "connected", 10)
    assert first["pinned_memory_limit"] == "10G"

    seen = len(tenant.lines)
    daemon = read_state(state_path(root / "run/mps")).daemons["time-slicing"]
    os.kill(daemon.pid, signal.SIGKILL)
    wait_for(
        "the daemon restarted by the service",
        lambda: ready(root, generation_above=int(str(first_state["generation"]))),
        30,
    )
    [row] = plugin.daemons["time-slicing"].control.namespace_list("gpu_0", NS_A)
    assert (row.pinned_memory_limit, row.active_thread_percentage) == ("10G", "100")
    again = tenant.wait_line(
        lambda f: f.get("state") == "connected" and f.get("server_pid") != first["server_pid"],
        15,
        after=seen,
    )
    assert again["pinned_memory_limit"] == "10G"
    attaches = [f for f in tenant.lines[seen:] if f.get("state") == "connected"]
    assert {f["pinned_memory_limit"] for f in attaches} == {"10G"}, tenant.raw[seen:]
    assert tenant.stop() == 0
    service.send_signal(signal.SIGTERM)
    assert service.wait(timeout=30) == 0


def test_a_fatal_fault_of_one_gpus_server_leaves_other_gpus_alone(root: Path) -> None:
    """SIGKILL of GPU 0's server: the tenant of GPU 1 keeps its server process, a new claim on
    GPU 1 prepares at once, and the health check reports the outage of GPU 0's claim only,
    whose tenant gets its limits again from the re-created server."""
    service = start_service(root)
    wait_for("the service's daemons", lambda: ready(root), 30)
    gpu0, gpu1 = SimulatedGpuSource(GPUS, seed=NODE).discover().gpus
    plugin = enforcer(root)
    reported: list[MpsOutage] = []
    plugin.report_outages(reported.extend)

    def tenant_of(claim: ClaimPlan) -> Probe:
        [mount] = next(iter(plugin.apply(claim).values())).mounts
        return Probe(Path(mount.host_path))

    on0 = tenant_of(plan(device(gpu0, 8 * GIB), uid=UID_A))
    on1 = tenant_of(plan(device(gpu1, 8 * GIB), uid=UID_B))
    first0, first1 = (t.wait_line(lambda f: f.get("state") == "connected", 10) for t in (on0, on1))
    assert plugin.check_health()[gpu0.uuid].healthy and reported == []

    seen0, seen1 = len(on0.lines), len(on1.lines)
    os.kill(int(first0["server_pid"]), signal.SIGKILL)
    on0.wait_line(lambda f: f.get("state") == "lost", 10, after=seen0)
    started = time.monotonic()
    plugin.apply(plan(device(gpu1, 4 * GIB), uid=UID_C))
    assert time.monotonic() - started < 10  # ~1 s; 2 shared cores under load take longer
    wait_for("two more lines of GPU 1's tenant", lambda: len(on1.lines) >= seen1 + 2, 10)
    assert {f.get("server_pid") for f in on1.lines[seen1:]} == {first1["server_pid"]}
    assert {f.get("state") for f in on1.lines[seen1:]} == {"same"}

    health = plugin.check_health()
    assert health[gpu0.uuid].healthy and health[gpu1.uuid].healthy
    [outage] = reported
    assert (outage.claim.uid, outage.reason, outage.server) == (UID_A, SERVER_RESTARTED, "gpu_0")
    assert outage.old_pid == int(first0["server_pid"]) and outage.new_pid != outage.old_pid
    # the health check re-created the server with "server create" and the namespace with
    # "namespace create" + "namespace set" (no daemon restart, so no -a file): a tenant that
    # attached in between is ended by the enforcer (objects.py, first_limits) and attaches again
    again = on0.wait_line(
        lambda f: f.get("state") == "connected" and f.get("pinned_memory_limit") == "8G",
        15,
        after=seen0,
    )
    assert again["server_pid"] == str(outage.new_pid)
    lines = on0.lines[seen0:]
    end = lines.index(again)
    for i, early in enumerate(lines[:end]):
        if early.get("state") == "connected":
            assert any(x.get("state") in ("terminated", "lost") for x in lines[i + 1 : end])
    assert on0.stop() == 0 and on1.stop() == 0
    service.send_signal(signal.SIGTERM)
    assert service.wait(timeout=30) == 0
