"""The MPS v3 enforcer against the fake control program and fake NVML (no GPU needed)."""

from __future__ import annotations

import time
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from dra_driver.enforce import MpsError, MpsOptions
from dra_driver.enforce.enforcer import MpsEnforcer, target_edits, targets_for_claim
from dra_driver.enforce.mps.objects import RECENT_S
from dra_driver.model import cdi
from dra_driver.model.cdi import Hook, Mount
from tests.support.cdischema import validator
from tests.support.fakes.plans import GIB, Node, device, plan

MIB = 1 << 20
READ_ONLY = ("rbind", "ro", "nosuid", "nodev", "noexec")

UID_A = "0a000000-0000-4000-8000-00000000000a"
UID_B = "0b000000-0000-4000-8000-00000000000b"
UID_C = "0c000000-0000-4000-8000-00000000000c"
CSV = "--format=csv,noheader"


def ns(uid: str) -> str:
    return "c_" + uid.replace("-", "_")


def namespaces(
    node: Node, mode: str, server: str = "gpu_0"
) -> dict[str, tuple[int | None, int | None]]:
    """The limits of the claims' namespaces on ``server`` (its ``default`` namespace aside:
    :func:`test_a_new_server_has_its_side_doors_closed`)."""
    d = node.mps.daemon(node.pipe(mode))
    spaces = d.servers[server].namespaces.values()
    return {n.name: (n.pinned, n.threads) for n in spaces if n.name != "default"}


# --- hard tier ----------------------------------------------------------------------------


def test_hard_time_slicing_commands_and_edits(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    edits = node.enforcer.apply(plan(device(g, 20 * GIB, 30 * GIB), uid=UID_A))
    pipe = node.pipe("time-slicing")
    config = tmp_path / "run/mps/time-slicing/mps.toml"
    assert node.mps.commands() == [
        f"server list {CSV}",
        f"-p 3 -m -d -a {config}",
        f"server list {CSV}",
        f"server create gpu_0 --uid=0 --allowed-devices={g.uuid}",
        f"server list {CSV}",
        "server set gpu_0 --pinned-memory-limit=1M --active-thread-percentage=1",
        f"namespace list --server=gpu_0 {CSV}",
        f"namespace create {ns(UID_A)} --server=gpu_0",
        f"namespace set {ns(UID_A)} --server=gpu_0 --pinned-memory-limit=30720M "
        "--active-thread-percentage=100",
        f"namespace list {ns(UID_A)} --server=gpu_0 {CSV}",
    ]
    assert all(
        e["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe) and e["CUDA_MPS_PROTOCOL_VERSION"] == "3"
        for e in node.mps.envs
    )
    e = edits["gpu-0-quarter-0"]
    assert e.env == (
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "GPU_FRACTION_COMPUTE_MODE=time-slicing",
        "GPU_FRACTION_MEMORY_ENFORCEMENT=hard",
        "NVIDIA_GPU_MEMORY_REQUEST=20480",
        "NVIDIA_GPU_MEMORY_LIMIT=30720",
    )
    assert e.mounts == (Mount(str(pipe / "gpu_0" / ns(UID_A)), "/tmp/nvidia-mps", READ_ONLY),)
    assert e.hooks[0] == Hook(
        "createRuntime",
        "/usr/bin/nvidia-cdi-hook",
        ("nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", "/", "--gpu-id", g.uuid),
    )
    record = e.hooks[1]
    assert (record.hook_name, record.path) == ("createRuntime", "/bin/sh")
    assert record.args[-1] == str(tmp_path / "run/cgroups" / UID_A)
    assert (pipe / "gpu_0" / ns(UID_A)).is_dir()
    assert node.nvml.gpus[g.uuid].compute_mode == "EXCLUSIVE_PROCESS"
    assert namespaces(node, "time-slicing") == {ns(UID_A): (30 * GIB, 100)}
    features = tomllib.loads(config.read_text())["features"]
    assert features["context-share"] == {"enabled": False}
    assert features["memacct"] == {"enabled": True}


def test_hard_sm_sharing_uses_its_own_daemon_and_claim_threads(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[1]
    edits = node.enforcer.apply(plan(device(g, 8 * GIB, mode="sm-sharing", threads=30), uid=UID_A))
    config = tomllib.loads((tmp_path / "run/mps/sm-sharing/mps.toml").read_text())
    assert config["features"]["context-share"] == {"enabled": True, "default_socket": "off"}
    assert namespaces(node, "sm-sharing", "gpu_1") == {ns(UID_A): (8 * GIB, 30)}
    assert not node.pipe("time-slicing").exists()
    env = edits["gpu-1-quarter-0"].env
    assert "GPU_FRACTION_COMPUTE_MODE=sm-sharing" in env
    assert "NVIDIA_GPU_MEMORY_REQUEST=8192" in env and "NVIDIA_GPU_MEMORY_LIMIT=8192" in env


def test_sm_sharing_default_threads_from_options(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.options = MpsOptions(**{**node.options.__dict__, "default_active_thread_percentage": 40})
    enforcer = node.new_enforcer()
    enforcer.apply(plan(device(node.gpus[0], 4 * GIB, mode="sm-sharing"), uid=UID_A))
    enforcer.apply(plan(device(node.gpus[0], 4 * GIB, mode="sm-sharing", threads=70), uid=UID_B))
    assert namespaces(node, "sm-sharing") == {ns(UID_A): (4 * GIB, 40), ns(UID_B): (4 * GIB, 70)}


def test_cdi_spec_with_hooks_is_valid(tmp_path: Path) -> None:
    node = Node(tmp_path)
    edits = node.enforcer.apply(plan(device(node.gpus[0], GIB, 2 * GIB), uid=UID_A))
    spec = cdi.build_spec(
        "gpu-fraction.dra.dev",
        [cdi.CdiDevice(f"claim-{UID_A}-gpu-0-quarter-0", edits["gpu-0-quarter-0"])],
    )
    validator().validate(spec)
    hooks = spec["devices"][0]["containerEdits"]["hooks"]
    assert [h["hookName"] for h in hooks] == ["createRuntime"] * 2  # limits; gate with cgroup


def test_a_new_server_has_its_side_doors_closed(tmp_path: Path) -> None:
    """Issue: a process that reached ``gpu_N/control`` attached to the server's default
    namespace with no limits; the server directory was listable and its socket 0666."""
    node = Node(tmp_path)
    node.enforcer.apply(plan(device(node.gpus[0], 20 * GIB, 30 * GIB), uid=UID_A))
    d = node.mps.daemon(node.pipe("time-slicing"))
    default = d.servers["gpu_0"].namespaces["default"]
    assert (default.pinned, default.threads) == (1 << 20, 1)
    pipe = node.pipe("time-slicing")
    assert pipe.stat().st_mode & 0o777 == 0o711
    server_dir = pipe / "gpu_0"
    if server_dir.is_dir():  # the in-process fake makes no server sockets
        assert server_dir.stat().st_mode & 0o777 == 0o711


# --- cooperative and none -----------------------------------------------------------------


def test_cooperative_has_namespace_limit_but_no_memory_hook(tmp_path: Path) -> None:
    node = Node(tmp_path, tiers={0: "cooperative"})
    with capture_logs() as logs:
        edits = node.enforcer.apply(plan(device(node.gpus[0], 6 * GIB, 12 * GIB), uid=UID_A))
    e = edits["gpu-0-quarter-0"]
    (gate,) = e.hooks  # only the consumer gate: no driver-enforced limits to apply
    records = tmp_path / "run/users" / UID_A / "gpu-0-quarter-0"  # per device of the claim
    assert gate.args[3:6] == ("gpu-fraction-consumer", str(records), "1")
    assert not any(v.startswith("NVIDIA_GPU_MEMORY_") for v in e.env)
    assert "GPU_FRACTION_MEMORY_ENFORCEMENT=cooperative" in e.env
    assert e.mounts[0].container_path == "/tmp/nvidia-mps"
    assert namespaces(node, "time-slicing") == {ns(UID_A): (12 * GIB, 100)}
    coop = [entry for entry in logs if "cooperatively" in entry["event"]]
    assert coop and coop[0]["claim_uid"] == UID_A and coop[0]["gpu"] == node.gpus[0].uuid


def test_none_tier_runs_no_mps_and_says_not_capped(tmp_path: Path) -> None:
    node = Node(tmp_path, tiers={0: "none"})
    with capture_logs() as logs:
        edits = node.enforcer.apply(plan(device(node.gpus[0], 6 * GIB), uid=UID_A))
    assert node.mps.calls == []
    assert edits["gpu-0-quarter-0"].env == (
        "GPU_FRACTION_COMPUTE_MODE=time-slicing",
        "GPU_FRACTION_MEMORY_ENFORCEMENT=none",
    )
    assert edits["gpu-0-quarter-0"].mounts == ()
    assert any("NOT capped" in entry["event"] for entry in logs)
    assert node.nvml.gpus[node.gpus[0].uuid].compute_mode == "DEFAULT"
    with pytest.raises(MpsError, match="sm-sharing needs MPS"):
        node.enforcer.apply(plan(device(node.gpus[0], GIB, mode="sm-sharing"), uid=UID_B))
    node.enforcer.release(UID_A)


# --- several claims, idempotence, release -------------------------------------------------


def test_second_claim_reuses_server_and_apply_is_idempotent(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    a = plan(device(g, 10 * GIB, 20 * GIB), uid=UID_A)
    first = node.enforcer.apply(a)
    node.enforcer.apply(plan(device(g, 5 * GIB), uid=UID_B))
    again = node.enforcer.apply(a)
    assert again == first
    creates = [c for c in node.mps.commands() if c.startswith("server create")]
    assert len(creates) == 1
    assert namespaces(node, "time-slicing") == {
        ns(UID_A): (20 * GIB, 100),
        ns(UID_B): (5 * GIB, 100),
    }
    assert sum(c.startswith(f"namespace create {ns(UID_A)}") for c in node.mps.commands()) == 1


def test_release_terminates_clients_then_deletes_and_cleans_up(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, 10 * GIB), uid=UID_A))
    node.enforcer.apply(plan(device(g, 10 * GIB), uid=UID_B))
    pipe = node.pipe("time-slicing")
    pid_a = node.mps.add_client(pipe, "gpu_0", ns(UID_A))
    pid_b = node.mps.add_client(pipe, "gpu_0", ns(UID_B))
    records = tmp_path / "run/cgroups" / UID_A
    records.mkdir(parents=True)
    (records / "ctr1").write_text("/gone/leaf\n")
    consumers = node.options.user_record_root / UID_A / "gpu-0-time-slicing"
    consumers.mkdir(parents=True)
    (consumers / "ctr1").write_text("1000 4242 99 ns/pod/main\n")
    before = len(node.mps.calls)
    node.enforcer.release(UID_A)
    cmds = node.mps.commands()[before:]
    term = cmds.index(f"client terminate {pid_a}")
    delete = cmds.index(f"namespace delete {ns(UID_A)} --server=gpu_0 --force")
    assert term < delete
    assert f"client terminate {pid_b}" not in cmds
    assert not records.exists()
    assert not consumers.parent.exists()  # the consumer gate's records went with the claim
    assert namespaces(node, "time-slicing") == {ns(UID_B): (10 * GIB, 100)}
    assert not any(c.startswith("server delete") for c in cmds)

    node.mps.daemon(pipe).clients.clear()
    node.enforcer.release(UID_B)
    cmds = node.mps.commands()
    assert cmds[-2:] == [f"server list {CSV}", "-q"]
    assert "server delete gpu_0" in cmds
    assert node.mps.daemons == {}
    assert node.nvml.gpus[g.uuid].compute_mode == "DEFAULT"
    assert not pipe.exists()
    assert list((tmp_path / "run").rglob("c_*")) == []
    assert list((tmp_path / "run/mps/compute-mode").iterdir()) == []
    assert not (tmp_path / "run/cgroups" / UID_B).exists()
    # idempotent: releasing again (or an unknown claim) is fine and starts nothing
    node.enforcer.release(UID_B)
    node.enforcer.release(UID_C)
    assert node.mps.daemons == {}


def test_release_of_unknown_claim_removes_its_namespace(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, GIB), uid=UID_A))
    node.enforcer.apply(plan(device(g, GIB), uid=UID_B))
    fresh = node.new_enforcer()  # plugin restarted without restore
    fresh.release(UID_B)
    assert namespaces(node, "time-slicing") == {ns(UID_A): (GIB, 100)}


def test_release_failure_keeps_claim_for_retry(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.enforcer.apply(plan(device(node.gpus[0], GIB), uid=UID_A))
    node.mps.fail("namespace", "delete", stderr="busy")
    with pytest.raises(MpsError, match="busy"):
        node.enforcer.release(UID_A)
    assert ns(UID_A) in namespaces(node, "time-slicing")
    node.enforcer.release(UID_A)
    assert node.mps.daemons == {}


# --- failures and rollback ----------------------------------------------------------------


@pytest.mark.parametrize("later", [0, 2])
def test_vanished_server_fails_the_claim_and_leaves_nothing(tmp_path: Path, later: int) -> None:
    node = Node(tmp_path, mps_visible=[1], vanish_after_lists=later)
    g = node.gpus[0]
    with pytest.raises(MpsError, match="gpu_0 .* vanished after create"):
        node.enforcer.apply(plan(device(g, GIB), uid=UID_A))
    assert node.mps.daemons == {}
    assert node.nvml.gpus[g.uuid].compute_mode == "DEFAULT"
    assert not node.pipe("time-slicing").exists()
    assert node.enforcer.targets() == []


def test_unknown_gpu_is_refused_before_create(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    del node.nvml.gpus[g.uuid]
    with pytest.raises(MpsError, match="not present"):
        node.enforcer.apply(plan(device(g, GIB), uid=UID_A))
    assert not any(c.startswith("server create") for c in node.mps.commands())


def test_failed_namespace_set_rolls_back_everything(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    node.mps.fail("namespace", "set", stderr="invalid value")
    with pytest.raises(MpsError, match="invalid value"):
        node.enforcer.apply(plan(device(g, GIB), uid=UID_A))
    assert node.mps.daemons == {}
    assert node.nvml.gpus[g.uuid].compute_mode == "DEFAULT"
    assert list((tmp_path / "run").rglob("c_*")) == []


def test_a_failed_reapply_keeps_what_the_claims_pods_use_and_retries(tmp_path: Path) -> None:
    """A claim applied before may have running pods: its re-apply failing (a kubelet's second
    Prepare, a repair) removes nothing of it and terminates none of its clients; it is retried
    by the health check."""
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, GIB), uid=UID_B))
    node.enforcer.apply(plan(device(g, GIB), uid=UID_A))
    busy = node.mps.add_client(node.pipe("time-slicing"), "gpu_0", ns(UID_A))
    node.mps.fail("namespace", "list", times=1)
    with pytest.raises(MpsError):
        node.enforcer.apply(plan(device(g, GIB), uid=UID_A))
    assert namespaces(node, "time-slicing") == {ns(UID_B): (GIB, 100), ns(UID_A): (GIB, 100)}
    assert f"client terminate {busy}" not in node.mps.commands()
    assert {t.claim.uid for t in node.enforcer.targets()} == {UID_B}
    node.enforcer.check_health()
    assert {t.claim.uid for t in node.enforcer.targets()} == {UID_A, UID_B}


def test_compute_mode_permission_error_fails_claim(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.nvml.fail_set_compute_mode = True
    with pytest.raises(MpsError, match="Insufficient Permissions"):
        node.enforcer.apply(plan(device(node.gpus[0], GIB), uid=UID_A))
    assert node.mps.daemons == {}


def test_namespace_readback_mismatch_is_detected(tmp_path: Path) -> None:
    node = Node(tmp_path)

    class Lying:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def run(self, argv, env=None, input=None, timeout=None):  # type: ignore[no-untyped-def]
            done = self.inner.run(argv, env, input, timeout)  # type: ignore[attr-defined]
            if "namespace" in argv and "list" in argv and argv[3].startswith("c_"):
                return type(done)(done.rc, done.stdout.replace(",1G,", ",unlimited,"), done.stderr)
            return done

    enforcer = MpsEnforcer(
        node.tiers, node.nvml, Lying(node.mps), node.options, sleep=lambda s: None
    )
    with pytest.raises(MpsError, match="reports pinned memory limit 'unlimited'"):
        enforcer.apply(plan(device(node.gpus[0], GIB), uid=UID_A))
    assert node.mps.daemons == {}


def test_v2_only_binary_cannot_serve_claims(tmp_path: Path) -> None:
    node = Node(tmp_path, v2_only=True)
    with pytest.raises(MpsError, match="Unsupported protocol version 3"):
        node.enforcer.apply(plan(device(node.gpus[0], GIB), uid=UID_A))
    assert node.mps.daemons == {}
    assert node.nvml.gpus[node.gpus[0].uuid].compute_mode == "DEFAULT"


# --- modes and parameters -----------------------------------------------------------------


def test_mode_conflict_on_one_gpu(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, GIB), uid=UID_A))
    with pytest.raises(MpsError, match="serves time-slicing claims"):
        node.enforcer.apply(plan(device(g, GIB, mode="sm-sharing"), uid=UID_B))
    # the other GPU may run the other mode at the same time
    node.enforcer.apply(plan(device(node.gpus[1], GIB, mode="sm-sharing"), uid=UID_C))
    node.enforcer.release(UID_A)
    node.enforcer.apply(plan(device(g, GIB, mode="sm-sharing"), uid=UID_B))
    assert node.mps.daemon(node.pipe("sm-sharing")).servers.keys() == {"gpu_0", "gpu_1"}
    assert str(node.pipe("time-slicing")) not in node.mps.daemons


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        (lambda g, h: [device(g, GIB, threads=50)], "only sm-sharing GPUs"),
        (lambda g, h: [device(g, GIB, mode="sm-sharing", threads=0)], "not in 1..100"),
        (lambda g, h: [device(g, GIB, mode="sm-sharing", threads=101)], "not in 1..100"),
        (lambda g, h: [device(g, 2 * GIB, GIB)], "above its limit"),
        (lambda g, h: [device(g, 1000, 1000)], "below 1 MiB"),
        (
            lambda g, h: [device(g, GIB), device(h, 2 * GIB, name="gpu-1-quarter-0")],
            "different memory limits",
        ),
        (
            lambda g, h: [
                device(g, GIB),
                device(g, GIB, mode="sm-sharing", name="gpu-0-quarter-1"),
            ],
            "different compute modes",
        ),
    ],
)
def test_parameter_errors_run_nothing(tmp_path: Path, devices, message: str) -> None:  # type: ignore[no-untyped-def]
    node = Node(tmp_path)
    with pytest.raises(MpsError, match=message):
        node.enforcer.apply(plan(*devices(node.gpus[0], node.gpus[1]), uid=UID_A))
    assert node.mps.calls == []
    assert node.nvml.calls == []


def test_devices_of_one_claim_on_one_gpu_share_its_namespace(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    p = plan(
        device(g, 10 * GIB, 20 * GIB, mode="sm-sharing", threads=30, name="gpu-0-quarter-0"),
        device(g, 5 * GIB, 5 * GIB, mode="sm-sharing", threads=40, name="gpu-0-quarter-1"),
        uid=UID_A,
    )
    edits = node.enforcer.apply(p)
    assert namespaces(node, "sm-sharing") == {ns(UID_A): (25 * GIB, 70)}
    a, b = edits["gpu-0-quarter-0"], edits["gpu-0-quarter-1"]
    assert (a.mounts, a.hooks[:-1]) == (b.mounts, b.hooks[:-1])
    # each device counts its own consumers (a container that gets both is in both)
    assert (a.hooks[-1].args[4], b.hooks[-1].args[4]) == (
        str(node.options.user_record_root / UID_A / "gpu-0-quarter-0"),
        str(node.options.user_record_root / UID_A / "gpu-0-quarter-1"),
    )
    # the namespace holds both; each device's containers are held to that device's own share
    # (extended resources map each container to its own request: kubernetes#134880)
    assert {e for e in a.env if e.startswith("NVIDIA_GPU_MEMORY")} == {
        "NVIDIA_GPU_MEMORY_REQUEST=10240",
        "NVIDIA_GPU_MEMORY_LIMIT=20480",
    }
    assert {e for e in b.env if e.startswith("NVIDIA_GPU_MEMORY")} == {
        "NVIDIA_GPU_MEMORY_REQUEST=5120",
        "NVIDIA_GPU_MEMORY_LIMIT=5120",
    }


def test_multi_gpu_claim_without_mps_is_allowed(tmp_path: Path) -> None:
    node = Node(tmp_path, tiers={0: "none", 1: "none"})
    p = plan(
        device(node.gpus[0], GIB), device(node.gpus[1], GIB, name="gpu-1-quarter-0"), uid=UID_A
    )
    edits = node.enforcer.apply(p)
    assert set(edits) == {"gpu-0-quarter-0", "gpu-1-quarter-0"}


def test_plan_targets_and_edits_are_pure() -> None:
    from tests.support.fakes.plans import gpu

    g = gpu(3)
    p = plan(device(g, 3 * GIB + 123, 7 * GIB + 456, name="gpu-3-half-0"), uid=UID_A)
    (t,) = targets_for_claim(p, {g.uuid: "hard"})
    assert (t.server, t.namespace, t.threads) == ("gpu_3", ns(UID_A), 100)
    e = target_edits(
        t, "/x/pipe/gpu_3/ns", MpsOptions(driver_root="/run/nvidia/driver", record_cgroups=False)
    )
    assert "NVIDIA_GPU_MEMORY_REQUEST=3072" in e.env and "NVIDIA_GPU_MEMORY_LIMIT=7168" in e.env
    assert len(e.hooks) == 2 and e.hooks[0].args[3] == "/run/nvidia/driver"
    assert e.hooks[1].args[3] == "gpu-fraction-consumer"


def test_max_consumers_divide_the_per_container_limits() -> None:
    from tests.support.fakes.plans import gpu

    g = gpu(3)
    d = replace(device(g, 3 * GIB, 7 * GIB, name="gpu-3-half-0"), max_consumers=3)
    (t,) = targets_for_claim(plan(d, uid=UID_A), {g.uuid: "hard"})
    e = target_edits(t, "/x/pipe/gpu_3/ns", MpsOptions(record_cgroups=False))
    assert "NVIDIA_GPU_MEMORY_REQUEST=1024" in e.env and "NVIDIA_GPU_MEMORY_LIMIT=2389" in e.env
    gate = e.hooks[-1]
    assert gate.args[3:6] == ("gpu-fraction-consumer", "/run/gpu-fraction/users/" + UID_A, "3")
    assert "each may hold 2389 MiB of its 7168 MiB ceiling on GPU 3" in gate.args[-1]


def test_a_ceiling_too_small_to_divide_is_refused() -> None:
    from tests.support.fakes.plans import gpu

    g = gpu(0)
    d = replace(device(g, 0, 2 * MIB, name="gpu-0-eighth-0"), max_consumers=3)
    with pytest.raises(MpsError, match="cannot be divided among maxConsumers 3"):
        targets_for_claim(plan(d, uid=UID_A), {g.uuid: "hard"})


# --- supervision, crash recovery, restore -------------------------------------------------


def test_daemon_crash_is_repaired_by_health_check(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g0, g1 = node.gpus
    node.enforcer.apply(plan(device(g0, 10 * GIB, 16 * GIB), uid=UID_A))
    node.enforcer.apply(plan(device(g0, 4 * GIB), uid=UID_B))
    node.enforcer.apply(plan(device(g1, 2 * GIB), uid=UID_C))
    pipe = node.pipe("time-slicing")
    assert {h.healthy for h in node.enforcer.check_health().values()} == {True}
    node.mps.crash(pipe)
    with capture_logs() as logs:
        health = node.enforcer.check_health()
    assert node.enforcer.daemon_restarts == 1
    assert {u: h.healthy for u, h in health.items()} == {g0.uuid: True, g1.uuid: True}
    assert namespaces(node, "time-slicing", "gpu_0") == {
        ns(UID_A): (16 * GIB, 100),
        ns(UID_B): (4 * GIB, 100),
    }
    assert namespaces(node, "time-slicing", "gpu_1") == {ns(UID_C): (2 * GIB, 100)}
    assert sum(c.startswith("-p 3 -m -d") for c in node.mps.commands()) == 2
    assert any(entry["event"].startswith("MPS control daemon not answering") for entry in logs)


def test_vanished_server_and_namespace_are_recreated(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, 3 * GIB), uid=UID_A))
    d = node.mps.daemon(node.pipe("time-slicing"))
    d.servers.pop("gpu_0")
    node.enforcer.check_health()
    assert namespaces(node, "time-slicing") == {ns(UID_A): (3 * GIB, 100)}
    d.servers["gpu_0"].namespaces.clear()
    node.enforcer.check_health()
    assert namespaces(node, "time-slicing") == {ns(UID_A): (3 * GIB, 100)}
    assert node.enforcer.daemon_restarts == 0


def test_unrepairable_server_reports_unhealthy(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, GIB), uid=UID_A))
    node.mps.visible_gpus.clear()  # e.g. the GPU fell off the bus
    node.mps.daemon(node.pipe("time-slicing")).servers.pop("gpu_0")
    health = node.enforcer.check_health()
    assert health[g.uuid].healthy is False and "vanished" in health[g.uuid].detail


def test_restore_after_plugin_restart(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g0, g1 = node.gpus
    a = plan(device(g0, 6 * GIB, 9 * GIB), uid=UID_A)
    b = plan(device(g1, 2 * GIB, mode="sm-sharing", threads=25), uid=UID_B)
    node.enforcer.apply(a)
    node.enforcer.apply(b)
    node.mps.crash(node.pipe("time-slicing"))
    node.mps.crash(node.pipe("sm-sharing"))
    fresh = node.new_enforcer()
    fresh.restore([a, b])
    assert namespaces(node, "time-slicing", "gpu_0") == {ns(UID_A): (9 * GIB, 100)}
    assert namespaces(node, "sm-sharing", "gpu_1") == {ns(UID_B): (2 * GIB, 25)}
    edits = fresh.apply(a)
    assert edits["gpu-0-quarter-0"].mounts[0].host_path.endswith(f"gpu_0/{ns(UID_A)}")


def test_restore_removes_orphans_and_resets_compute_modes(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g0, g1 = node.gpus
    a = plan(device(g0, GIB), uid=UID_A)
    node.enforcer.apply(a)
    node.enforcer.apply(plan(device(g0, GIB), uid=UID_B))
    node.enforcer.apply(plan(device(g1, GIB), uid=UID_C))
    pipe = node.pipe("time-slicing")
    busy = node.mps.add_client(pipe, "gpu_0", ns(UID_B))
    fresh = node.new_enforcer()
    fresh.restore([a])
    assert namespaces(node, "time-slicing") == {ns(UID_A): (GIB, 100)}
    assert "gpu_1" not in node.mps.daemon(pipe).servers
    assert f"client terminate {busy}" in node.mps.commands()
    assert node.nvml.gpus[g1.uuid].compute_mode == "DEFAULT"
    assert node.nvml.gpus[g0.uuid].compute_mode == "EXCLUSIVE_PROCESS"
    fresh.restore([])
    assert node.mps.daemons == {}
    assert node.nvml.gpus[g0.uuid].compute_mode == "DEFAULT"


def test_failed_restore_is_retried_by_health_check(tmp_path: Path) -> None:
    node = Node(tmp_path)
    a = plan(device(node.gpus[0], GIB), uid=UID_A)
    node.mps.fail("-p", "3", stderr="daemon start failed", times=1)
    fresh = node.new_enforcer()
    fresh.restore([a])
    assert fresh.targets() == []
    fresh.check_health()
    assert [t.claim.uid for t in fresh.targets()] == [UID_A]
    assert namespaces(node, "time-slicing") == {ns(UID_A): (GIB, 100)}


def test_a_first_prepare_that_fails_removes_what_it_made_and_no_one_elses_server(
    tmp_path: Path,
) -> None:
    """A claim new to this process fails on a GPU whose shared server serves clients of claims
    it does not hold (the other plugin pod's): its namespace (made by this call) is removed,
    the server with their clients is kept; the server delete is refused, never forced."""
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, GIB), uid=UID_A))
    busy = node.mps.add_client(node.pipe("time-slicing"), "gpu_0", ns(UID_A))
    other = node.new_enforcer()  # knows nothing of UID_A
    node.mps.fail("namespace", "set", stderr="invalid value")
    with pytest.raises(MpsError, match="invalid value"):
        other.apply(plan(device(g, GIB), uid=UID_B))
    assert namespaces(node, "time-slicing") == {ns(UID_A): (GIB, 100)}
    cmds = node.mps.commands()
    assert f"client terminate {busy}" not in cmds and "server delete gpu_0 --force" not in cmds
    assert "server delete gpu_0" in cmds  # tried, refused: clients attached


@pytest.mark.parametrize("how", ["restore", "second Prepare"])
def test_a_namespace_made_by_a_failed_reapply_never_serves_uncapped(
    tmp_path: Path, how: str
) -> None:
    """Found by review: MPS lost a claim's namespace; the restore (or a second Prepare)
    created it again and its namespace set failed. The namespace was kept without limits, the
    claim's running pod attached to it, and every retry refused to re-set it (clients
    attached). Now what the failed call made is removed, and a namespace found without a
    memory limit has its clients terminated and its limits set, as one just made."""
    node = Node(tmp_path)
    g = node.gpus[0]
    a = plan(device(g, GIB), uid=UID_A)
    node.enforcer.apply(a)
    pipe = node.pipe("time-slicing")
    del node.mps.daemon(pipe).servers["gpu_0"].namespaces[ns(UID_A)]
    enforcer = node.new_enforcer() if how == "restore" else node.enforcer
    node.mps.fail("namespace", "set", stderr="transient failure")
    if how == "restore":
        enforcer.restore([a])
    else:
        with pytest.raises(MpsError, match="transient failure"):
            enforcer.apply(a)
    assert ns(UID_A) not in namespaces(node, "time-slicing")
    enforcer.check_health()
    assert namespaces(node, "time-slicing") == {ns(UID_A): (GIB, 100)}
    assert [t.claim.uid for t in enforcer.targets()] == [UID_A]


def test_a_namespace_found_without_limits_has_its_clients_terminated(tmp_path: Path) -> None:
    """A namespace without a memory limit (made by a call that failed before its limits, in
    a process that died then) serves its clients uncapped: a restore ends them and sets the
    limits."""
    node = Node(tmp_path)
    g = node.gpus[0]
    a = plan(device(g, GIB), uid=UID_A)
    node.enforcer.apply(a)
    pipe = node.pipe("time-slicing")
    space = node.mps.daemon(pipe).servers["gpu_0"].namespaces[ns(UID_A)]
    space.pinned = space.threads = None
    uncapped = node.mps.add_client(pipe, "gpu_0", ns(UID_A))
    node.new_enforcer().restore([a])
    assert f"client terminate {uncapped}" in node.mps.commands()
    assert namespaces(node, "time-slicing") == {ns(UID_A): (GIB, 100)}


def test_a_kept_server_keeps_its_gpus_compute_mode(tmp_path: Path) -> None:
    """Found by review: a shared server kept because clients of claims this process does not
    hold are attached had its GPU set back to DEFAULT under them."""
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, GIB), uid=UID_A))
    node.mps.add_client(node.pipe("time-slicing"), "gpu_0", ns(UID_A))
    other = node.new_enforcer()
    node.mps.fail("namespace", "set", stderr="invalid value")
    with pytest.raises(MpsError):
        other.apply(plan(device(g, GIB), uid=UID_B))
    assert "gpu_0" in node.mps.daemon(node.pipe("time-slicing")).servers
    assert node.nvml.gpus[g.uuid].compute_mode == "EXCLUSIVE_PROCESS"


def test_a_pending_claim_counts_in_the_mode_conflict_check(tmp_path: Path) -> None:
    """Found by review: a claim whose second Prepare failed (pending, its namespace kept with
    its pod's client) was not seen by the mode check, and a claim of the other mode was
    applied on its GPU."""
    node = Node(tmp_path)
    g = node.gpus[0]
    a = plan(device(g, GIB), uid=UID_A)
    node.enforcer.apply(a)
    node.mps.add_client(node.pipe("time-slicing"), "gpu_0", ns(UID_A))
    node.mps.fail("namespace", "list", times=1)
    with pytest.raises(MpsError):
        node.enforcer.apply(a)
    with pytest.raises(MpsError, match="time-slicing"):
        node.enforcer.apply(plan(device(g, GIB, mode="sm-sharing"), uid=UID_B))
    node.enforcer.check_health()
    assert [t.claim.uid for t in node.enforcer.targets()] == [UID_A]


def test_the_release_of_a_pending_claim_retires_its_idle_server(tmp_path: Path) -> None:
    """Found by review: a pending claim's Unprepare removed its namespace but left its GPU's
    server running with no claim."""
    node = Node(tmp_path)
    g = node.gpus[0]
    a = plan(device(g, GIB), uid=UID_A)
    node.enforcer.apply(a)
    node.mps.fail("namespace", "list", times=1)
    with pytest.raises(MpsError):
        node.enforcer.apply(a)
    node.enforcer.release(UID_A)
    assert node.mps.daemons == {}
    assert node.nvml.gpus[g.uuid].compute_mode == "DEFAULT"


def test_a_restore_under_another_default_sm_percentage_ends_no_tenants_work(
    tmp_path: Path,
) -> None:
    """A rolling update that changes the default active thread percentage: the new plugin's
    restore finds the claim's namespace with the old percentage and the pod's client attached.
    Found by review: the refused repair rolled the claim back (namespace removed, client
    terminated) and, the claim not applied, the restore deleted its server and stopped the
    daemon. Now nothing of it is touched; the claim stays pending, the error says to restart
    its pods, and once they are gone the health check sets the new limits."""
    node = Node(tmp_path)
    g = node.gpus[0]
    a = plan(device(g, GIB, mode="sm-sharing"), uid=UID_A)
    node.enforcer.apply(a)
    pipe = node.pipe("sm-sharing")
    busy = node.mps.add_client(pipe, "gpu_0", ns(UID_A))
    opts = replace(node.options, default_active_thread_percentage=50)
    upgraded = MpsEnforcer(node.tiers, node.nvml, node.mps, opts, sleep=node.sleeps.append)
    with capture_logs() as logs:
        upgraded.restore([a])
        upgraded.check_health()
    assert f"client terminate {busy}" not in node.mps.commands()
    assert namespaces(node, "sm-sharing") == {ns(UID_A): (GIB, 100)}
    assert node.nvml.gpus[g.uuid].compute_mode == "EXCLUSIVE_PROCESS"
    errors = [e for e in logs if e["log_level"] == "error"]
    assert errors and "restart the claim's pods" in errors[0]["error"]
    node.mps.daemon(pipe).clients.clear()  # its pods restarted elsewhere
    upgraded.check_health()
    assert namespaces(node, "sm-sharing") == {ns(UID_A): (GIB, 50)}
    assert [t.claim.uid for t in upgraded.targets()] == [UID_A]


# --- a tenant faster than the limits --------------------------------------------------------


def test_a_client_attached_before_the_limits_are_set_is_terminated_first(
    tmp_path: Path,
) -> None:
    """A new namespace has no limits until ``namespace set``, which fails while a client is
    attached; a tenant that keeps retrying (after a repair, say) can attach in between and
    would run without its limits. The MPS emulator showed it; the fake reproduces it: such a
    client is terminated (it may attach again, then under the limits) and the limits are set."""
    node = Node(tmp_path)
    p = plan(device(node.gpus[0], 10 * GIB, 20 * GIB), uid=UID_A)
    real = node.mps.run
    early: list[int] = []

    def run(argv, env=None, input=None, timeout=None):  # type: ignore[no-untyped-def]
        done = real(argv, env, input, timeout)
        if list(argv[1:3]) == ["namespace", "create"] and not early:
            server = next(a.split("=", 1)[1] for a in argv if a.startswith("--server="))
            early.append(node.mps.add_client(env["CUDA_MPS_PIPE_DIRECTORY"], server, argv[3]))
        return done

    node.mps.run = run  # type: ignore[method-assign]
    with capture_logs() as logs:
        node.enforcer.apply(p)
    assert early
    assert namespaces(node, "time-slicing")[ns(UID_A)] == (20 * GIB, 100)
    daemon = node.mps.daemon(node.pipe("time-slicing"))
    assert all(c.pid != early[0] for c in daemon.clients)
    assert any("before its limits were set" in e["event"] for e in logs)


def test_an_unusable_mps_directory_is_said_in_a_users_terms(tmp_path: Path) -> None:
    """Directory errors on the MPS root reached the kubelet as raw errno text
    ("[Errno 20] Not a directory: ...")."""
    node = Node(tmp_path)
    marker = node.tmp / "run" / "mps" / "compute-mode"
    marker.parent.mkdir(parents=True)
    marker.write_text("a file where the markers' directory goes\n")
    with pytest.raises(MpsError) as err:
        node.enforcer.apply(plan(device(node.gpus[0], GIB), uid=UID_A))
    message = str(err.value)
    assert "Errno" not in message
    assert f"the node's MPS directory {marker}/" in message and "(not a directory)" in message
    assert "--mps-root" in message
    assert node.mps.daemons == {}  # rolled back


def test_a_claim_joining_a_running_server_costs_five_commands(tmp_path: Path) -> None:
    """Prepare of a new claim on a GPU whose server this process saw Ready moments ago: its
    namespace made at once, its limits set and read back; Unprepare: its clients listed (and
    terminated) and the namespace deleted. Before: 7 (a ``server list`` and a ``namespace
    list`` first), and 10 before that."""
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, 10 * GIB, 10 * GIB), uid=UID_A))
    before = len(node.mps.commands())
    node.enforcer.apply(plan(device(g, 10 * GIB, 10 * GIB), uid=UID_B))
    node.enforcer.release(UID_B)
    assert node.mps.commands()[before:] == [
        f"namespace create {ns(UID_B)} --server=gpu_0",
        f"namespace set {ns(UID_B)} --server=gpu_0 --pinned-memory-limit=10240M "
        "--active-thread-percentage=100",
        f"namespace list {ns(UID_B)} --server=gpu_0 {CSV}",
        f"client list --server=gpu_0 {CSV}",
        f"namespace delete {ns(UID_B)} --server=gpu_0 --force",
    ]
    assert set(namespaces(node, "time-slicing")) == {ns(UID_A)}


def test_a_server_seen_long_ago_is_listed_first(tmp_path: Path) -> None:
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, GIB), uid=UID_A))
    node.enforcer._objects.clock = lambda: time.monotonic() + RECENT_S  # type: ignore[method-assign]
    before = len(node.mps.commands())
    node.enforcer.apply(plan(device(g, GIB), uid=UID_B))
    assert node.mps.commands()[before:][:2] == [
        f"server list {CSV}",
        f"namespace list --server=gpu_0 {CSV}",
    ]


def test_a_server_gone_since_it_was_seen_is_made_again(tmp_path: Path) -> None:
    """The create on a server seen moments ago is refused (it was deleted by hand): the full
    path lists, re-creates the server and then the namespace; the claim is prepared."""
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, GIB), uid=UID_A))
    del node.mps.daemon(node.pipe("time-slicing")).servers["gpu_0"]
    before = len(node.mps.commands())
    node.enforcer.apply(plan(device(g, 2 * GIB), uid=UID_B))
    done = node.mps.commands()[before:]
    assert done[:2] == [f"namespace create {ns(UID_B)} --server=gpu_0", f"server list {CSV}"]
    assert namespaces(node, "time-slicing", "gpu_0") == {ns(UID_B): (2 * GIB, 100)}


def test_restore_and_repairs_list_before_they_create(tmp_path: Path) -> None:
    """A restored claim's namespace may be there with its pod's clients: never created
    blindly, even on a server just seen."""
    node = Node(tmp_path)
    g = node.gpus[0]
    a = plan(device(g, GIB), uid=UID_A)
    node.enforcer.apply(a)
    fresh = node.new_enforcer()
    fresh.apply(plan(device(g, GIB), uid=UID_B))  # fresh has now seen gpu_0 Ready
    before = len(node.mps.commands())
    fresh.restore([a, plan(device(g, GIB), uid=UID_B)])
    restored = node.mps.commands()[before:]
    assert f"namespace create {ns(UID_A)} --server=gpu_0" not in restored
    assert f"namespace list --server=gpu_0 {CSV}" in restored


def test_an_mps_that_accepts_a_namespace_twice_terminates_nobody(tmp_path: Path) -> None:
    """Not seen with the emulator, not verified on hardware: should MPS accept ``namespace
    create`` of a namespace that exists, a blind create of a claim this process does not hold
    (the other plugin pod of a rolling update prepared it) finds its pod's client attached and
    ``namespace set`` refused. That client is not an early one: the namespace already has the
    claim's limits, so it is taken as it is and nobody is terminated."""
    node = Node(tmp_path)
    g = node.gpus[0]
    a = plan(device(g, GIB), uid=UID_A)
    node.enforcer.apply(a)
    pipe = node.pipe("time-slicing")
    tenant = node.mps.add_client(pipe, "gpu_0", ns(UID_A))
    other = node.new_enforcer()
    other.apply(plan(device(g, GIB), uid=UID_B))  # it has seen gpu_0 Ready
    real = node.mps.run

    def run(argv, env=None, input=None, timeout=None):  # type: ignore[no-untyped-def]
        if list(argv[1:4]) == ["namespace", "create", ns(UID_A)]:
            return real([argv[0], "server", "list", CSV], env, input, timeout)
        return real(argv, env, input, timeout)

    node.mps.run = run  # type: ignore[method-assign]
    other.apply(a)
    assert f"client terminate {tenant}" not in node.mps.commands()
    assert any(c.pid == tenant for c in node.mps.daemon(pipe).clients)
    assert namespaces(node, "time-slicing")[ns(UID_A)] == (GIB, 100)


def test_an_early_client_of_a_blindly_created_namespace_is_terminated(tmp_path: Path) -> None:
    """The fast path keeps the guard of a new namespace: a client attached before its limits
    were set (it has none) is terminated and the limits set."""
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, GIB), uid=UID_A))
    real = node.mps.run
    early: list[int] = []

    def run(argv, env=None, input=None, timeout=None):  # type: ignore[no-untyped-def]
        done = real(argv, env, input, timeout)
        if list(argv[1:4]) == ["namespace", "create", ns(UID_B)] and not early:
            early.append(node.mps.add_client(env["CUDA_MPS_PIPE_DIRECTORY"], "gpu_0", argv[3]))
        return done

    node.mps.run = run  # type: ignore[method-assign]
    node.enforcer.apply(plan(device(g, 2 * GIB), uid=UID_B))
    assert early and f"client terminate {early[0]}" in node.mps.commands()
    assert namespaces(node, "time-slicing")[ns(UID_B)] == (2 * GIB, 100)


def test_release_of_a_namespace_already_gone_lists_it_and_succeeds(tmp_path: Path) -> None:
    """The namespace vanished before the release (deleted by hand, a crash between MPS and the
    records): the refused delete is followed by a list that shows it gone, and the claim is
    released; the neighbour's namespace stays."""
    node = Node(tmp_path)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, 10 * GIB, 10 * GIB), uid=UID_A))
    node.enforcer.apply(plan(device(g, 10 * GIB, 10 * GIB), uid=UID_B))
    d = node.mps.daemon(node.pipe("time-slicing"))
    del d.servers["gpu_0"].namespaces[ns(UID_B)]
    node.enforcer.release(UID_B)
    assert node.mps.commands()[-1] == f"namespace list --server=gpu_0 {CSV}"
    assert set(namespaces(node, "time-slicing")) == {ns(UID_A)}
    assert UID_B not in node.enforcer._claims


def test_a_blind_create_on_a_drifted_namespace_is_a_drift_not_early_clients(
    tmp_path: Path,
) -> None:
    """Found by review. Should MPS accept a namespace twice (unverified), a claim the other
    plugin pod of a rolling update prepared, under another default SM percentage, reaches
    this process blind: its namespace has limits, not the ones planned here, and the pod's
    client is attached. That is a drift with clients attached, refused as a restore or a
    repair refuses it (the message says to restart the pods), not clients attached before
    the limits were set (which were terminated and the limits re-set under them). The failed
    apply rolls back only what it made: the namespace, there before, stays with its client
    (it removed both until a later review)."""
    node = Node(tmp_path)
    g = node.gpus[0]
    a = plan(device(g, GIB, mode="sm-sharing"), uid=UID_A)
    node.enforcer.apply(a)
    pipe = node.pipe("sm-sharing")
    node.mps.add_client(pipe, "gpu_0", ns(UID_A))
    opts = replace(node.options, default_active_thread_percentage=50)
    other = MpsEnforcer(node.tiers, node.nvml, node.mps, opts, sleep=node.sleeps.append)
    other.apply(plan(device(g, GIB, mode="sm-sharing"), uid=UID_B))  # it has seen gpu_0 Ready
    real = node.mps.run

    def run(argv, env=None, input=None, timeout=None):  # type: ignore[no-untyped-def]
        if list(argv[1:4]) == ["namespace", "create", ns(UID_A)]:
            return real([argv[0], "server", "list", CSV], env, input, timeout)
        return real(argv, env, input, timeout)

    node.mps.run = run  # type: ignore[method-assign]
    before = len(node.mps.commands())
    with pytest.raises(MpsError, match="expected 50, and 1 client\\(s\\) attached"):
        other.apply(a)
    after = node.mps.commands()[before:]
    sets = [c for c in after if c.startswith("namespace set")]
    assert len(sets) == 1  # the refused first set; never re-set after terminating
    assert not [c for c in after if c.startswith(("client terminate", "namespace delete"))]
    assert ns(UID_A) in namespaces(node, "sm-sharing") and node.mps.daemon(pipe).clients


def test_a_claim_joining_blindly_records_no_server_pid(tmp_path: Path) -> None:
    """Found by review: a server replaced by someone else (the MPS node service after a daemon
    restart) less than 30 s after this process saw it; a new claim joining it blindly recorded
    the old PID, and the next health check told its pods they had lost their MPS server. Now
    its PID is unknown until a list: only the claim whose server really was replaced is told."""
    node = Node(tmp_path)
    got: list[Any] = []
    node.enforcer.report_outages(got.extend)
    g = node.gpus[0]
    node.enforcer.apply(plan(device(g, GIB), uid=UID_A))
    env, binary = node.mps.envs[-1], node.mps.calls[-1][0]
    for args in (
        ["server", "delete", "gpu_0", "--force"],
        ["server", "create", "gpu_0", "--uid=0", f"--allowed-devices={g.uuid}"],
    ):
        assert node.mps.run([binary, *args], env).ok, args
    node.enforcer.apply(plan(device(g, GIB), uid=UID_B))
    node.enforcer.check_health()
    assert [o.claim.uid for o in got] == [UID_A]
