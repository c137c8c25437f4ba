"""Simulated node hardware: device nodes a runtime can stat, a recording hook runc can run."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from dra_driver.enforce.recording import RecordingEnforcer
from dra_driver.enforce.rules.targets import MpsOptions
from dra_driver.gpus import open_source, simnode
from tests.support.fakes.plans import GIB, Node, device, plan

GPUS = open_source("simulated:H200x2", seed="n1").discover().gpus

needs_mknod = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


def test_device_numbers_are_nvidias() -> None:
    nums = simnode.device_numbers(GPUS)
    assert nums["/dev/nvidia0"] == (195, GPUS[0].minor)
    assert nums["/dev/nvidia1"] == (195, GPUS[1].minor)
    assert nums["/dev/nvidiactl"] == (195, 255)
    assert nums["/dev/nvidia-uvm"] == (simnode.UVM_MAJOR, 0)
    assert nums["/dev/nvidia-uvm-tools"] == (simnode.UVM_MAJOR, 1)


@needs_mknod
def test_install_makes_character_devices_and_is_idempotent(tmp_path: Path) -> None:
    node = simnode.install(tmp_path / "sim", GPUS)
    dev = node.device_root / "dev"
    for name, (major, minor) in simnode.device_numbers(GPUS).items():
        st = (node.device_root / name.lstrip("/")).lstat()
        assert stat.S_ISCHR(st.st_mode), name
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor)
    # A wrong file at a node's path is replaced; a right node is kept (same inode).
    (dev / "nvidia0").unlink()
    (dev / "nvidia0").write_text("not a device")
    inode = (dev / "nvidiactl").stat().st_ino
    simnode.install(tmp_path / "sim", GPUS)
    assert stat.S_ISCHR((dev / "nvidia0").lstat().st_mode)
    assert (dev / "nvidiactl").stat().st_ino == inode
    assert os.access(node.hook_path, os.X_OK)


def _run_hook(
    hook: Path, bundle: Path, container_id: str, gpu: str
) -> subprocess.CompletedProcess[str]:
    state = {"ociVersion": "1.2.0", "id": container_id, "status": "creating", "pid": 1,
             "bundle": str(bundle)}  # fmt: skip
    return subprocess.run(
        [str(hook), "apply-cuda-memory-limits", "--driver-root", "/", "--gpu-id", gpu],
        input=json.dumps(state),
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.integration  # starts a real process
@needs_mknod
def test_recording_hook_writes_args_and_memory_env(tmp_path: Path) -> None:
    node = simnode.install(tmp_path / "sim", GPUS)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    env = ["PATH=/bin", "NVIDIA_GPU_MEMORY_REQUEST=17971", "NVIDIA_GPU_MEMORY_LIMIT=24576"]
    (bundle / "config.json").write_text(json.dumps({"process": {"env": env}}))
    done = _run_hook(node.hook_path, bundle, "abc123", GPUS[0].uuid)
    assert done.returncode == 0, done.stderr
    record = (node.records / f"abc123.{GPUS[0].uuid}").read_text().splitlines()
    assert "container=abc123" in record
    assert f"gpu={GPUS[0].uuid}" in record
    assert "NVIDIA_GPU_MEMORY_REQUEST=17971" in record
    assert "NVIDIA_GPU_MEMORY_LIMIT=24576" in record
    assert any(line.startswith("args=apply-cuda-memory-limits --driver-root /") for line in record)


@pytest.mark.integration  # starts a real process
@needs_mknod
def test_recording_hook_never_fails_the_container(tmp_path: Path) -> None:
    node = simnode.install(tmp_path / "sim", GPUS)
    done = _run_hook(node.hook_path, tmp_path / "no-bundle", "x", GPUS[0].uuid)
    assert done.returncode == 0
    record = (node.records / f"x.{GPUS[0].uuid}").read_text().splitlines()
    assert "NVIDIA_GPU_MEMORY_LIMIT=" in record  # recorded as absent, container not failed


@pytest.mark.parametrize("make_dirs", [True, False])
def test_recording_enforcer_creates_and_removes_pipe_dirs(tmp_path: Path, make_dirs: bool) -> None:
    node = Node(tmp_path, count=2)
    enforcer = RecordingEnforcer(
        options=MpsOptions(root=str(tmp_path / "run")), make_dirs=make_dirs
    )
    p = plan(device(node.gpus[0], 8 * GIB, name="a"), device(node.gpus[1], 8 * GIB, name="b"))
    edits = enforcer.apply(p)
    mounts = {m.host_path for e in edits.values() for m in e.mounts}
    assert mounts  # one dedicated MPS server for a multi-GPU claim: one pipe directory
    assert all(Path(m).is_dir() == make_dirs for m in mounts)
    enforcer.release(p.claim.uid)
    assert not any(Path(m).exists() for m in mounts)
    enforcer.restore([p])  # after a plugin restart the directories come back
    assert all(Path(m).is_dir() == make_dirs for m in mounts)


def test_lost_gpus_file_takes_gpus_away_and_back(tmp_path: Path) -> None:
    from dra_driver.gpus import SimulatedGpuSource

    lost = tmp_path / simnode.LOST_GPUS
    source = SimulatedGpuSource("simulated:H200x3", seed="n1", lost_file=lost)
    assert [g.index for g in source.discover().gpus] == [0, 1, 2]
    lost.write_text("1\n")
    assert [g.index for g in source.discover().gpus] == [0, 2]
    lost.write_text("not a number")  # malformed: nothing lost, no crash
    assert [g.index for g in source.discover().gpus] == [0, 1, 2]
    lost.unlink()
    source.vanished.add(0)
    assert [g.index for g in source.discover().gpus] == [1, 2]


def test_the_hook_stand_in_records_its_gpu_and_the_containers_memory_variables(
    tmp_path: Path,
) -> None:
    """Run as runc runs a createRuntime hook: the OCI state (compact JSON) on stdin."""
    hook = tmp_path / "bin" / simnode.HOOK_NAME
    hook.parent.mkdir()
    hook.write_text(simnode.hook_script(tmp_path / "records"))
    hook.chmod(0o755)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    env = ["PATH=/bin", "NVIDIA_GPU_MEMORY_REQUEST=1024", "NVIDIA_GPU_MEMORY_LIMIT=2048"]
    (bundle / "config.json").write_text(json.dumps({"process": {"env": env}}))
    state = {"ociVersion": "1.2.0", "id": "ctr1", "pid": 1, "bundle": str(bundle)}
    args = ["apply-cuda-memory-limits", "--driver-root", "/", "--gpu-id", GPUS[0].uuid]
    done = subprocess.run(
        [str(hook), *args], input=json.dumps(state, separators=(",", ":")), text=True
    )
    assert done.returncode == 0
    record = (tmp_path / "records" / f"ctr1.{GPUS[0].uuid}").read_text().splitlines()
    assert record == [
        "container=ctr1",
        f"args={' '.join(args)}",
        f"gpu={GPUS[0].uuid}",
        "NVIDIA_GPU_MEMORY_REQUEST=1024",
        "NVIDIA_GPU_MEMORY_LIMIT=2048",
    ]
    # garbage on stdin never fails the container
    assert subprocess.run([str(hook), *args], input="not json", text=True).returncode == 0
