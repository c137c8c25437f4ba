"""Benchmark NodePrepareResources against a floor measured in the same run.

The node: 16 simulated H200s (MPS enforcement recorded) offered with the default node
configuration, i.e. the shared-device layout: per GPU one shared device per compute mode
(``gpu-<i>-time-slicing``, ``gpu-<i>-sm-sharing``) with the consumable capacity ``slots``
(8 per GPU: an eighth takes 1, a quarter 2, a half 4, a full card 8). Claims are allocated as
the scheduler writes them for that layout: the shared device, ``consumedCapacity.slots`` and
a fresh ``shareID`` each.

Floor: one unary gRPC round trip over a unix socket whose handler does one fsync'd file
write and rename. Prepare: one quarter claim per call, on the shared devices in turn (every
GPU, both compute modes), read over real HTTP from an in-process API stand-in, CDI spec
written, checkpoint fsynced; each timed prepare is followed by an untimed unprepare, so a
GPU holds one quarter (2 of its 8 slots) at a time. Floor and prepare samples are
interleaved so machine noise hits both alike. Then ``--batch-claims`` (default 100) eighth
claims in one call, three times (each call unprepared after): eight shares per GPU fill
GPUs 0, 1, ... in order (100 eighths: 13 GPUs, the last one half full), the GPU's device in
time-slicing on even GPUs and sm-sharing on odd ones, so no GPU is over-committed (the
node-side guard would refuse it) and no share ID repeats.

Run: ``.venv/bin/python benchmarks/bench_prepare.py [--calls 300] [--batch-claims 100]``;
``--smoke`` runs 20 calls (3 warm-up) and one batch of 10 claims in seconds (``make test``
does, numbers not checked). Times are printed in milliseconds (``_ms``) or seconds (``_s``);
the last line is ``prepare_p99_ratio_to_floor: <number>``.
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
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dra_driver import DEFAULT_DRIVER_NAME  # noqa: E402
from dra_driver._proto import dra_v1_pb2, registration_pb2, registration_pb2_grpc  # noqa: E402
from dra_driver.infra import (
    logs,  # noqa: E402
    write_atomic,  # noqa: E402
)
from dra_driver.kubelet import PluginServer, SocketPaths  # noqa: E402
from dra_driver.model.devices import PublishedDevice  # noqa: E402
from dra_driver.model.vocabulary import COMPUTE_MODES  # noqa: E402
from tests.support import claimfactory as cf  # noqa: E402
from tests.support.kubelet import kubelet_connect  # noqa: E402
from tests.support.node import NODE, Node, share_result, shared_devices  # noqa: E402

GPUS = 16
"""Simulated H200s on the node: room for 128 eighths, so a batch of 100 fits."""
SLOTS_PER_GPU = 8
"""``slots`` of each shared device (the default ``slotsPerGpu``): 8 eighths fill a GPU."""
WARMUP, SMOKE_WARMUP = 20, 3
"""Untimed single-claim calls before the timed ones."""
BATCH_ROUNDS, SMOKE_BATCH_ROUNDS = 3, 1
"""Batch calls measured."""
SMOKE_CALLS, SMOKE_BATCH_CLAIMS = 20, 10


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


def batch_results(devices: dict[str, PublishedDevice], claims: int) -> list[dict[str, Any]]:
    """Allocation results of ``claims`` eighths packed ``SLOTS_PER_GPU`` to a GPU, GPU 0
    first; even GPUs in time-slicing, odd ones in sm-sharing; a fresh share ID each."""
    by_gpu_mode = {(d.gpu.index, d.compute_mode): d for d in shared_devices(devices)}
    results = []
    for k in range(claims):
        gpu = k // SLOTS_PER_GPU
        device = by_gpu_mode[(gpu, COMPUTE_MODES[gpu % len(COMPUTE_MODES)])]
        results.append(share_result(device, NODE, "eighth"))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="timed single-claim calls (>= 200)")
    parser.add_argument(
        "--batch-claims",
        type=int,
        default=100,
        help=f"eighth claims in one call (at most {GPUS * SLOTS_PER_GPU})",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"{SMOKE_CALLS} calls, one batch of {SMOKE_BATCH_CLAIMS} (numbers not checked)",
    )
    args = parser.parse_args()
    if not 1 <= args.batch_claims <= GPUS * SLOTS_PER_GPU:
        parser.error(f"--batch-claims must be 1..{GPUS * SLOTS_PER_GPU} (eighths on {GPUS} GPUs)")
    calls, warmup, batch_claims, rounds = (
        (SMOKE_CALLS, SMOKE_WARMUP, SMOKE_BATCH_CLAIMS, SMOKE_BATCH_ROUNDS)
        if args.smoke
        else (args.calls, WARMUP, args.batch_claims, BATCH_ROUNDS)
    )
    logs.configure("info", "json")  # plugin logs (production level) go to stderr

    from dra_driver.config import load_node_config
    from dra_driver.enforce import RecordingEnforcer
    from dra_driver.gpus import SimulatedGpuSource
    from dra_driver.publish import offered_devices
    from tests.support.apiserver_stub import ClaimServer

    with tempfile.TemporaryDirectory(prefix="drab-") as tmp, ClaimServer() as claims:
        root = Path(tmp)
        inventory = SimulatedGpuSource(f"simulated:H200x{GPUS}", seed=NODE).discover()
        devices = {d.name: d for d in offered_devices(inventory, load_node_config(None))}
        node = Node(root, devices, claims, RecordingEnforcer())
        node.make_device_nodes()
        paths = SocketPaths.for_driver(
            DEFAULT_DRIVER_NAME, str(node.plugin_dir), str(node.registry_dir)
        )
        preparation = node.preparation()
        server = PluginServer(preparation, paths, node.health)
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

        shared = shared_devices(devices)
        floor_s: list[float] = []
        prep_s: list[float] = []
        for i in range(warmup + calls):
            claim = cf.claim([share_result(shared[i % len(shared)], NODE, "quarter")])
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
        for _ in range(rounds):
            batch = [cf.claim([r]) for r in batch_results(devices, batch_claims)]
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
            if errors or len(reply.claims) != batch_claims:
                raise SystemExit(f"batch prepare failed: {errors[:3]}")
            kubelet.v1.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=refs), timeout=45
            )

        kubelet.channel.close()
        server.stop(grace=0.5)
        floor_server.stop(0)
        preparation.close()

    ms = 1000.0
    print(f"machine: {os.cpu_count()} cpus; calls: {calls} (+{warmup} warm-up)")
    print(
        f"node: {GPUS} simulated H200s, {len(shared)} shared devices; single calls: one quarter"
        f" each; batch: {batch_claims} eighths in one call"
    )
    print(f"floor_p50_ms: {percentile(floor_s, 0.5) * ms:.3f}")
    print(f"floor_p99_ms: {percentile(floor_s, 0.99) * ms:.3f}")
    print(f"prepare_p50_ms: {percentile(prep_s, 0.5) * ms:.3f}")
    print(f"prepare_p99_ms: {percentile(prep_s, 0.99) * ms:.3f}")
    print(f"prepare_mean_ms: {statistics.mean(prep_s) * ms:.3f}")
    print(f"prepare_{batch_claims}_claims_one_call_s: {', '.join(f'{s:.3f}' for s in batch_s)}")
    print(f"prepare_{batch_claims}_claims_one_call_median_s: {statistics.median(batch_s):.3f}")
    print(f"prepare_p50_ratio_to_floor: {percentile(prep_s, 0.5) / percentile(floor_s, 0.5):.2f}")
    print(f"prepare_p99_ratio_to_floor: {percentile(prep_s, 0.99) / percentile(floor_s, 0.99):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
