"""Shared fixtures: a plugin served over real unix sockets, driven like the kubelet."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from hypothesis import settings

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver._proto import (
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)
from dra_driver.budget import STARTUP_BUDGET_S
from dra_driver.claims import ApiClaimReader
from dra_driver.config import NodeConfig
from dra_driver.configload import load_node_config, parse_node_config
from dra_driver.devicehealth import device_health
from dra_driver.gpus import SimulatedGpuSource, simnode
from dra_driver.kubelet.health import DeviceStatus
from dra_driver.kubelet.server import PluginServer, SocketPaths
from dra_driver.locking import PrepareLock
from dra_driver.mps import FractionEnforcer, RecordingEnforcer
from dra_driver.preparation import ClaimPreparation
from dra_driver.slices import FractionDevice, offered_devices
from tests.apiserver_stub import ClaimServer
from tests.nodedirs import NodeDirs

# Property tests: the unit tier's default draws 25 examples per test; DRA_HYPOTHESIS_PROFILE=deep
# (or pytest's --hypothesis-profile=deep) draws 1000 for a thorough run.
settings.register_profile("unit", max_examples=25)
settings.register_profile("deep", max_examples=1000)
settings.load_profile(os.environ.get("DRA_HYPOTHESIS_PROFILE", "unit"))

NODE = "node-a"


@dataclass
class Node(NodeDirs):
    """Directories, the simulated inventory and what the kubelet would see."""

    root: Path
    devices: dict[str, FractionDevice]
    claims: ClaimServer
    enforcer: RecordingEnforcer
    unhealthy_gpus: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.seen = dict(self.devices)

    @property
    def device_root(self) -> Path:
        """Stands for the host's ``/``: the GPUs' and control device nodes (plain files) are
        under ``<device_root>/dev``, as the ClaimPreparation checks them before writing a spec."""
        return self.root / "devroot"

    def make_device_nodes(self) -> None:
        gpus = {d.gpu.uuid: d.gpu for d in self.devices.values()}.values()
        for path in simnode.device_numbers(gpus):
            host = self.device_root / path.lstrip("/")
            host.parent.mkdir(parents=True, exist_ok=True)
            host.touch()

    def health(self) -> dict[str, DeviceStatus]:
        """What the plugin reports: devices that vanished from ``devices`` are unhealthy."""
        return device_health(self.devices, self.seen, self.unhealthy_gpus)

    def driver(
        self,
        boot_id: str = "boot-1",
        enforcer: FractionEnforcer | None = None,
        startup_budget: float = STARTUP_BUDGET_S,
    ) -> ClaimPreparation:
        """A started ClaimPreparation for this node (its own enforcer unless one is given)."""
        d = ClaimPreparation(
            driver_name=DEFAULT_DRIVER_NAME,
            pool=NODE,
            reader=ApiClaimReader(self.claims.api_client()),
            devices=lambda: self.devices,
            enforcer=enforcer or self.enforcer,
            cdi_root=self.cdi_root,
            state_dir=self.state_dir,
            lock=PrepareLock(self.plugin_dir / DEFAULT_DRIVER_NAME / "prepare.lock"),
            boot_id=boot_id,
            device_root=self.device_root,
            startup_budget=startup_budget,
        )
        d.start()
        return d

    def device(self, gpu: int, product: str | None) -> str:
        """Name of the first device of ``product`` (None: capacity device) on GPU ``gpu``."""
        return next(
            d.name for d in self.devices.values() if d.gpu.index == gpu and d.product == product
        )


MIXED_CONFIG = {
    "apiVersion": "gpu-fraction.dra.dev/v1alpha1",
    "kind": "NodeConfig",
    "gpus": [{"selector": {"index": 1}, "fractionModel": "capacity", "computeMode": "sm-sharing"}],
}
"""GPU 0: products, time-slicing (defaults); GPU 1: capacity model, sm-sharing."""


def _node(config: NodeConfig) -> Iterator[Node]:
    # Short paths: unix socket paths are limited to 107 bytes.
    with tempfile.TemporaryDirectory(prefix="dra-") as tmp, ClaimServer() as claims:
        inventory = SimulatedGpuSource("simulated:H200x2", seed=NODE).discover()
        devices = {d.name: d for d in offered_devices(inventory, config)}
        node = Node(Path(tmp), devices, claims, RecordingEnforcer())
        node.make_device_nodes()
        yield node


@pytest.fixture
def node() -> Iterator[Node]:
    yield from _node(load_node_config(None))


@pytest.fixture
def mixed_node() -> Iterator[Node]:
    yield from _node(parse_node_config(MIXED_CONFIG))


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
    driver = node.driver()
    server = PluginServer(driver, paths, node.health, health_interval=health_interval)
    server.start()
    kubelet = kubelet_connect(paths)
    try:
        yield server, kubelet
    finally:
        kubelet.channel.close()
        server.stop(grace=0)
        driver.close()


@pytest.fixture
def served(node: Node) -> Iterator[tuple[Node, PluginServer, Kubelet]]:
    with serving(node) as (server, kubelet):
        yield node, server, kubelet
