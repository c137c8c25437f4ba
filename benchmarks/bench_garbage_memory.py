"""Benchmark the memory cost of requests that do not decode: our server against plain grpcio.

Each server runs in its own process on a unix socket; this process sends it requests whose
bytes are not a valid protobuf message (``NodePrepareResources``) and reads the server's
RSS (``/proc/<pid>/status``) after a warm-up and after the measured requests. Servers, all on
the same generated DRA stubs:

- ours: ``PluginServer`` over a simulated node (what the kubelet talks to);
- plain: ``grpc.server`` with a trivial servicer: the baseline, in the same run;
- plain with one server option each (receive size, connection age, concurrent streams,
  concurrent RPCs): whether a grpcio option alone stops the growth.

grpcio 1.85.1 leaks each undecodable call (about 19 KiB, see
``dra_driver/kubelet/decoding.py``); ours should stay flat.

Run: ``.venv/bin/python benchmarks/bench_garbage_memory.py [--requests 3000]``;
``--smoke`` measures ours and plain grpcio only, 200 requests after 50 warm-up, in seconds
(``make test`` does, numbers not checked: too few requests to see a leak). Sizes are KiB of
RSS growth per 1,000 requests; the last line is ``ours_kib_per_1000: <number>``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from collections import Counter
from concurrent import futures
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dra_driver import DEFAULT_DRIVER_NAME  # noqa: E402
from dra_driver._proto import dra_v1_pb2, dra_v1_pb2_grpc  # noqa: E402

METHOD = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
GARBAGE = b"\xff\xff\xff\xff"
WARMUP, SMOKE_WARMUP = 500, 50
"""Undecodable requests sent before the first RSS reading."""
SMOKE_REQUESTS = 200
PLAIN_VARIANTS: dict[str, dict[str, Any]] = {
    "plain grpcio": {},
    "plain, max_receive_message_length=4096": {
        "options": [("grpc.max_receive_message_length", 4096)]
    },
    "plain, max_connection_age_ms=1000": {"options": [("grpc.max_connection_age_ms", 1000)]},
    "plain, max_concurrent_streams=8": {"options": [("grpc.max_concurrent_streams", 8)]},
    "plain, maximum_concurrent_rpcs=4": {"maximum_concurrent_rpcs": 4},
}


class TrivialServicer(dra_v1_pb2_grpc.DRAPluginServicer):
    def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        return dra_v1_pb2.NodePrepareResourcesResponse()


def serve_plain(socket: str, settings: dict[str, Any], ready: Event, stop: Event) -> None:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=settings.get("options"),
        maximum_concurrent_rpcs=settings.get("maximum_concurrent_rpcs"),
    )
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(TrivialServicer(), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    ready.set()
    stop.wait()
    server.stop(0)


def serve_ours(socket: str, settings: dict[str, Any], ready: Event, stop: Event) -> None:
    from dra_driver.config import load_node_config
    from dra_driver.enforce import RecordingEnforcer
    from dra_driver.gpus import SimulatedGpuSource
    from dra_driver.infra import logs
    from dra_driver.kubelet import PluginServer, SocketPaths
    from dra_driver.publish import offered_devices
    from tests.support.apiserver_stub import ClaimServer
    from tests.support.node import NODE, Node

    logs.configure("error", "json")
    with tempfile.TemporaryDirectory(prefix="drag-") as tmp, ClaimServer() as claims:
        inventory = SimulatedGpuSource("simulated:H200x2", seed=NODE).discover()
        devices = {d.name: d for d in offered_devices(inventory, load_node_config(None))}
        node = Node(Path(tmp), devices, claims, RecordingEnforcer())
        paths = SocketPaths(registration=Path(tmp) / "reg.sock", dra=Path(socket))
        preparation = node.preparation()
        server = PluginServer(preparation, paths, node.health)
        server.start()
        ready.set()
        stop.wait()
        server.stop(grace=0.1)
        preparation.close()


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS:")).split()[1])


def measure(
    target: Any, settings: dict[str, Any], requests: int, warmup: int
) -> tuple[float, Counter[str]]:
    """KiB of server RSS growth per 1,000 undecodable requests, and the status codes seen."""
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    with tempfile.TemporaryDirectory(prefix="drag-") as tmp:
        socket = f"{tmp}/{DEFAULT_DRIVER_NAME}.sock"
        proc = context.Process(target=target, args=(socket, settings, ready, stop))
        proc.start()
        assert proc.pid is not None
        if not ready.wait(60):
            raise SystemExit("server did not start")
        channel = grpc.insecure_channel(f"unix://{socket}")
        call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        codes: Counter[str] = Counter()

        def send(count: int) -> None:
            for _ in range(count):
                try:
                    call(GARBAGE, timeout=5)
                    codes["OK"] += 1
                except grpc.RpcError as exc:
                    codes[exc.code().name] += 1

        send(warmup)
        time.sleep(0.5)
        before = rss_kib(proc.pid)
        codes.clear()
        send(requests)
        time.sleep(0.5)
        grown = rss_kib(proc.pid) - before
        channel.close()
        stop.set()
        proc.join(30)
    return grown * 1000 / requests, codes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="measured requests per server")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"ours and plain grpcio, {SMOKE_REQUESTS} requests (numbers not checked)",
    )
    args = parser.parse_args()
    requests, warmup = (SMOKE_REQUESTS, SMOKE_WARMUP) if args.smoke else (args.requests, WARMUP)
    variants: dict[str, dict[str, Any]] = {"plain grpcio": {}} if args.smoke else PLAIN_VARIANTS
    print(f"grpcio {grpc.__version__}; {requests} undecodable requests after {warmup} warm-up")
    print(f"{'server':42} {'KiB RSS per 1,000':>18}  status codes")
    rows = {"ours (PluginServer)": measure(serve_ours, {}, requests, warmup)}
    for label, settings in variants.items():
        rows[label] = measure(serve_plain, settings, requests, warmup)
    for label, (per_1000, codes) in rows.items():
        print(f"{label:42} {per_1000:18.0f}  {dict(codes)}")
    print(f"plain_kib_per_1000: {rows['plain grpcio'][0]:.0f}")
    print(f"ours_kib_per_1000: {rows['ours (PluginServer)'][0]:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
