"""The prepared claims' servers and namespaces in each daemon's ``-a`` file: what the enforcer
writes after every change, and a restarted daemon serving them with their limits from its start
(against the fake control program, which shares the emulator's state machine)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from dra_driver.enforce.mps.daemon import MpsDaemon, config_toml
from dra_driver.enforce.rules.declared import DeclaredError, claims_toml, merged_config
from dra_driver.infra.runner import SubprocessRunner
from dra_driver.mpsemu.config import check_declared, declared_servers
from tests.support.fakes.plans import GIB, Node, device, plan

UID_A = "0a000000-0000-4000-8000-00000000000a"
UID_B = "0b000000-0000-4000-8000-00000000000b"
UID_C = "0c000000-0000-4000-8000-00000000000c"
NS_A = "c_" + UID_A.replace("-", "_")
NS_B = "c_" + UID_B.replace("-", "_")
SRV_C = "m_" + UID_C.replace("-", "_")


CAPPED = 'pinned_memory_limit = "1M"\nactive_thread_percentage = "1"\n'
"""The default namespace of every declared server (no claim uses it)."""


def test_claims_part_has_each_server_and_namespace_with_its_limits(tmp_path: Path) -> None:
    node = Node(tmp_path, count=3)
    g0, g1, g2 = node.gpus
    node.enforcer.apply(plan(device(g0, GIB, 2 * GIB), uid=UID_A))
    node.enforcer.apply(plan(device(g2, GIB, mode="sm-sharing", threads=40), uid=UID_B))
    node.enforcer.apply(
        plan(*(device(g, 3 * GIB, name=f"gpu-{g.index}-part-0") for g in (g0, g1)), uid=UID_C)
    )
    text = (tmp_path / "run/mps/time-slicing/claims.toml").read_text()
    assert text == (
        f'[servers.gpu_0]\nallowed_devices = "{g0.uuid}"\nuid = 0\n{CAPPED}\n'
        f"[servers.gpu_0.namespaces.{NS_A}]\n"
        'pinned_memory_limit = "2048M"\nactive_thread_percentage = "100"\n\n'
        f'[servers.{SRV_C}]\nallowed_devices = "{g0.uuid},{g1.uuid}"\nuid = 0\n{CAPPED}\n'
        f"[servers.{SRV_C}.namespaces.claim]\n"
        'pinned_memory_limit = "3072M"\nactive_thread_percentage = "100"\n'
    )
    # what the daemon's state machine accepts (Release 615 keys, valid names and limits)
    check_declared(declared_servers(tomllib.loads(text)), multiuser=True)
    assert (tmp_path / "run/mps/sm-sharing/claims.toml").read_text() == (
        f'[servers.gpu_2]\nallowed_devices = "{g2.uuid}"\nuid = 0\n{CAPPED}\n'
        f"[servers.gpu_2.namespaces.{NS_B}]\n"
        'pinned_memory_limit = "1024M"\nactive_thread_percentage = "40"\n'
    )
    for uid in (UID_A, UID_B, UID_C):
        node.enforcer.release(uid)
    assert (tmp_path / "run/mps/time-slicing/claims.toml").read_text() == ""
    assert (tmp_path / "run/mps/sm-sharing/claims.toml").read_text() == ""


def test_restarted_daemon_serves_the_namespaces_with_limits_before_any_command(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    g0, g1 = node.gpus
    node.enforcer.apply(plan(device(g0, GIB, 2 * GIB), uid=UID_A))
    node.enforcer.apply(plan(device(g1, 4 * GIB), uid=UID_B))
    pipe = node.pipe("time-slicing")
    node.mps.crash(pipe)
    seen = len(node.mps.commands())
    node.enforcer.daemons["time-slicing"].ensure_running()  # a restart, as the service does
    assert [c for c in node.mps.commands()[seen:] if c.startswith("-p")] == [
        f"-p 3 -m -d -a {tmp_path}/run/mps/time-slicing/mps.toml"
    ]
    spaces = {
        (s.name, n.name): (n.pinned, n.threads)
        for s in node.mps.daemon(pipe).servers.values()
        for n in s.namespaces.values()
    }
    assert spaces == {
        ("gpu_0", NS_A): (2 * GIB, 100),
        ("gpu_1", NS_B): (4 * GIB, 100),
        ("gpu_0", "default"): (1 << 20, 1),  # capped from the daemon's start, too
        ("gpu_1", "default"): (1 << 20, 1),
    }
    assert node.enforcer.check_health()[g0.uuid].healthy
    assert not any(
        c.startswith(("namespace create", "namespace set", "server create"))
        for c in node.mps.commands()[seen:]
    )


def test_a_bad_claims_file_leaves_the_daemon_its_base_config(tmp_path: Path) -> None:
    assert claims_toml([]) == ""
    assert merged_config("base\n", "") == "base\n"
    with pytest.raises(DeclaredError, match="besides servers"):
        merged_config("base\n", "[features.memacct]\nenabled = false\n")
    with pytest.raises(DeclaredError, match="not TOML"):
        merged_config("base\n", "[servers.x\n")
    daemon = MpsDaemon("sm-sharing", tmp_path, SubprocessRunner())
    daemon.dir.mkdir()
    daemon.claims_file.write_text("schema_version = '2'\n")
    with capture_logs() as logs:
        daemon.write_config()
    assert daemon.config_file.read_text() == config_toml("sm-sharing")
    assert logs[0]["log_level"] == "error" and "besides servers" in logs[0]["error"]
