"""Benchmark Prepare and Unprepare as a kubelet sees them on a simulated node: through the
plugin's gRPC server, the real MPS enforcer and the MPS emulator (its control daemon and
servers as real processes, simulated NVML), with floors measured in the same run.

Floors, interleaved with the samples so machine noise hits both alike:

- ``floor``: one no-work unary gRPC round trip over a unix socket plus one fsync'd write and
  rename (as ``bench_prepare.py``);
- ``noop_start``: starting ``/bin/true``, against ``control_start``: the emulator's
  ``nvidia-cuda-mps-control`` answering a command with no daemon to ask. NVIDIA's program is
  compiled and starts about as fast as a no-op, and so is the emulator's (``control_client.c``);
  ``control_start_ratio_to_noop`` says how much of each MPS command below is the emulator's own
  start, not the driver. ``python_start``: a bare ``python3 -I -S``, the floor of a Python
  client (the emulator's was one until its client was compiled: 88 ms a command).

The emulator's daemon and servers run ``python3`` from ``PATH`` (``#!/usr/bin/env -S python3 -I
-S``; the image pins ``/usr/bin/python3.11``). Where ``python3`` on ``PATH`` is a version
manager's shim (pyenv's is a shell script: about 110 ms a start on the 2-core machines, against
10 ms for the interpreter itself), each daemon or server start would pay it; the benchmark puts
this interpreter's directory first on ``PATH``, so that it measures the emulator, not the shim.

The node: 2 simulated H200s. A resident quarter on GPU 0 (time-slicing) keeps its MPS server
running; each timed call prepares one more quarter on GPU 0 (a claim joining a GPU whose server
runs), then unprepares it (timed too). MPS control commands per Prepare + Unprepare are counted
from the emulator's ``control.log``. Then, the resident released, 7 eighths in one call on
GPU 0, and the first claim on an idle GPU (GPU 1: its compute mode set, its server started).

Run: ``.venv/bin/python benchmarks/bench_prepare_mps.py [--calls 100]``; ``--smoke`` runs 5
calls and a batch of 2 (``make test`` does, numbers not checked). The last line is
``prepare_p99_ratio_to_floor: <number>``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_prepare import FloorServicer, percentile  # noqa: E402

from dra_driver import DEFAULT_DRIVER_NAME  # noqa: E402
from dra_driver._proto import dra_v1_pb2, registration_pb2, registration_pb2_grpc  # noqa: E402
from dra_driver.infra import logs  # noqa: E402
from dra_driver.kubelet import PluginServer, SocketPaths  # noqa: E402
from tests.support import claimfactory as cf  # noqa: E402
from tests.support.kubelet import kubelet_connect  # noqa: E402
from tests.support.node import NODE, Node, share_result  # noqa: E402

GPUS = 2
SMOKE_CALLS, WARMUP = 5, 3
BATCH, SMOKE_BATCH = 7, 2
MODE = "time-slicing"


def ref_of(claim: dict[str, Any]) -> dra_v1_pb2.Claim:
    m = claim["metadata"]
    return dra_v1_pb2.Claim(namespace=m["namespace"], name=m["name"], uid=m["uid"])


def commands(log: Path) -> int:
    """MPS control commands the emulator's daemon answered so far (one ``-> rc`` line each)."""
    try:
        return sum(1 for line in log.read_text().splitlines() if " -> rc " in line)
    except FileNotFoundError:
        return 0


def timed_start(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, capture_output=True, check=False)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="timed Prepare+Unprepare pairs")
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_CALLS} calls")
    args = parser.parse_args()
    calls, batch_size = (SMOKE_CALLS, SMOKE_BATCH) if args.smoke else (args.calls, BATCH)
    logs.configure("warning", "json")

    from dra_driver.config import load_node_config
    from dra_driver.enforce import (
        MpsEnforcer,
        MpsOptions,
        RecordingEnforcer,
        SimulatedNvml,
        daemon_pipe_dir,
    )
    from dra_driver.gpus import SimulatedGpuSource
    from dra_driver.infra import SubprocessRunner
    from dra_driver.model.vocabulary import ComputeMode
    from dra_driver.mpsemu.paths import emulator_path
    from dra_driver.publish import offered_devices
    from tests.support.apiserver_stub import ClaimServer

    # short: unix socket paths are limited to 107 bytes
    root = Path(tempfile.mkdtemp(prefix="dbm", dir="/tmp"))
    enforcer: MpsEnforcer | None = None
    try:
        inventory = SimulatedGpuSource(f"simulated:H200x{GPUS}", seed=NODE).discover()
        uuids = [g.uuid for g in inventory.gpus]
        os.environ["MPS_EMULATOR_VISIBLE_GPUS"] = ",".join(uuids)
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        devices = {d.name: d for d in offered_devices(inventory, load_node_config(None))}
        options = MpsOptions(
            root=str(root / "run"),
            control_binary=str(emulator_path()),
            cgroup_root=str(root / "cgroup"),
        )
        pipes = [daemon_pipe_dir(options.mps_root, m) for m in ComputeMode]
        nvml = SimulatedNvml(root / "nvml", lambda: uuids, pipes)
        enforcer = MpsEnforcer(dict.fromkeys(uuids, "hard"), nvml, SubprocessRunner(), options)
        control_log = enforcer.daemons[MODE].log_dir / "control.log"
        with ClaimServer() as claims:
            node = Node(root / "node", devices, claims, RecordingEnforcer())
            node.make_device_nodes()
            paths = SocketPaths.for_driver(
                DEFAULT_DRIVER_NAME, str(node.plugin_dir), str(node.registry_dir)
            )
            preparation = node.preparation(enforcer=enforcer)
            server = PluginServer(preparation, paths, node.health)
            server.start()
            kubelet = kubelet_connect(paths)

            floor_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            registration_pb2_grpc.add_RegistrationServicer_to_server(
                FloorServicer(node.state_dir / "floor.json"), floor_server
            )
            floor_server.add_insecure_port(f"unix://{root / 'floor.sock'}")
            floor_server.start()
            floor_stub = registration_pb2_grpc.RegistrationStub(
                grpc.insecure_channel(f"unix://{root / 'floor.sock'}")
            )

            def timed(call: Any, request: Any, what: str) -> float:
                """Seconds ``call(request)`` took; exits when a claim failed."""
                t0 = time.perf_counter()
                reply = call(request, timeout=60)
                spent = time.perf_counter() - t0
                errors = [r.error for r in reply.claims.values() if r.error]
                if errors:
                    raise SystemExit(f"{what} failed: {errors[:3]}")
                return spent

            def prepare(claim_list: list[dict[str, Any]]) -> float:
                for c in claim_list:
                    claims.add(c)
                refs = [ref_of(c) for c in claim_list]
                request = dra_v1_pb2.NodePrepareResourcesRequest(claims=refs)
                return timed(kubelet.v1.NodePrepareResources, request, "prepare")

            def unprepare(claim_list: list[dict[str, Any]]) -> float:
                refs = [ref_of(c) for c in claim_list]
                request = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=refs)
                return timed(kubelet.v1.NodeUnprepareResources, request, "unprepare")

            gpu0 = devices[f"gpu-0-{MODE}"]
            gpu1 = devices[f"gpu-1-{MODE}"]
            resident = cf.claim([share_result(gpu0, NODE, "quarter")])
            first_on_idle_s = prepare([resident])  # GPU 0 idle before: its server starts

            env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(root / "no-daemon")}
            control = [str(emulator_path()), "server", "list"]
            noop = [shutil.which("true") or "/bin/true"]
            python = [shutil.which("python3") or sys.executable, "-I", "-S", "-c", "pass"]
            floor_s, prep_s, unprep_s, noop_s, control_s, per_pair = [], [], [], [], [], []
            python_s: list[float] = []
            for i in range(WARMUP + calls):
                claim = cf.claim([share_result(gpu0, NODE, "quarter")])
                t0 = time.perf_counter()
                floor_stub.GetInfo(registration_pb2.InfoRequest(), timeout=10)
                floor = time.perf_counter() - t0
                before = commands(control_log)
                p = prepare([claim])
                u = unprepare([claim])
                n = commands(control_log) - before
                start_noop = timed_start(noop, env)
                start_python = timed_start(python, env)
                start_control = timed_start(control, env)
                if i >= WARMUP:
                    floor_s.append(floor)
                    prep_s.append(p)
                    unprep_s.append(u)
                    per_pair.append(n)
                    noop_s.append(start_noop)
                    python_s.append(start_python)
                    control_s.append(start_control)

            unprepare([resident])
            batch = [cf.claim([share_result(gpu0, NODE, "eighth")]) for _ in range(batch_size)]
            batch_s = prepare(batch)
            unprepare(batch)
            idle = cf.claim([share_result(gpu1, NODE, "quarter")])
            idle_s = prepare([idle])
            unprepare([idle])

            kubelet.channel.close()
            server.stop(grace=0.5)
            floor_server.stop(0)
            preparation.close()
    finally:
        if enforcer is not None:
            for daemon in enforcer.daemons.values():
                daemon.stop()
        shutil.rmtree(root, ignore_errors=True)

    ms = 1000.0
    print(f"machine: {os.cpu_count()} cpus; calls: {calls} (+{WARMUP} warm-up)")
    print(f"node: {GPUS} simulated H200s, MPS emulator, {MODE}; a quarter joins GPU 0's server")
    print(f"noop_start_p50_ms: {percentile(noop_s, 0.5) * ms:.2f}")
    print(f"python_start_p50_ms: {percentile(python_s, 0.5) * ms:.2f}")
    print(f"control_start_p50_ms: {percentile(control_s, 0.5) * ms:.2f}")
    print(
        f"control_start_ratio_to_noop: {percentile(control_s, 0.5) / percentile(noop_s, 0.5):.1f}"
    )
    print(f"mps_commands_per_prepare_and_unprepare: {sum(per_pair) / len(per_pair):.1f}")
    print(f"floor_p50_ms: {percentile(floor_s, 0.5) * ms:.2f}")
    print(f"floor_p99_ms: {percentile(floor_s, 0.99) * ms:.2f}")
    print(f"prepare_p50_ms: {percentile(prep_s, 0.5) * ms:.1f}")
    print(f"prepare_p99_ms: {percentile(prep_s, 0.99) * ms:.1f}")
    print(f"unprepare_p50_ms: {percentile(unprep_s, 0.5) * ms:.1f}")
    print(f"unprepare_p99_ms: {percentile(unprep_s, 0.99) * ms:.1f}")
    print(f"prepare_{batch_size}_eighths_one_call_s: {batch_s:.3f}")
    print(f"first_claim_on_idle_gpu_s: {idle_s:.3f} (the resident's: {first_on_idle_s:.3f})")
    print(f"prepare_p50_ratio_to_floor: {percentile(prep_s, 0.5) / percentile(floor_s, 0.5):.1f}")
    print(f"prepare_p99_ratio_to_floor: {percentile(prep_s, 0.99) / percentile(floor_s, 0.99):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
