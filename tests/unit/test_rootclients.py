"""Root MPS clients: the user record hook's output, read back for the prepared claims, gives
a warning and a ``NonRootClients=False`` condition in the claim's device status."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import structlog

from dra_driver.enforce.hooks import record_user_hook
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.model.plans import ClaimPlan, DevicePlan
from dra_driver.model.vocabulary import Tier
from dra_driver.observe.claimstatus import ROOT_CONDITION_TYPE, Enforcement, device_status
from dra_driver.observe.rootclients import STALE_AFTER_S, RootClientWatch, root_containers
from tests.support import claimfactory as cf
from tests.support.apiserver_stub import ClaimStatusServer
from tests.support.node import NODE
from tests.unit.test_claimstatus import prepared, writer

UID = "0a000000-0000-4000-8000-00000000000a"


def plan_of(node: Any, admin: bool = False) -> ClaimPlan:
    share = node.share(1, "quarter")
    if admin:
        share["adminAccess"] = True
    (plan,) = prepared(node, [cf.claim([share], uid=UID)])
    return plan


def run_hook(record_dir: Path, bundle: Path, container: str, uid: int) -> None:
    """Run the user record hook as runc runs a createRuntime hook: OCI state on stdin."""
    bundle.mkdir(parents=True, exist_ok=True)
    config = {"ociVersion": "1.1.0", "process": {"user": {"uid": uid, "gid": uid}, "args": ["sh"]}}
    (bundle / "config.json").write_text(json.dumps(config, separators=(",", ":")))
    hook = record_user_hook(str(record_dir))
    state = {"ociVersion": "1.0.2", "id": container, "status": "creating", "pid": os.getpid()}
    state["bundle"] = str(bundle)
    done = subprocess.run(
        [hook.path, *hook.args[1:]], input=json.dumps(state), text=True, timeout=10
    )
    assert done.returncode == 0


def test_root_containers_reads_the_recorded_uids() -> None:
    assert root_containers({"a": "0\n", "b": "1000\n", "c": "0", "d": ""}) == ["a", "c"]


def test_the_hook_records_each_containers_uid(tmp_path: Path) -> None:
    run_hook(tmp_path / "users" / UID, tmp_path / "b1", "c1", 0)
    run_hook(tmp_path / "users" / UID, tmp_path / "b2", "c2", 1000)
    assert (tmp_path / "users" / UID / "c1").read_text() == "0\n"
    assert (tmp_path / "users" / UID / "c2").read_text() == "1000\n"


def test_a_root_container_is_warned_about_once(node: Any, tmp_path: Path) -> None:
    plan = plan_of(node)
    seen: list[tuple[str, list[str]]] = []
    watch = RootClientWatch(tmp_path / "users", lambda p, c: seen.append((p.claim.uid, c)))
    run_hook(tmp_path / "users" / UID, tmp_path / "b1", "nonroot", 1000)
    assert watch.check([plan]) == {} and seen == []
    run_hook(tmp_path / "users" / UID, tmp_path / "b2", "rootctr", 0)
    with structlog.testing.capture_logs() as logs:
        assert watch.check([plan]) == {UID: ["rootctr"]}
        watch.check([plan])  # nothing new: no second warning
    assert seen == [(UID, ["rootctr"])]
    (warning,) = [e for e in logs if e["log_level"] == "warning"]
    assert warning["claim_uid"] == UID and warning["containers"] == ["rootctr"]
    assert "runs as root on an MPS GPU" in warning["event"]


def test_admin_access_claims_are_no_mps_clients(node: Any, tmp_path: Path) -> None:
    plan = plan_of(node, admin=True)
    run_hook(tmp_path / "users" / UID, tmp_path / "b", "rootctr", 0)
    assert RootClientWatch(tmp_path / "users").check([plan]) == {}


def test_records_of_claims_no_longer_prepared_are_removed_once_stale(tmp_path: Path) -> None:
    now = [1_000_000.0]
    watch = RootClientWatch(tmp_path / "users", clock=lambda: now[0])
    run_hook(tmp_path / "users" / UID, tmp_path / "b", "c", 0)
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


def test_the_claim_status_says_a_container_runs_as_root(node: Any, api: Any) -> None:
    claim = cf.on_node(cf.claim([node.share(1, "quarter")]), NODE)
    (plan,) = prepared(node, [copy.deepcopy(claim)])
    api.add(claim)
    w = writer(api, plan)
    assert w.write(plan) == "written"
    key = (claim["metadata"]["namespace"], claim["metadata"]["name"])
    conditions = api.claims[key]["status"]["devices"][0]["conditions"]
    assert [c["type"] for c in conditions] == ["FractionEnforced"]
    w.flag_root(plan, ["rootctr"])
    assert w.write(plan) == "written"
    conditions = api.claims[key]["status"]["devices"][0]["conditions"]
    root = next(c for c in conditions if c["type"] == ROOT_CONDITION_TYPE)
    assert root["status"] == "False" and root["reason"] == "ContainerRunsAsRoot"
    assert "runAsNonRoot" in root["message"]


def test_a_claim_without_mps_gets_no_root_condition() -> None:
    gpu = SimulatedGpuSource("simulated:H200x1", seed="n").discover().gpus[0]
    d = DevicePlan(("gpu",), "n", "gpu-0-time-slicing", "s", gpu, "time-slicing", 1, 1, None)
    entry = device_status(d, "drv", Enforcement(Tier.NONE), "t", 100, runs_as_root=True)
    assert [c["type"] for c in entry["conditions"]] == ["FractionEnforced"]
