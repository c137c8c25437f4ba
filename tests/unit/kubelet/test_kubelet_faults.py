"""The kubelet-facing servers under hostile load (issue 10, items 8, 9 and 10).

Driven over real unix sockets like the kubelet (``tests/conftest.py``): health streams must
not starve Prepare, rejected registrations must not pile up threads, and requests that do not
decode must be refused without leaking the call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver._proto import (
    dra_v1_pb2,
    health_v1_pb2,
    health_v1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)
from dra_driver.kubelet.healthstream import MAX_HEALTH_STREAMS
from dra_driver.kubelet.server import PluginServer
from tests.support import claimfactory as cf
from tests.support.kubelet import Kubelet, serving
from tests.support.node import Node
from tests.unit.kubelet.test_plugin_grpc import ref

Served = tuple[Node, PluginServer, Kubelet]


@pytest.fixture
def slow_health(node: Node) -> Iterator[Served]:
    """The plugin with the production health interval (a stream sleeps 20 s between reports)."""
    with serving(node, health_interval=20.0) as (server, kubelet):
        yield node, server, kubelet


def open_streams(kubelet: Kubelet, count: int) -> tuple[list[Any], list[grpc.RpcError]]:
    """Open ``count`` health streams and read each one's first report; returns the streams
    that report and the refusals."""
    stub = health_v1_pb2_grpc.DRAResourceHealthStub(kubelet.channel)
    streams = [
        stub.NodeWatchResources(health_v1_pb2.NodeWatchResourcesRequest(), timeout=60)
        for _ in range(count)
    ]
    open_ones, refused = [], []
    for stream in streams:
        try:
            next(stream)
            open_ones.append(stream)
        except grpc.RpcError as exc:
            refused.append(exc)
    return open_ones, refused


def timed_prepare(node: Node, kubelet: Kubelet) -> float:
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    started = time.monotonic()
    reply = kubelet.v1.NodePrepareResources(
        dra_v1_pb2.NodePrepareResourcesRequest(claims=[ref(dra_v1_pb2, claim)]), timeout=5
    )
    took = time.monotonic() - started
    assert reply.claims[claim["metadata"]["uid"]].error == ""
    return took


# --- item 8: health streams must not starve Prepare ----------------------------------------


def test_prepare_is_served_with_8_open_health_streams(slow_health: Served) -> None:
    node, server, kubelet = slow_health
    streams, refused = open_streams(kubelet, 8)
    assert len(streams) + len(refused) == 8
    assert timed_prepare(node, kubelet) < 1.0
    for stream in streams:
        stream.cancel()


def test_cancelled_health_streams_release_at_once(slow_health: Served) -> None:
    node, server, kubelet = slow_health
    for _ in range(2):
        streams, _ = open_streams(kubelet, 8)
        for stream in streams:
            stream.cancel()
    assert timed_prepare(node, kubelet) < 1.0
    deadline = time.monotonic() + 1.0
    while server.health_streams.active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.health_streams.active == 0


def test_health_streams_beyond_the_limit_are_refused_clearly(slow_health: Served) -> None:
    _, server, kubelet = slow_health
    streams, refused = open_streams(kubelet, MAX_HEALTH_STREAMS + 2)
    assert len(streams) == MAX_HEALTH_STREAMS
    assert [e.code() for e in refused] == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
    assert f"at most {MAX_HEALTH_STREAMS} health streams" in (refused[0].details() or "")
    streams[0].cancel()
    # A cancelled stream's place is free again once the server has seen the cancellation
    # (asynchronous: under load the first try can still be refused).
    deadline = time.monotonic() + 5
    more, _ = open_streams(kubelet, 1)
    while not more and time.monotonic() < deadline:
        time.sleep(0.05)
        more, _ = open_streams(kubelet, 1)
    assert len(more) == 1
    for stream in streams[1:] + more:
        stream.cancel()


# --- item 9: rejected registrations --------------------------------------------------------


@pytest.mark.integration  # waits out the real 3 s re-registration delay
def test_registration_rejections_reregister_through_one_bounded_worker(served: Served) -> None:
    node, server, kubelet = served
    baseline = threading.active_count()
    peak = [baseline]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], threading.active_count())

    sampler = threading.Thread(target=sample)
    sampler.start()
    rejected = registration_pb2.RegistrationStatus(plugin_registered=False, error="rejected")
    for _ in range(300):
        kubelet.registration.NotifyRegistrationStatus(rejected, timeout=5, wait_for_ready=True)
    time.sleep(3.0)  # the re-registration delay passes
    done.set()
    sampler.join()
    assert peak[0] - baseline <= 8, peak[0] - baseline
    assert 1 <= server.reregistrations <= 2
    channel = grpc.insecure_channel(f"unix://{server.paths.registration}")
    info = registration_pb2_grpc.RegistrationStub(channel).GetInfo(
        registration_pb2.InfoRequest(), timeout=5, wait_for_ready=True
    )
    assert info.name == DEFAULT_DRIVER_NAME
    channel.close()


# --- item 10: requests that do not decode --------------------------------------------------

GARBAGE = b"\xff\xff\xff\xff"


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1])


@pytest.mark.parametrize(
    "method",
    [
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
    ],
)
def test_undecodable_unary_request_is_refused_by_name(served: Served, method: str) -> None:
    _, _, kubelet = served
    with pytest.raises(grpc.RpcError) as caught:
        kubelet.channel.unary_unary(method)(GARBAGE, timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = caught.value.details() or ""
    assert method in details and "does not decode" in details, details


def test_undecodable_stream_and_registration_requests_are_refused(served: Served) -> None:
    _, server, kubelet = served
    watch = "/v1.DRAResourceHealth/NodeWatchResources"
    with pytest.raises(grpc.RpcError) as caught:
        next(kubelet.channel.unary_stream(watch)(GARBAGE, timeout=5))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    channel = grpc.insecure_channel(f"unix://{server.paths.registration}")
    with pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary("/pluginregistration.Registration/GetInfo")(GARBAGE, timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    channel.close()


def test_undecodable_requests_do_not_grow_memory(served: Served) -> None:
    node, _, kubelet = served
    call = kubelet.channel.unary_unary(
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
    )

    def garbage(count: int) -> None:
        for _ in range(count):
            with pytest.raises(grpc.RpcError):
                call(GARBAGE, timeout=5)

    garbage(300)
    before = rss_kib()
    garbage(1500)
    grown = rss_kib() - before
    # grpcio 1.85 leaks each such call (~19 KiB: 28 MiB here) unless the plugin decodes itself.
    assert grown < 6 * 1024, f"RSS grew {grown} KiB over 1,500 undecodable requests"
    assert timed_prepare(node, kubelet) < 1.0
