"""Talking to a plugin served over real unix sockets the way the kubelet does."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import grpc

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver._proto import (
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)
from dra_driver.kubelet.server import PluginServer, SocketPaths
from tests.support.node import Node


@dataclass
class Kubelet:
    """Talks to a running plugin the way the kubelet does."""

    info: registration_pb2.PluginInfo
    v1: dra_v1_pb2_grpc.DRAPluginStub
    v1beta1: dra_v1beta1_pb2_grpc.DRAPluginStub
    registration: registration_pb2_grpc.RegistrationStub
    channel: grpc.Channel


def kubelet_connect(paths: SocketPaths) -> Kubelet:
    reg_channel = grpc.insecure_channel(f"unix://{paths.registration}")
    registration = registration_pb2_grpc.RegistrationStub(reg_channel)
    info = registration.GetInfo(registration_pb2.InfoRequest(), timeout=1)
    registration.NotifyRegistrationStatus(
        registration_pb2.RegistrationStatus(plugin_registered=True), timeout=5
    )
    channel = grpc.insecure_channel(f"unix://{info.endpoint}")
    return Kubelet(
        info,
        dra_v1_pb2_grpc.DRAPluginStub(channel),
        dra_v1beta1_pb2_grpc.DRAPluginStub(channel),
        registration,
        channel,
    )


@contextmanager
def serving(node: Node, health_interval: float = 0.2) -> Iterator[tuple[PluginServer, Kubelet]]:
    """Serve ``node``'s driver over unix sockets and connect a kubelet to it."""
    paths = SocketPaths.for_driver(
        DEFAULT_DRIVER_NAME, str(node.plugin_dir), str(node.registry_dir)
    )
    preparation = node.preparation()
    server = PluginServer(preparation, paths, node.health, health_interval=health_interval)
    server.start()
    kubelet = kubelet_connect(paths)
    try:
        yield server, kubelet
    finally:
        kubelet.channel.close()
        server.stop(grace=0)
        preparation.close()
