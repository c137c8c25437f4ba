"""Every Prepare/Unprepare answers within its budget, whatever hangs (issue 10, items 6 and 7).

A hung API server (``ClaimServer.hang``) and a hung MPS control daemon
(``FakeMpsControl.hang``) fail the claims that need them, within the call's budget; other
claims and other calls go on; start-up does not wait for a hung daemon.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.app.nodestate import check_mps
from dra_driver.enforce import MpsError
from dra_driver.enforce.enforcer import MpsEnforcer, MpsOptions
from dra_driver.infra.locking import LockTimeout, PrepareLock
from dra_driver.model.plans import ClaimRef
from dra_driver.observe.usage import MpsUsageSource
from dra_driver.prepare.preparation import ClaimPreparation
from tests.support import claimfactory as cf
from tests.support.fakes.mps_control import FakeMpsControl, FakeNvml
from tests.support.node import NODE, Node
from tests.support.waiting import wait_for


def ref(claim: dict[str, Any]) -> ClaimRef:
    m = claim["metadata"]
    return ClaimRef(m["namespace"], m["name"], m["uid"])


def uid(claim: dict[str, Any]) -> str:
    return str(claim["metadata"]["uid"])


def read_timeout(claim: dict[str, Any], seconds: str) -> str:
    m = claim["metadata"]
    return (
        f"reading ResourceClaim {m['namespace']}/{m['name']} from the API server did not "
        f"finish within {seconds} s"
    )


# --- item 6: a hung API server ----------------------------------------------------------------


def test_hung_claim_reads_fail_alone_within_the_budget(node: Node) -> None:
    good = cf.claim([node.share(0, "quarter")])
    hung = [cf.claim([node.share(1, "eighth")]) for _ in range(9)]
    for c in (good, *hung):
        node.claims.add(c)
    for c in hung:
        node.claims.hang(c)
    preparation = node.preparation()
    preparation.call_budget = 2.0
    started = time.monotonic()
    out = preparation.prepare([ref(c) for c in (*hung, good)])
    took = time.monotonic() - started
    assert took < 3.0, took
    assert out[uid(good)].error == "" and out[uid(good)].devices
    for c in hung:
        assert read_timeout(c, "1") in out[uid(c)].error  # half the budget
        assert not out[uid(c)].devices
    preparation.close()


def test_a_hung_read_is_sent_once(node: Node) -> None:
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    node.claims.hang(claim)
    preparation = node.preparation()
    preparation.call_budget = 1.0
    assert read_timeout(claim, "0.5") in preparation.prepare([ref(claim)])[uid(claim)].error
    time.sleep(1.0)  # a client-side retry would arrive now
    m = claim["metadata"]
    assert node.claims.gets[(m["namespace"], m["name"])] == 1
    preparation.close()


def test_the_prepare_lock_is_not_held_while_a_claim_is_read(node: Node) -> None:
    hung = cf.claim([node.share(0, "quarter")])
    other = cf.claim([node.share(1, "quarter")])
    node.claims.add(hung)
    node.claims.add(other)
    node.claims.hang(hung)
    preparation = node.preparation()
    preparation.call_budget = 5.0
    results: dict[str, Any] = {}
    first = threading.Thread(target=lambda: results.update(preparation.prepare([ref(hung)])))
    first.start()
    wait_for("the first read to hang", lambda: node.claims.hanging == 1, timeout=5.0, every=0.01)
    started = time.monotonic()
    out = preparation.prepare([ref(other)])
    took = time.monotonic() - started
    assert out[uid(other)].error == ""
    assert took < 1.0, took
    first.join()
    assert read_timeout(hung, "2.5") in results[uid(hung)].error
    preparation.close()


@pytest.fixture
def other_instance(node: Node) -> Iterator[int]:
    """An open file description of the prepare lock file (another plugin instance)."""
    path = node.plugin_dir / DEFAULT_DRIVER_NAME / "prepare.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    yield fd
    os.close(fd)


def test_lock_wait_is_bounded(node: Node, other_instance: int) -> None:
    lock = PrepareLock(node.plugin_dir / DEFAULT_DRIVER_NAME / "prepare.lock")
    fcntl.flock(other_instance, fcntl.LOCK_EX)
    started = time.monotonic()
    with pytest.raises(LockTimeout), lock.held(timeout=0.3):
        pass
    assert 0.3 <= time.monotonic() - started < 1.0
    fcntl.flock(other_instance, fcntl.LOCK_UN)
    with lock.held(timeout=0.3):
        pass


def test_a_call_that_cannot_get_the_lock_in_its_budget_fails_clearly(
    node: Node, other_instance: int
) -> None:
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    preparation = node.preparation()
    preparation.call_budget = 1.0
    fcntl.flock(other_instance, fcntl.LOCK_EX)
    unlock = threading.Timer(5.0, fcntl.flock, (other_instance, fcntl.LOCK_UN))
    unlock.start()
    started = time.monotonic()
    out = preparation.prepare([ref(claim)])
    errors = preparation.unprepare([ref(claim)])
    took = time.monotonic() - started
    unlock.cancel()
    fcntl.flock(other_instance, fcntl.LOCK_UN)
    assert took < 3.0, took
    assert "prepare lock" in out[uid(claim)].error
    assert "did not finish within 1 s" in out[uid(claim)].error
    assert "prepare lock" in errors[uid(claim)]
    assert not (node.cdi_root / f"{DEFAULT_DRIVER_NAME}-claim_{uid(claim)}.json").exists()
    preparation.close()


# --- item 7: a hung MPS control daemon ------------------------------------------------------


class MpsNode:
    """The conftest node's GPUs enforced by the real MPS enforcer over the fake control."""

    def __init__(self, node: Node, command_timeout: float = 10.0) -> None:
        self.node = node
        gpus = {d.gpu.uuid: d.gpu for d in node.devices.values()}
        self.mps = FakeMpsControl(list(gpus))
        self.nvml = FakeNvml({u: g.memory_bytes for u, g in gpus.items()})
        self.tiers = {u: "cooperative" for u in gpus}
        self.options = MpsOptions(
            root=str(node.root / "run"),
            cgroup_root=str(node.root / "cgroup"),
            server_checks=3,
            server_check_interval=0.0,
            command_timeout=command_timeout,
        )
        self.enforcer = self.new_enforcer()

    def new_enforcer(self) -> MpsEnforcer:
        return MpsEnforcer(self.tiers, self.nvml, self.mps, self.options)

    def preparation(self, startup_budget: float = 5.0) -> ClaimPreparation:
        return self.node.preparation(enforcer=self.enforcer, startup_budget=startup_budget)

    def pipe(self, mode: str) -> Path:
        return self.node.root / "run" / "mps" / mode / "pipe"


def test_hung_mps_daemon_fails_the_claim_within_the_budget(node: Node) -> None:
    mps = MpsNode(node)
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    preparation = mps.preparation()
    preparation.call_budget = 2.0
    mps.mps.hang()
    started = time.monotonic()
    error = preparation.prepare([ref(claim)])[uid(claim)].error
    took = time.monotonic() - started
    mps.mps.release()
    assert took < 3.0, took
    assert "did not finish within" in error and "MPS" in error, error
    assert not (node.cdi_root / f"{DEFAULT_DRIVER_NAME}-claim_{uid(claim)}.json").exists()
    assert preparation.prepare([ref(claim)])[uid(claim)].error == ""  # the kubelet's retry
    preparation.close()


def test_hung_daemon_of_one_mode_fails_only_the_claims_that_need_it(mixed_node: Node) -> None:
    node = mixed_node
    mps = MpsNode(node, command_timeout=1.0)
    sm = cf.claim(
        [
            cf.result(
                node.device(1, None),
                NODE,
                share_id="3f1c2b9a-0d4e-4c7b-9a51-5e2f8d6c7b10",
                memory="8Gi",
            )
        ]
    )
    ts = cf.claim([node.share(0, "quarter")])
    node.claims.add(sm)
    node.claims.add(ts)
    preparation = mps.preparation()
    preparation.call_budget = 5.0
    mps.mps.hang(pipe=mps.pipe("sm-sharing"))
    started = time.monotonic()
    out = preparation.prepare([ref(sm), ref(ts)])
    took = time.monotonic() - started
    mps.mps.release()
    assert took < 3.0, took
    assert "sm-sharing" in out[uid(sm)].error and "did not" in out[uid(sm)].error
    assert out[uid(ts)].error == ""
    preparation.close()


def test_unprepare_with_a_hung_daemon_answers_within_the_budget(node: Node) -> None:
    mps = MpsNode(node)
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    preparation = mps.preparation()
    assert preparation.prepare([ref(claim)])[uid(claim)].error == ""
    preparation.call_budget = 2.0
    mps.mps.hang()
    started = time.monotonic()
    error = preparation.unprepare([ref(claim)])[uid(claim)]
    took = time.monotonic() - started
    mps.mps.release()
    assert took < 3.0, took
    assert "did not finish within" in error, error
    # Records go first (the crash-safe order); the error makes the kubelet retry, and the
    # retry removes what is left by claim UID.
    assert uid(claim) not in preparation.checkpoint.claims
    assert preparation.unprepare([ref(claim)]) == {uid(claim): ""}
    preparation.close()


def test_start_up_does_not_wait_for_a_hung_daemon(node: Node) -> None:
    mps = MpsNode(node)
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    first = mps.preparation()
    assert first.prepare([ref(claim)])[uid(claim)].error == ""
    first.close()
    daemon = mps.mps.daemon(mps.pipe("time-slicing"))
    mps.enforcer = mps.new_enforcer()  # the plugin restarts with empty MPS bookkeeping
    mps.mps.hang()
    started = time.monotonic()
    second = mps.preparation(startup_budget=1.0)
    took = time.monotonic() - started
    assert took < 2.5, took
    assert list(mps.enforcer._pending) == [uid(claim)]  # left for the health checks
    assert (mps.pipe("time-slicing") / "control").exists()  # a hung daemon is not removed
    mps.mps.release()
    assert mps.mps.daemon(mps.pipe("time-slicing")) is daemon
    mps.enforcer.check_health()
    assert mps.enforcer._pending == {}
    second.close()


def test_health_check_with_a_hung_daemon_is_bounded_and_reports_it(node: Node) -> None:
    mps = MpsNode(node)
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    preparation = mps.preparation()
    assert preparation.prepare([ref(claim)])[uid(claim)].error == ""
    gpu = node.devices[node.device(0, "quarter")].gpu.uuid
    state = SimpleNamespace(unhealthy_gpus={}, wake=threading.Event())
    mps.mps.hang()
    started = time.monotonic()
    check_mps(mps.enforcer, state, seconds=1.0)  # type: ignore[arg-type]
    took = time.monotonic() - started
    mps.mps.release()
    assert took < 2.0, took
    assert "does not answer" in state.unhealthy_gpus[gpu]
    assert (mps.pipe("time-slicing") / "control").exists()  # not restarted over a hung one
    check_mps(mps.enforcer, state)  # type: ignore[arg-type]
    assert state.unhealthy_gpus == {}
    preparation.close()


def test_metrics_scrape_with_a_hung_daemon_is_bounded(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    mps = MpsNode(node)
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    preparation = mps.preparation()
    assert preparation.prepare([ref(claim)])[uid(claim)].error == ""
    monkeypatch.setattr("dra_driver.observe.usage.SCRAPE_BUDGET_S", 0.5)
    source = MpsUsageSource(mps.enforcer, mps.nvml)
    mps.mps.hang()
    started = time.monotonic()
    with pytest.raises(MpsError, match="does not answer"):
        source.snapshot(preparation.prepared_plans())
    took = time.monotonic() - started
    mps.mps.release()
    assert took < 1.5, took
    preparation.close()


def test_prepare_waits_for_a_busy_enforcer_only_within_its_budget(node: Node) -> None:
    mps = MpsNode(node)
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    preparation = mps.preparation()
    preparation.call_budget = 1.0
    held, done = threading.Event(), threading.Event()

    def busy() -> None:  # e.g. a health check stuck on a slow daemon
        with mps.enforcer._lock:
            held.set()
            done.wait(10)

    holder = threading.Thread(target=busy)
    holder.start()
    held.wait()
    started = time.monotonic()
    error = preparation.prepare([ref(claim)])[uid(claim)].error
    took = time.monotonic() - started
    done.set()
    holder.join()
    assert took < 2.0, took
    assert "MPS enforcer stayed busy" in error, error
    assert preparation.prepare([ref(claim)])[uid(claim)].error == ""
    preparation.close()
