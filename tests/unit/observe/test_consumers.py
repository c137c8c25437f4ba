"""A claim's consumers: the consumer gate (a createRuntime hook run here as runc runs it)
admits at most ``maxConsumers`` running containers of a claim and records them; the watch reads
the records back, the claim status lists them, and a root container gets a warning and a
``NonRootClients=False`` condition."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import structlog

from dra_driver.enforce.rules.hooks import consumer_gate_hook
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.model.plans import ClaimPlan, DevicePlan
from dra_driver.model.vocabulary import Tier
from dra_driver.observe.claimstatus import ROOT_CONDITION_TYPE, Enforcement, device_status
from dra_driver.observe.consumers import (
    STALE_AFTER_S,
    ClaimConsumers,
    Consumer,
    ConsumerWatch,
    parse_record,
    process_start,
    root_containers,
)
from tests.support import claimfactory as cf
from tests.support.apiserver_stub import ClaimStatusServer
from tests.support.node import NODE
from tests.support.ocistate import oci_state
from tests.unit.observe.test_claimstatus import prepared, writer

UID = "0a000000-0000-4000-8000-00000000000a"
ADVICE = "each may hold 8945 MiB of its 17891 MiB ceiling on GPU 0; raise maxConsumers"


def plan_of(node: Any, admin: bool = False) -> ClaimPlan:
    share = node.share(1, "quarter")
    if admin:
        share["adminAccess"] = True
    (plan,) = prepared(node, [cf.claim([share], uid=UID)])
    return plan


@contextlib.contextmanager
def container_process() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing in for a container's init process (what the OCI state's pid names)."""
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def run_gate(
    record_dir: Path,
    bundle: Path,
    container: str,
    uid: int,
    pid: int,
    max_consumers: int = 1,
    pod: str = "pod-a",
    state: dict[str, Any] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the consumer gate as runc runs a createRuntime hook: OCI state on stdin."""
    bundle.mkdir(parents=True, exist_ok=True)
    config = {"ociVersion": "1.1.0", "process": {"user": {"uid": uid, "gid": uid}, "args": ["sh"]}}
    (bundle / "config.json").write_text(json.dumps(config, separators=(",", ":")))
    hook = consumer_gate_hook(str(record_dir), max_consumers, "team-a/shared", ADVICE)
    if state is None:
        state = oci_state(container, pid, bundle, pod)
    return subprocess.run(
        [hook.path, *hook.args[1:]], input=json.dumps(state), text=True, timeout=30,
        capture_output=True,
    )  # fmt: skip


def test_parse_record_reads_new_and_old_records() -> None:
    assert parse_record("c1", "1000 42 777 ns/pod/main\n") == Consumer(
        "c1", "1000", 42, "777", "ns/pod/main"
    )
    assert parse_record("c2", "0\n") == Consumer("c2", "0")
    assert root_containers([parse_record("a", "0\n"), parse_record("b", "1000 1 2 x")]) == ["a"]


def test_process_start_counts_fields_after_the_command_name(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    fields = " ".join(str(n) for n in range(3, 30))
    (tmp_path / "7" / "stat").write_text(f"7 (a) b (c) {fields}\n")
    assert process_start(tmp_path, 7) == "22"
    assert process_start(tmp_path, 8) is None


def test_the_gate_admits_max_consumers_and_refuses_the_next(tmp_path: Path) -> None:
    users = tmp_path / "users" / UID
    with container_process() as one, container_process() as two, container_process() as three:
        assert run_gate(users, tmp_path / "b1", "c1", 1000, one.pid, 2, "pod-a").returncode == 0
        assert run_gate(users, tmp_path / "b2", "c2", 1000, two.pid, 2, "pod-b").returncode == 0
        refused = run_gate(users, tmp_path / "b3", "c3", 1000, three.pid, 2, "pod-c")
        assert refused.returncode == 1
        assert refused.stderr.strip() == (
            "gpu-fraction.dra.dev: claim team-a/shared already has 2 running consumer(s) "
            f"(team-a/pod-a/main team-a/pod-b/main) and allows 2 at once: {ADVICE}"
        )
        assert sorted(p.name for p in users.iterdir() if not p.name.startswith(".")) == [
            "c1",
            "c2",
        ]
        start = process_start(Path("/proc"), one.pid)
        assert (users / "c1").read_text() == f"1000 {one.pid} {start} team-a/pod-a/main\n"


def test_a_consumer_that_ended_makes_room_and_its_record_goes(tmp_path: Path) -> None:
    users = tmp_path / "users" / UID
    with container_process() as two:
        with container_process() as one:
            assert run_gate(users, tmp_path / "b1", "c1", 1000, one.pid).returncode == 0
            assert run_gate(users, tmp_path / "b2", "c2", 1000, two.pid).returncode == 1
        assert run_gate(users, tmp_path / "b2", "c2", 1000, two.pid).returncode == 0
    assert not (users / "c1").exists() and (users / "c2").is_file()


def test_a_reused_pid_is_no_running_consumer(tmp_path: Path) -> None:
    users = tmp_path / "users" / UID
    users.mkdir(parents=True)
    with container_process() as other, container_process() as new:
        (users / "old").write_text(f"1000 {other.pid} 1 team-a/gone/main\n")  # wrong start time
        assert run_gate(users, tmp_path / "b", "c1", 1000, new.pid).returncode == 0
    assert not (users / "old").exists()


def test_a_consumer_that_renames_itself_with_a_newline_still_counts(tmp_path: Path) -> None:
    """Found by review: a process name with a newline cut the first line of its stat, the gate
    read no start time, took the consumer for ended and admitted one more than allowed."""
    users = tmp_path / "users" / UID
    rename = "import ctypes, sys, time; ctypes.CDLL(None).prctl(15, b'a) \\nb', 0, 0, 0); "
    rename += "print(flush=True); time.sleep(300)"
    proc = subprocess.Popen([sys.executable, "-c", rename], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline()
        assert "\n" in Path(f"/proc/{proc.pid}/comm").read_text()[:-1]
        users.mkdir(parents=True)
        (users / "c1").write_text(f"1000 {proc.pid} 1 team-a/pod-a/main\n")
        with container_process() as two:
            refused = run_gate(users, tmp_path / "b2", "c2", 1000, two.pid, 1, "pod-b")
        assert refused.returncode == 1 and "team-a/pod-a/main" in refused.stderr
        assert (users / "c1").exists()
    finally:
        proc.kill()
        proc.wait()


def test_a_container_already_admitted_passes_again(tmp_path: Path) -> None:
    """Each device of a claim carries the gate: a container with two devices runs it twice."""
    users = tmp_path / "users" / UID
    with container_process() as one:
        assert run_gate(users, tmp_path / "b1", "c1", 1000, one.pid).returncode == 0
        assert run_gate(users, tmp_path / "b1", "c1", 1000, one.pid).returncode == 0


def test_the_gate_reads_runcs_compact_state_and_keeps_only_safe_names(tmp_path: Path) -> None:
    """runc writes the state without spaces (the other tests: with); a name with characters
    outside ``A-Za-z0-9_.-`` is left out of the record rather than written."""
    users = tmp_path / "users" / UID
    with container_process() as one:
        # runc allows + in IDs; a pod name outside A-Za-z0-9_.+- is left out
        state = oci_state("c+1", one.pid, tmp_path / "b1", "a b;$(touch x)")
        bundle = tmp_path / "b1"
        bundle.mkdir()
        (bundle / "config.json").write_text('{"process":{"user":{"uid":0,"gid":0}}}')
        hook = consumer_gate_hook(str(users), 1, "team-a/shared", ADVICE)
        done = subprocess.run(
            [hook.path, *hook.args[1:]], input=json.dumps(state, separators=(",", ":")),
            text=True, capture_output=True, timeout=30, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        start = process_start(Path("/proc"), one.pid)
        assert (users / "c+1").read_text() == f"0 {one.pid} {start} team-a//main\n"
        assert not (tmp_path / "x").exists()


def test_an_unreadable_state_is_refused(tmp_path: Path) -> None:
    done = run_gate(tmp_path / "u", tmp_path / "b", "c", 1000, 1, state={"id": "c"})
    assert done.returncode == 1
    assert "cannot read the OCI state of the container" in done.stderr


def test_concurrent_creations_admit_exactly_max(tmp_path: Path) -> None:
    users = tmp_path / "users" / UID
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(container_process()) for _ in range(6)]
        with ThreadPoolExecutor(6) as pool:
            results = list(
                pool.map(
                    lambda i: (
                        run_gate(
                            users, tmp_path / f"b{i}", f"c{i}", 1000, procs[i].pid, 2, f"p{i}"
                        ).returncode
                    ),
                    range(6),
                )
            )
    assert sorted(results) == [0, 0, 1, 1, 1, 1]


def test_the_watch_reports_running_consumers_and_warns_about_root_once(
    node: Any, tmp_path: Path
) -> None:
    plan = plan_of(node)
    seen: list[ClaimConsumers] = []
    watch = ConsumerWatch(tmp_path / "users", lambda p, c: seen.append(c))
    users = tmp_path / "users" / UID
    with container_process() as one, container_process() as two:
        assert run_gate(users, tmp_path / "b1", "nonroot", 1000, one.pid, 4).returncode == 0
        found = watch.check([plan])
        assert [c.who for c in found[UID].running] == ["team-a/pod-a/main"]
        assert found[UID].root == () and len(seen) == 1
        assert run_gate(users, tmp_path / "b2", "rootctr", 0, two.pid, 4, "pod-r").returncode == 0
        with structlog.testing.capture_logs() as logs:
            assert watch.check([plan])[UID].root == ("rootctr",)
            watch.check([plan])  # nothing new: no second report, no second warning
        assert len(seen) == 2
        (warning,) = [e for e in logs if e["log_level"] == "warning"]
        assert warning["claim_uid"] == UID and warning["containers"] == ["rootctr"]
        assert "runs as root on an MPS GPU" in warning["event"]
    assert watch.check([plan])[UID].running == ()  # both ended
    assert len(seen) == 3


def test_admin_access_claims_are_no_mps_clients(node: Any, tmp_path: Path) -> None:
    plan = plan_of(node, admin=True)
    with container_process() as one:
        run_gate(tmp_path / "users" / UID, tmp_path / "b", "rootctr", 0, one.pid)
        assert ConsumerWatch(tmp_path / "users").check([plan]) == {}


def test_records_of_claims_no_longer_prepared_are_removed_once_stale(tmp_path: Path) -> None:
    now = [1_000_000.0]
    watch = ConsumerWatch(tmp_path / "users", clock=lambda: now[0])
    with container_process() as one:
        run_gate(tmp_path / "users" / UID, tmp_path / "b", "c", 0, one.pid)
    os.utime(tmp_path / "users" / UID, (now[0], now[0]))
    (tmp_path / "users" / "not-a-uid").mkdir()
    watch.check([])
    assert (tmp_path / "users" / UID).is_dir()  # fresh: its claim may be being prepared
    now[0] += STALE_AFTER_S + 1
    watch.check([])
    assert not (tmp_path / "users" / UID).exists()
    assert (tmp_path / "users" / "not-a-uid").is_dir()  # not ours to remove


@pytest.fixture
def api() -> Any:
    with ClaimStatusServer() as server:
        yield server


def test_the_claim_status_lists_consumers_and_says_one_runs_as_root(node: Any, api: Any) -> None:
    claim = cf.on_node(cf.claim([node.share(1, "quarter")]), NODE)
    (plan,) = prepared(node, [copy.deepcopy(claim)])
    api.add(claim)
    w = writer(api, plan)
    assert w.write(plan) == "written"
    key = (claim["metadata"]["namespace"], claim["metadata"]["name"])
    device = api.claims[key]["status"]["devices"][0]
    assert [c["type"] for c in device["conditions"]] == ["FractionEnforced"]
    limit = device["data"]["memory"]["limit"]
    assert device["data"]["consumers"] == {
        "max": 1,
        "each": {"request": device["data"]["memory"]["request"], "limit": limit},
        "running": [],
    }
    running = (Consumer("rootctr", "0", 5, "9", "team-a/p/main"),)
    w.observe(plan, ClaimConsumers(running, ("rootctr",)))
    assert w.write(plan) == "written"
    device = api.claims[key]["status"]["devices"][0]
    assert device["data"]["consumers"]["running"] == ["team-a/p/main"]
    root = next(c for c in device["conditions"] if c["type"] == ROOT_CONDITION_TYPE)
    assert root["status"] == "False" and root["reason"] == "ContainerRunsAsRoot"
    assert "runAsNonRoot" in root["message"]


def test_each_consumer_holds_its_share_of_the_ceiling() -> None:
    gpu = SimulatedGpuSource("simulated:H200x1", seed="n").discover().gpus[0]
    mib = 1 << 20
    d = DevicePlan(
        ("gpu",), "n", "gpu-0-time-slicing", "s", gpu, "time-slicing", 3 * mib, 10 * mib, None,
        max_consumers=3,
    )  # fmt: skip
    entry = device_status(d, "drv", Enforcement(Tier.HARD), "t", 100, consumers=["b", "a"])
    assert entry["data"]["consumers"] == {
        "max": 3,
        "each": {"request": "1Mi", "limit": "3Mi"},
        "running": ["a", "b"],
    }


def test_a_claim_without_mps_gets_no_root_condition_and_no_consumers() -> None:
    gpu = SimulatedGpuSource("simulated:H200x1", seed="n").discover().gpus[0]
    d = DevicePlan(("gpu",), "n", "gpu-0-time-slicing", "s", gpu, "time-slicing", 1, 1, None)
    entry = device_status(d, "drv", Enforcement(Tier.NONE), "t", 100, runs_as_root=True)
    assert [c["type"] for c in entry["conditions"]] == ["FractionEnforced"]
    assert "consumers" not in entry["data"]


def test_devices_count_their_own_consumers_and_the_watch_lists_each_container_once(
    node: Any, tmp_path: Path
) -> None:
    """Extended resources give each container its own request of one claim: two containers
    on two devices are two devices' single consumers, not two consumers of one device."""
    plan = plan_of(node)
    users = tmp_path / "users" / UID
    with container_process() as one, container_process() as two:
        assert run_gate(users / "dev-a", tmp_path / "b1", "c1", 1000, one.pid).returncode == 0
        assert run_gate(users / "dev-b", tmp_path / "b2", "c2", 1000, two.pid).returncode == 0
        assert run_gate(users / "dev-b", tmp_path / "b1", "c1", 1000, one.pid).returncode == 1
        assert run_gate(users / "dev-a", tmp_path / "b1", "c1", 1000, one.pid).returncode == 0
        found = ConsumerWatch(tmp_path / "users").check([plan])[UID]
        assert [c.container_id for c in found.running] == ["c1", "c2"]
