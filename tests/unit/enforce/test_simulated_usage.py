"""Usage on simulated nodes: the MPS emulator's rules (:func:`simusage.grant`), its usage
files, and the simulated NVML answering from them (processes, SM utilization, per-cgroup
memory in use)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dra_driver.enforce.mps.nvmlcontrol import MpsProcess
from dra_driver.enforce.mps.simnvml import SimulatedNvml, cgroup_within
from dra_driver.model import simusage
from dra_driver.mpsemu.probe import quantity_bytes

GIB = 1 << 30
GPU_A, GPU_B = "GPU-a", "GPU-b"


def test_grant_holds_a_client_to_its_namespace() -> None:
    assert simusage.grant(2 * GIB, 40, 4 * GIB, 50) == (2 * GIB, 40)
    assert simusage.grant(4 * GIB, 80, 4 * GIB, 50) == (4 * GIB, 50)  # SMs: a ceiling
    assert simusage.grant(2 * GIB, 40, None, None) == (2 * GIB, 40)  # unlimited namespace
    refused = simusage.grant(4 * GIB + 1, 10, 4 * GIB, 50)
    assert isinstance(refused, str) and refused.startswith("CUDA_ERROR_OUT_OF_MEMORY")
    assert isinstance(simusage.grant(-1, 10, None, None), str)
    assert isinstance(simusage.grant(1, 101, None, None), str)


def test_usage_file_round_trip_and_garbage() -> None:
    use = simusage.ServerUse(
        (GPU_A,), (simusage.ClientUse(7, "c_x", GIB, 12.5), simusage.ClientUse(8, "c_y", 0, 0))
    )
    assert simusage.parse(simusage.render(use)) == use
    for bad in (b"", b"{", b'{"gpus": []}', b'{"gpus": [], "clients": [{"pid": 1}]}'):
        with pytest.raises(ValueError, match="not an emulated MPS usage file"):
            simusage.parse(bad)


@pytest.mark.parametrize(
    ("own", "directory", "inside"),
    [
        ("/kubepods/pod1/ctr1", "/sys/fs/cgroup/kubepods/pod1/ctr1", True),
        ("/kubepods/pod1/ctr1/sub", "/sys/fs/cgroup/kubepods/pod1/ctr1", True),
        ("/../../kubepods/pod1/ctr1", "/host/sys/fs/cgroup/kubepods/pod1/ctr1", True),
        ("/kubepods/pod1/ctr2", "/sys/fs/cgroup/kubepods/pod1/ctr1", False),
        ("/kubepods/pod1", "/sys/fs/cgroup/kubepods/pod1/ctr1", False),
        ("/kubepods/pod1/ctr10", "/sys/fs/cgroup/kubepods/pod1/ctr1", False),
        ("/", "/sys/fs/cgroup/kubepods/pod1/ctr1", False),
        ("", "/sys/fs/cgroup/ctr1", False),
    ],
)
def test_cgroup_within(own: str, directory: str, inside: bool) -> None:
    assert cgroup_within(own, directory) is inside


def write_usage(pipe: Path, server: str, use: simusage.ServerUse) -> None:
    (pipe / server).mkdir(parents=True, exist_ok=True)
    (pipe / server / simusage.USAGE_FILE).write_bytes(simusage.render(use))


def test_simulated_nvml_answers_from_the_servers_usage_files(tmp_path: Path) -> None:
    pipes = [tmp_path / "ts/pipe", tmp_path / "sm/pipe"]
    proc = tmp_path / "proc"
    for pid, cgroup in ((7, "/kubepods/pod1/ctr1"), (8, "/kubepods/pod2/ctr1")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(f"0::{cgroup}\n")
    nvml = SimulatedNvml(tmp_path / "nvml", lambda: [GPU_A, GPU_B], pipes, proc)
    assert nvml.mps_processes(GPU_A) == [] and nvml.process_sm_utilization(GPU_A) == {}
    write_usage(
        pipes[0],
        "gpu_0",
        simusage.ServerUse((GPU_A,), (simusage.ClientUse(7, "c_x", 2 * GIB, 40),)),
    )
    write_usage(
        pipes[1],
        "m_two",
        simusage.ServerUse(
            (GPU_A, GPU_B),
            (simusage.ClientUse(8, "c_y", GIB, 0), simusage.ClientUse(9, "c_y", 0, 5)),
        ),
    )
    (pipes[0] / "gpu_1").mkdir()
    (pipes[0] / "gpu_1" / simusage.USAGE_FILE).write_text("half written")  # skipped
    assert nvml.mps_processes(GPU_A) == [
        MpsProcess(7, 2 * GIB),
        MpsProcess(8, GIB),
        MpsProcess(9, 0),
    ]
    assert nvml.mps_processes(GPU_B) == [MpsProcess(8, GIB), MpsProcess(9, 0)]
    assert nvml.process_sm_utilization(GPU_A) == {7: 40, 9: 5}
    nvml.set_cgroup_limits(GPU_A, "/sys/fs/cgroup/kubepods/pod1/ctr1", GIB, 4 * GIB)
    got = nvml.cgroup_memory(GPU_A, "/sys/fs/cgroup/kubepods/pod1/ctr1")
    assert (got.soft_bytes, got.hard_bytes, got.used_bytes) == (GIB, 4 * GIB, 2 * GIB)
    assert nvml.cgroup_memory(GPU_B, "/sys/fs/cgroup/kubepods/pod1/ctr1").used_bytes == 0
    assert nvml.cgroup_memory(GPU_B, "/sys/fs/cgroup/kubepods/pod2").used_bytes == GIB


def test_probe_quantities() -> None:
    assert quantity_bytes("2Gi") == 2 * GIB
    assert quantity_bytes("512Mi") == 512 << 20
    assert quantity_bytes("1024") == 1024
    for bad in ("2G", "1.5Gi", "-1", "lots"):
        with pytest.raises(argparse.ArgumentTypeError):
            quantity_bytes(bad)
