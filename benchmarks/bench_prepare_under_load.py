"""Benchmark NodePrepareResources latency under health-stream load and with a hung API read.

The plugin is served over real unix sockets (8 simulated H200s, claims read over real HTTP
from an in-process API stand-in, production health interval of 20 s), driven like the kubelet.
Devices are the default shared-device layout: per GPU one shared device per compute mode
(``gpu-<i>-time-slicing``, ``gpu-<i>-sm-sharing``, 8 ``slots`` each); every claim is one
quarter as the scheduler allocates it there (the shared device, ``consumedCapacity.slots: 2``,
a fresh ``shareID``). Scenarios, measured in this order in one run:

- (a) idle: one claim per call, on the shared devices in turn (every GPU, both modes); the
  baseline, measured after 20 untimed warm-up calls;
- (b) the same while 8 health streams are asked for and kept open;
- (c) the same after 8 more streams were opened and cancelled (and (b)'s closed);
- (d) batches of 4 quarters in one call, all shares of ``gpu-0-time-slicing`` (its 8 slots,
  full), one of which the API stand-in never answers: the whole call's time, and whether the
  3 others were prepared.

Each timed prepare (and each batch) is followed by an untimed unprepare, so no GPU ever holds
more than its 8 slots. The plugin serves at most ``MAX_HEALTH_STREAMS`` (4) health streams at
once and refuses the others, as (b)'s label shows. Before issue 10's fixes, (b) was never
served (the 8 streams held every pool thread), (c) took about 20 s (cancelled streams slept to
their next report) and (d) took 40 s or more (10 s read timeout, 4 tries, lock held).

Run: ``.venv/bin/python benchmarks/bench_prepare_under_load.py [--calls 200]``; ``--smoke``
runs 10 calls per scenario (3 warm-up), one batch in (d) and a call budget of 2 s, in seconds
(``make test`` does, numbers not checked). Times in the table are milliseconds; the last line
is ``hung_read_call_median_s: <seconds>``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dra_driver import DEFAULT_DRIVER_NAME  # noqa: E402
from dra_driver._proto import dra_v1_pb2, health_v1_pb2, health_v1_pb2_grpc  # noqa: E402
from dra_driver.infra import logs  # noqa: E402
from dra_driver.kubelet import PluginServer, SocketPaths  # noqa: E402
from dra_driver.model.devices import PublishedDevice  # noqa: E402
from tests.support import claimfactory as cf  # noqa: E402
from tests.support.kubelet import Kubelet, kubelet_connect  # noqa: E402
from tests.support.node import NODE, Node, share_result, shared_devices  # noqa: E402

STREAMS = 8
WARMUP, SMOKE_WARMUP = 20, 3
"""Untimed single-claim calls before scenario (a)."""
SMOKE_CALLS, SMOKE_HUNG_ROUNDS, SMOKE_CALL_BUDGET_S = 10, 1, 2.0


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def claim_ref(claim: dict[str, Any]) -> Any:
    m = claim["metadata"]
    return dra_v1_pb2.Claim(namespace=m["namespace"], name=m["name"], uid=m["uid"])


def quarter(device: PublishedDevice) -> dict[str, Any]:
    """A claim allocated one quarter (2 slots, a fresh share ID) of shared ``device``."""
    return cf.claim([share_result(device, NODE, "quarter")])


def prepare_calls(
    node: Node, kubelet: Kubelet, shared: list[PublishedDevice], calls: int
) -> list[float]:
    """Seconds of ``calls`` single-quarter prepares on ``shared`` in turn (each then
    unprepared, untimed)."""
    took = []
    for i in range(calls):
        claim = quarter(shared[i % len(shared)])
        node.claims.add(claim)
        ref = claim_ref(claim)
        started = time.perf_counter()
        reply = kubelet.v1.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=45
        )
        took.append(time.perf_counter() - started)
        if reply.claims[ref.uid].error:
            raise SystemExit(f"prepare failed: {reply.claims[ref.uid].error}")
        kubelet.v1.NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[ref]), timeout=45
        )
    return took


def open_streams(kubelet: Kubelet, count: int) -> tuple[list[Any], int]:
    """Ask for ``count`` health streams; returns those that report and how many were refused."""
    stub = health_v1_pb2_grpc.DRAResourceHealthStub(kubelet.channel)
    streams = [
        stub.NodeWatchResources(health_v1_pb2.NodeWatchResourcesRequest(), timeout=600)
        for _ in range(count)
    ]
    served, refused = [], 0
    for stream in streams:
        try:
            next(stream)
            served.append(stream)
        except grpc.RpcError:
            refused += 1
    return served, refused


def hung_batches(node: Node, kubelet: Kubelet, device: PublishedDevice, rounds: int) -> list[str]:
    """Rows for scenario (d): 4 quarters of ``device`` per batch (its 8 slots)."""
    rows = []
    for _ in range(rounds):
        good = [quarter(device) for _ in range(3)]
        hung = quarter(device)
        for c in (*good, hung):
            node.claims.add(c)
        node.claims.hang(hung)
        refs = [claim_ref(c) for c in (*good, hung)]
        started = time.perf_counter()
        reply = kubelet.v1.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=refs), timeout=45
        )
        took = time.perf_counter() - started
        ok = sum(1 for c in good if not reply.claims[c["metadata"]["uid"]].error)
        error = reply.claims[hung["metadata"]["uid"]].error
        rows.append(f"{took:.2f} s; good claims prepared {ok}/3; hung claim: {error[:110]}")
        kubelet.v1.NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=refs), timeout=45
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="timed prepares per scenario")
    parser.add_argument("--hung-rounds", type=int, default=2, help="batches in scenario (d)")
    parser.add_argument(
        "--call-budget", type=float, default=30.0, help="plugin --call-budget, seconds"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"{SMOKE_CALLS} calls per scenario, {SMOKE_HUNG_ROUNDS} batch in (d), budget "
        f"{SMOKE_CALL_BUDGET_S:g} s (numbers not checked)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.calls, args.hung_rounds = SMOKE_CALLS, SMOKE_HUNG_ROUNDS
        args.call_budget = SMOKE_CALL_BUDGET_S
    warmup = SMOKE_WARMUP if args.smoke else WARMUP
    logs.configure("error", "json")

    from dra_driver.config import load_node_config
    from dra_driver.enforce import RecordingEnforcer
    from dra_driver.gpus import SimulatedGpuSource
    from dra_driver.publish import offered_devices
    from tests.support.apiserver_stub import ClaimServer

    with tempfile.TemporaryDirectory(prefix="drab-") as tmp, ClaimServer() as claims:
        inventory = SimulatedGpuSource("simulated:H200x8", seed=NODE).discover()
        devices = {d.name: d for d in offered_devices(inventory, load_node_config(None))}
        node = Node(Path(tmp), devices, claims, RecordingEnforcer())
        node.make_device_nodes()  # Prepare checks the GPUs' device nodes exist
        paths = SocketPaths.for_driver(
            DEFAULT_DRIVER_NAME, str(node.plugin_dir), str(node.registry_dir)
        )
        preparation = node.preparation()
        preparation.call_budget = args.call_budget
        server = PluginServer(preparation, paths, node.health, health_interval=20.0)
        server.start()
        kubelet = kubelet_connect(paths)
        shared = shared_devices(devices)

        prepare_calls(node, kubelet, shared, warmup)
        results = {"(a) idle": prepare_calls(node, kubelet, shared, args.calls)}
        streams, refused = open_streams(kubelet, STREAMS)
        label_b = f"(b) {STREAMS} streams asked, {len(streams)} open, {refused} refused"
        results[label_b] = prepare_calls(node, kubelet, shared, args.calls)
        for stream in streams:
            stream.cancel()
        cancelled, _ = open_streams(kubelet, STREAMS)
        for stream in cancelled:
            stream.cancel()
        results[f"(c) after {STREAMS} cancelled"] = prepare_calls(node, kubelet, shared, args.calls)
        hung = hung_batches(node, kubelet, shared[0], args.hung_rounds)

        kubelet.channel.close()
        server.stop(grace=0.5)
        preparation.close()

    ms = 1000.0
    base = percentile(results["(a) idle"], 0.99)
    print(f"machine: {os.cpu_count()} cpus; {args.calls} timed prepares per scenario")
    print(f"{'scenario':44} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'p99/idle':>9}")
    for label, samples in results.items():
        p99 = percentile(samples, 0.99)
        print(
            f"{label:44} {percentile(samples, 0.5) * ms:8.2f} {p99 * ms:8.2f} "
            f"{max(samples) * ms:8.2f} {p99 / base:9.2f}"
        )
    print(f"(d) 4 quarters of {shared[0].name}, 1 read hangs, budget {args.call_budget:g} s:")
    for row in hung:
        print(f"    {row}")
    print(f"stream_p99_ratio_to_idle: {percentile(results[label_b], 0.99) / base:.2f}")
    print(f"hung_read_call_median_s: {statistics.median(float(r.split()[0]) for r in hung):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
