"""Benchmark NodePrepareResources against a floor measured in the same run.

Floor: one unary gRPC round trip over a unix socket whose handler does one fsync'd file
write and rename. Prepare: one claim per call (simulated GPUs and MPS), read over real HTTP
from an in-process API stand-in, CDI spec written, checkpoint fsynced; each timed prepare is
followed by an untimed unprepare. Floor and prepare samples are interleaved so machine noise
hits both alike. Then 100 claims in one call.

Run: ``.venv/bin/python benchmarks/bench_prepare.py [--calls 300]``. The last line is
``prepare_p99_ratio_to_floor: <number>``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dra_driver import DEFAULT_DRIVER_NAME, logs  # noqa: E402
from dra_driver._proto import dra_v1_pb2, registration_pb2, registration_pb2_grpc  # noqa: E402
from dra_driver.atomicfile import write_atomic  # noqa: E402
from dra_driver.kubelet.server import PluginServer, SocketPaths  # noqa: E402
from tests.support import claimfactory as cf  # noqa: E402
from tests.support.kubelet import kubelet_connect  # noqa: E402
from tests.support.node import NODE, Node  # noqa: E402


class FloorServicer(registration_pb2_grpc.RegistrationServicer):
    """GetInfo that performs one fsync'd write + rename: the floor's unit of work."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def GetInfo(self, request: object, context: object) -> registration_pb2.PluginInfo:  # noqa: N802
        write_atomic(self.path, b'{"claims": {}}' * 40)
        return registration_pb2.PluginInfo(name="floor")


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="timed single-claim calls (>= 200)")
    args = parser.parse_args()
    logs.configure("info", "json")  # plugin logs (production level) go to stderr

    from dra_driver.configload import load_node_config
    from dra_driver.gpus import SimulatedGpuSource
    from dra_driver.mps import RecordingEnforcer
    from dra_driver.offer import offered_devices
    from tests.support.apiserver_stub import ClaimServer

    with tempfile.TemporaryDirectory(prefix="drab-") as tmp, ClaimServer() as claims:
        root = Path(tmp)
        inventory = SimulatedGpuSource("simulated:H200x8", seed=NODE).discover()
        devices = {d.name: d for d in offered_devices(inventory, load_node_config(None))}
        node = Node(root, devices, claims, RecordingEnforcer())
        node.make_device_nodes()
        paths = SocketPaths.for_driver(
            DEFAULT_DRIVER_NAME, str(node.plugin_dir), str(node.registry_dir)
        )
        driver = node.driver()
        server = PluginServer(driver, paths, node.health)
        server.start()
        kubelet = kubelet_connect(paths)

        floor_sock = root / "floor.sock"
        floor_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        registration_pb2_grpc.add_RegistrationServicer_to_server(
            FloorServicer(node.state_dir / "floor.json"), floor_server
        )
        floor_server.add_insecure_port(f"unix://{floor_sock}")
        floor_server.start()
        floor_stub = registration_pb2_grpc.RegistrationStub(
            grpc.insecure_channel(f"unix://{floor_sock}")
        )

        quarters = [d.name for d in devices.values() if d.product == "quarter"]
        warmup = 20
        floor_s: list[float] = []
        prep_s: list[float] = []
        for i in range(warmup + args.calls):
            claim = cf.claim([cf.result(quarters[i % len(quarters)], NODE)])
            claims.add(claim)
            m = claim["metadata"]
            ref = dra_v1_pb2.Claim(namespace=m["namespace"], name=m["name"], uid=m["uid"])

            t0 = time.perf_counter()
            floor_stub.GetInfo(registration_pb2.InfoRequest(), timeout=10)
            t1 = time.perf_counter()
            reply = kubelet.v1.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=45
            )
            t2 = time.perf_counter()
            if reply.claims[m["uid"]].error:
                raise SystemExit(f"prepare failed: {reply.claims[m['uid']].error}")
            kubelet.v1.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[ref]), timeout=45
            )
            if i >= warmup:
                floor_s.append(t1 - t0)
                prep_s.append(t2 - t1)

        batch_s: list[float] = []
        for _ in range(3):
            # 100 distinct devices (of 120): one device is never prepared for two claims.
            batch = [cf.claim([cf.result(name, NODE)]) for name in sorted(devices)[:100]]
            for c in batch:
                claims.add(c)
            refs = [
                dra_v1_pb2.Claim(
                    namespace=c["metadata"]["namespace"],
                    name=c["metadata"]["name"],
                    uid=c["metadata"]["uid"],
                )
                for c in batch
            ]
            t0 = time.perf_counter()
            reply = kubelet.v1.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=refs), timeout=45
            )
            batch_s.append(time.perf_counter() - t0)
            errors = [r.error for r in reply.claims.values() if r.error]
            if errors or len(reply.claims) != 100:
                raise SystemExit(f"batch prepare failed: {errors[:3]}")
            kubelet.v1.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=refs), timeout=45
            )

        kubelet.channel.close()
        server.stop(grace=0.5)
        floor_server.stop(0)
        driver.close()

    ms = 1000.0
    print(f"machine: {os.cpu_count()} cpus; calls: {args.calls} (+{warmup} warm-up)")
    print(f"floor_p50_ms: {percentile(floor_s, 0.5) * ms:.3f}")
    print(f"floor_p99_ms: {percentile(floor_s, 0.99) * ms:.3f}")
    print(f"prepare_p50_ms: {percentile(prep_s, 0.5) * ms:.3f}")
    print(f"prepare_p99_ms: {percentile(prep_s, 0.99) * ms:.3f}")
    print(f"prepare_mean_ms: {statistics.mean(prep_s) * ms:.3f}")
    print(f"prepare_100_claims_one_call_s: {', '.join(f'{s:.3f}' for s in batch_s)}")
    print(f"prepare_100_claims_one_call_median_s: {statistics.median(batch_s):.3f}")
    print(f"prepare_p50_ratio_to_floor: {percentile(prep_s, 0.5) / percentile(floor_s, 0.5):.2f}")
    print(f"prepare_p99_ratio_to_floor: {percentile(prep_s, 0.99) / percentile(floor_s, 0.99):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
