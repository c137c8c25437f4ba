"""A claim that fails to be (re-)applied must not tear down other claims' enforcement.

Reproductions from a break-it pass on the enforcer (fake MPS control, no GPU).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dra_driver.enforce import MpsError
from dra_driver.model.errors import PrepareError
from dra_driver.model.ids import validate_uid
from tests.support.fakes.plans import GIB, Node, device, plan

A = "0a000000-0000-4000-8000-00000000000a"
B = "0b000000-0000-4000-8000-00000000000b"


def ns(uid: str) -> str:
    return "c_" + uid.replace("-", "_")


def test_failing_claim_during_restore_leaves_running_claims_alone(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    pa, pb = plan(device(g, 10 * GIB), uid=A), plan(device(g, 10 * GIB), uid=B)
    node.enforcer.apply(pa)
    node.enforcer.apply(pb)
    pipe = node.pipe("time-slicing")
    client = node.mps.add_client(pipe, "gpu_0", ns(B))
    inode = os.stat(pipe / "gpu_0" / ns(B)).st_ino

    restarted = node.new_enforcer()  # the plugin restarts; A hits a transient failure
    # A's namespace went missing, so restore must set it again (an intact one is only read).
    node.mps.daemon(pipe).servers["gpu_0"].namespaces.pop(ns(A))
    node.mps.fail("namespace", "set")
    restarted.restore([pa, pb])

    daemon = node.mps.daemon(pipe)
    assert any(c.pid == client for c in daemon.clients)
    assert os.stat(pipe / "gpu_0" / ns(B)).st_ino == inode
    assert not any(
        c.startswith(("server delete", "client terminate", "-q")) for c in node.mps.commands()
    )
    assert list(restarted._pending) == [A]
    restarted.check_health()  # the retry succeeds
    assert restarted._pending == {}
    assert ns(A) in daemon.servers["gpu_0"].namespaces


def test_failed_reapply_with_a_changed_plan_keeps_the_claim_pending(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, 10 * GIB), uid=A))
    node.mps.fail("namespace", "set")
    bigger = plan(device(g, 20 * GIB), uid=A)
    with pytest.raises(MpsError):
        node.enforcer.apply(bigger)
    assert node.enforcer._pending == {A: bigger}
    node.enforcer.check_health()
    assert node.enforcer._pending == {}
    assert A in node.enforcer._claims


def test_uid_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(PrepareError):
        validate_uid(A + "\n")


def test_restore_of_a_claim_whose_gpu_is_gone_stays_pending(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    pa = plan(device(g, 10 * GIB), uid=A)
    node.enforcer.apply(pa)
    node.tiers.pop(g.uuid)  # the GPU is not in the inventory after the restart
    restarted = node.new_enforcer()
    restarted.restore([pa])
    assert list(restarted._pending) == [A]
    health = restarted.check_health()  # still pending, retried, never "enforced as none"
    assert list(restarted._pending) == [A]
    assert A not in restarted._claims
    assert g.uuid not in health or not health[g.uuid].healthy


def test_failed_compute_mode_restore_is_retried_by_health_checks(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, 10 * GIB), uid=A))
    node.nvml.fail_set_compute_mode = True
    node.enforcer.release(A)
    assert node.nvml.gpus[g.uuid].compute_mode == "EXCLUSIVE_PROCESS"
    node.nvml.fail_set_compute_mode = False
    node.enforcer.check_health()
    assert node.nvml.gpus[g.uuid].compute_mode == "DEFAULT"
