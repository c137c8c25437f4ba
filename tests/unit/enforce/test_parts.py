"""Pieces of the MPS enforcer: names, CLI parsing, runner, daemon, hooks, janitor, the fake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.enforce import MpsError
from dra_driver.enforce.janitor import SoftLimitJanitor
from dra_driver.enforce.mps.control import MpsControl
from dra_driver.enforce.mps.daemon import MpsDaemon, config_toml
from dra_driver.enforce.mps.nvmlcontrol import UNLIMITED, CgroupMemory
from dra_driver.enforce.rules.hooks import consumer_gate_hook
from dra_driver.enforce.rules.names import (
    claim_uid_of,
    memory_arg,
    namespace_name,
    parse_memory,
    server_name,
)
from dra_driver.enforce.rules.rows import parse_clients, parse_namespaces, parse_servers
from dra_driver.gpus import MIB
from dra_driver.infra.runner import SubprocessRunner
from tests.support.fakes.mps_control import FakeMpsControl, FakeNvml

GPU = "GPU-11111111-2222-3333-4444-555555555555"

# --- names ------------------------------------------------------------------------------


@given(st.uuids())
def test_namespace_name_round_trip(u: object) -> None:
    uid = str(u)
    name = namespace_name(uid)
    assert len(name) <= 64 and set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789_")
    assert claim_uid_of(name) == uid


def test_names_reject_bad_input() -> None:
    with pytest.raises(MpsError):
        namespace_name("NOT-A-UID")
    with pytest.raises(MpsError):
        server_name(-1)
    assert server_name(7) == "gpu_7"
    assert claim_uid_of("default") is None and claim_uid_of("gpu_0") is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4G", 4 << 30),
        ("512M", 512 << 20),
        ("1024K", 1 << 20),
        ("123", 123),
        ("unlimited", None),
        ("-", None),
        ("2GB", 2 << 30),
        (" 30720M ", 30720 << 20),
    ],
)
def test_parse_memory(text: str, value: int | None) -> None:
    assert parse_memory(text) == value


def test_memory_arg_rounds_down_and_refuses_zero() -> None:
    assert memory_arg(10 * MIB + MIB - 1) == "10M"
    with pytest.raises(MpsError):
        memory_arg(MIB - 1)
    with pytest.raises(MpsError):
        parse_memory("lots")


# --- CLI output parsing -------------------------------------------------------------------


def test_parse_servers_with_device_lists() -> None:
    text = (
        "training,1000,48201,Ready,/run/nvidia-mps/training,GPU-abcd-1234,-\n"
        "multi,0,1,Ready,/p/multi,GPU-a,GPU-b,3\n"
        '"quoted",0,2,Ready,/p/q,"GPU-a,GPU-b",-\n'
        "broken,row\n"
    )
    rows = parse_servers(text)
    assert [r.name for r in rows] == ["training", "multi", "quoted"]
    assert rows[0].allowed_devices == ("GPU-abcd-1234",) and rows[0].status == "Ready"
    assert rows[1].allowed_devices == ("GPU-a", "GPU-b") and rows[1].context_ids == "3"
    assert rows[2].allowed_devices == ("GPU-a", "GPU-b")


def test_parse_namespaces_and_clients() -> None:
    ns = parse_namespaces(
        "name,server,x,y,z,w,v\nhigh_priority,training,Ready,4G,50,0,/p/training/hp\n"
    )
    assert (
        len(ns) == 1 and ns[0].pinned_memory_limit == "4G" and ns[0].pipe_directory.endswith("/hp")
    )
    clients = parse_clients("51023,training,0,default,python train.py --x=1,2\nPID,server\n")
    assert (
        clients == [clients[0]]
        and clients[0].pid == 51023
        and clients[0].cmd == "python train.py --x=1,2"
    )


# --- runner -------------------------------------------------------------------------------


@pytest.mark.integration  # starts a real process
def test_subprocess_runner_outcomes(tmp_path: Path) -> None:
    r = SubprocessRunner(timeout=5)
    done = r.run(
        [sys.executable, "-c", "import os,sys; print(os.environ['X']); sys.exit(3)"], env={"X": "y"}
    )
    assert (done.rc, done.stdout.strip(), done.ok) == (3, "y", False)
    assert r.run(["cat"], input="hello").stdout == "hello"
    assert r.run([str(tmp_path / "nope")]).rc == 127
    (tmp_path / "noexec").write_text("#!/bin/sh\n")
    assert r.run([str(tmp_path / "noexec")]).rc == 126
    slow = r.run([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.3)
    assert slow.rc == 124 and "timed out" in slow.stderr


# --- daemon -------------------------------------------------------------------------------


def test_daemon_start_removes_stale_socket_and_stop_cleans(tmp_path: Path) -> None:
    fake = FakeMpsControl([GPU])
    d = MpsDaemon("sm-sharing", tmp_path, fake, sleep=lambda s: None)
    d.pipe_dir.mkdir(parents=True)
    (d.pipe_dir / "control").write_text("stale")
    (d.pipe_dir / "nvidia-cuda-mps-control.pid").write_text("1")
    assert d.ensure_running() is True
    assert d.ensure_running() is False
    assert fake.daemon(d.pipe_dir).multiuser and fake.daemon(d.pipe_dir).protocol == 3
    d.stop()
    assert not d.pipe_dir.exists() and fake.daemons == {}


def test_daemon_that_never_answers_is_an_error(tmp_path: Path) -> None:
    fake = FakeMpsControl([GPU])
    fake.fail("server", "list", times=100)
    d = MpsDaemon("time-slicing", tmp_path, fake, start_checks=3, sleep=lambda s: None)
    with pytest.raises(MpsError, match="did not answer"):
        d.ensure_running()


def test_config_toml_per_mode() -> None:
    import tomllib

    assert (
        tomllib.loads(config_toml("sm-sharing"))["features"]["context-share"]["default_socket"]
        == "off"
    )
    assert (
        tomllib.loads(config_toml("time-slicing"))["features"]["context-share"]["enabled"] is False
    )
    with pytest.raises(MpsError):
        config_toml("exclusive")


# --- the fake's failure modes (so the enforcer tests mean something) -----------------------


def test_fake_refuses_busy_deletes_and_supports_v2_only(tmp_path: Path) -> None:
    fake = FakeMpsControl([GPU])
    ctl = MpsControl(fake, tmp_path / "pipe", tmp_path / "log")
    ctl.start_daemon(None)
    ctl.server_create("gpu_0", [GPU])
    ctl.namespace_create("c_x", "gpu_0")
    fake.add_client(tmp_path / "pipe", "gpu_0", "c_x")
    with pytest.raises(MpsError, match="active clients"):
        ctl.namespace_delete("c_x", "gpu_0", force=False)
    with pytest.raises(MpsError, match="active clients"):
        ctl.server_delete("gpu_0")
    ctl.namespace_delete("c_x", "gpu_0", force=True)
    ctl.server_delete("gpu_0")
    with pytest.raises(MpsError, match="only --uid=0"):
        ctl.run("server", "create", "gpu_1", "--uid=1000")
    old = FakeMpsControl([GPU], v2_only=True)
    assert "namespace" not in old.run(["nvidia-cuda-mps-control", "-h"]).stdout
    with pytest.raises(MpsError, match="Unsupported protocol"):
        MpsControl(old, tmp_path / "p2", tmp_path / "l2").start_daemon(None)


# --- cgroup record of the consumer gate (real /bin/sh) -------------------------------------


@pytest.mark.integration  # starts a real process
@pytest.mark.skipif(
    not Path("/bin/sh").exists() or not Path("/proc/self/cgroup").exists(),
    reason="needs sh and /proc",
)
def test_the_gate_records_the_container_cgroup_even_when_it_refuses(tmp_path: Path) -> None:
    """The hard tier's cgroup record (what Unprepare's janitor reads) is written before the
    gate counts: a container it refuses was still given its memory limits by the hook before."""
    cgroups = tmp_path / "cgroups/uid"
    hook = consumer_gate_hook(
        str(tmp_path / "users/uid"), 1, "ns/c", "advice", "/bin/sh", str(cgroups)
    )
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text("{}")
    expected = next(
        line.split("::", 1)[1]
        for line in Path("/proc/self/cgroup").read_text().splitlines()
        if line.startswith("0::")
    )
    for container, rc in (("ctr-1.a_b", 0), ("ctr-2", 1)):  # the second: over maxConsumers
        state = {
            "ociVersion": "1.2.0",
            "id": container,
            "status": "created",
            "pid": os.getpid(),
            "bundle": str(bundle),
            "annotations": {"io.kubernetes.cri.sandbox-id": "sb", "x": "pid"},
        }
        done = subprocess.run(
            [hook.path, *hook.args[1:]], input=json.dumps(state).encode(), capture_output=True
        )
        assert done.returncode == rc, done.stderr
        assert (cgroups / container).read_text().strip() == expected


# --- janitor ------------------------------------------------------------------------------


def _cgroup(path: Path, dmem: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if dmem:
        (path / "dmem.min").write_text("")
    return path


def test_janitor_zeroes_live_leaf_repairs_parent_and_reports_rest(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    pod = _cgroup(root / "kubepods.slice/pod1.slice")
    live_leaf = _cgroup(pod / "cri-live.scope")
    sibling = _cgroup(pod / "cri-sibling.scope")
    nvml = FakeNvml({GPU: 80 << 30})
    nvml.cgroups[(GPU, str(pod))] = CgroupMemory(12 << 30, UNLIMITED, 0)
    nvml.cgroups[(GPU, str(sibling))] = CgroupMemory(4 << 30, 8 << 30, 0)
    records = tmp_path / "records"
    (records / "uid").mkdir(parents=True)
    (records / "uid/live").write_text(f"/{live_leaf.relative_to(root)}\n")
    (records / "uid/gone").write_text("/kubepods.slice/pod1.slice/cri-gone.scope\n")
    (records / "uid/orphan").write_text("/kubepods.slice/pod9.slice/cri-x.scope\n")
    (records / "uid/evil").write_text("/../../etc\n")
    janitor = SoftLimitJanitor(records, nvml, root)
    assert set(janitor.containers("uid")) == {"live", "gone", "orphan"}
    report = janitor.release("uid", [GPU], 8 << 30)
    assert report.zeroed == [str(live_leaf)]
    assert report.repaired == [str(pod)]
    assert report.uncovered == [str(root / "kubepods.slice/pod9.slice/cri-x.scope")]
    assert nvml.cgroups[(GPU, str(live_leaf))] == CgroupMemory(0, UNLIMITED, 0)
    assert nvml.cgroups[(GPU, str(pod))].soft_bytes == 4 << 30  # the live sibling's share stays
    assert not (records / "uid").exists()


def test_janitor_on_misc_backend_only_drops_records(tmp_path: Path) -> None:
    records = tmp_path / "records"
    (records / "uid").mkdir(parents=True)
    (records / "uid/c").write_text("/a/b\n")
    nvml = FakeNvml({GPU: 1 << 30})
    SoftLimitJanitor(records, nvml, tmp_path, dmem_backend=False).release("uid", [GPU], 1)
    assert nvml.calls == [] and not (records / "uid").exists()
