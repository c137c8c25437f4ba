"""A simulated node for in-process tests: directories, inventory, API server stub, driver."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver._proto import k8s_resourceclaim_pb2 as pb
from dra_driver.config.node import DEFAULT_PRODUCTS, NodeConfig, default_node_config
from dra_driver.enforce import FractionEnforcer, RecordingEnforcer
from dra_driver.gpus import SimulatedGpuSource, simnode
from dra_driver.infra.budget import STARTUP_BUDGET_S
from dra_driver.infra.locking import PrepareLock
from dra_driver.model.devices import DeviceStatus, PublishedDevice
from dra_driver.model.plans import ClaimPlan
from dra_driver.model.vocabulary import COMPUTE_MODES, FractionModel
from dra_driver.prepare.claims import ApiClaimReader
from dra_driver.prepare.preparation import ClaimPreparation
from dra_driver.publish.devicehealth import device_health
from dra_driver.publish.offer import offered_devices
from tests.support import claimfactory as cf
from tests.support.apiserver_stub import ClaimServer
from tests.support.nodedirs import NodeDirs

NODE = "node-a"


@dataclass
class Node(NodeDirs):
    """Directories, the simulated inventory and what the kubelet would see."""

    root: Path
    devices: dict[str, PublishedDevice]
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

    def preparation(
        self,
        boot_id: str = "boot-1",
        enforcer: FractionEnforcer | None = None,
        startup_budget: float = STARTUP_BUDGET_S,
        on_prepared: Callable[[ClaimPlan], None] | None = None,
        claims: ClaimServer | None = None,
        on_read: Callable[[pb.ResourceClaim], None] | None = None,
    ) -> ClaimPreparation:
        """A started ClaimPreparation for this node (its own enforcer unless one is given),
        reading claims from its claim server (or ``claims``; ``on_read``: as
        :class:`ApiClaimReader`'s)."""
        server = claims or self.claims
        d = ClaimPreparation(
            driver_name=DEFAULT_DRIVER_NAME,
            pool=NODE,
            reader=ApiClaimReader(server.api_client(), on_read),
            devices=lambda: self.devices,
            enforcer=enforcer or self.enforcer,
            cdi_root=self.cdi_root,
            state_dir=self.state_dir,
            lock=PrepareLock(self.plugin_dir / DEFAULT_DRIVER_NAME / "prepare.lock"),
            boot_id=boot_id,
            device_root=self.device_root,
            startup_budget=startup_budget,
            on_prepared=on_prepared,
        )
        d.start()
        return d

    def device(self, gpu: int, product: str | None, mode: str | None = None) -> str:
        """Name of the device a claim for ``product`` (None: the capacity model) gets on GPU
        ``gpu``: the GPU's shared device in ``mode`` (default: the first one offered)."""
        model = FractionModel.CAPACITY if product is None else FractionModel.PRODUCTS
        return next(
            d.name
            for d in self.devices.values()
            if d.gpu.index == gpu
            and d.fraction_model == model
            and d.product is None
            and (mode is None or d.compute_mode == mode)
        )

    def share(
        self,
        gpu: int,
        product: str | None,
        request: str = "gpu",
        mode: str | None = None,
        memory: str | None = None,
    ) -> dict[str, Any]:
        """An allocation result as the scheduler writes it for one claim of ``product`` (None:
        ``memory`` of the capacity model) on GPU ``gpu``: see :func:`share_result`."""
        device = self.devices[self.device(gpu, product, mode)]
        return share_result(device, NODE, product, request, memory)


def share_result(
    device: PublishedDevice,
    pool: str,
    product: str | None,
    request: str = "gpu",
    memory: str | None = None,
) -> dict[str, Any]:
    """An allocation result of one claim for ``product`` (None: ``memory`` of the capacity
    model) on the shared ``device`` of pool ``pool``: a fresh share ID and the consumed
    ``slots`` (``portion * slotsPerGpu``) or ``memory``. For plugins run as processes, whose
    devices a test computes with ``offered_devices``."""
    share = str(uuid.uuid4())
    if product is None:
        return cf.result(device.name, pool, request=request, share_id=share, memory=memory)
    portion = next(p.portion for p in DEFAULT_PRODUCTS if p.name == product)
    slots = str(int(portion * device.slots))
    return cf.result(device.name, pool, request=request, share_id=share, slots=slots)


def shared_devices(devices: dict[str, PublishedDevice]) -> list[PublishedDevice]:
    """The products-model shared devices of ``devices`` (one per GPU and compute mode, the
    ones product claims are allocated shares of), ordered by GPU index, then compute mode in
    :data:`~dra_driver.model.vocabulary.COMPUTE_MODES` order."""
    shared = [
        d
        for d in devices.values()
        if d.fraction_model == FractionModel.PRODUCTS and d.product is None
    ]
    return sorted(shared, key=lambda d: (d.gpu.index, COMPUTE_MODES.index(d.compute_mode)))


def plugin_devices(gpus: str, node: str) -> dict[str, PublishedDevice]:
    """The devices by name that ``dra-driver kubelet-plugin --gpus=<gpus> --node-name=<node>``
    offers with the default node configuration (``gpus``: a ``simulated:`` inventory)."""
    inventory = SimulatedGpuSource(gpus, seed=node).discover()
    return {d.name: d for d in offered_devices(inventory, default_node_config())}


MIXED_CONFIG = {
    "apiVersion": "gpu-fraction.dra.dev/v1alpha1",
    "kind": "NodeConfig",
    "gpus": [{"selector": {"index": 1}, "fractionModel": "capacity", "computeMode": "sm-sharing"}],
}
"""GPU 0: products, compute mode auto (defaults); GPU 1: capacity model, pinned to sm-sharing."""


def make_node(config: NodeConfig) -> Iterator[Node]:
    # Short paths: unix socket paths are limited to 107 bytes.
    with tempfile.TemporaryDirectory(prefix="dra-") as tmp, ClaimServer() as claims:
        inventory = SimulatedGpuSource("simulated:H200x2", seed=NODE).discover()
        devices = {d.name: d for d in offered_devices(inventory, config)}
        node = Node(Path(tmp), devices, claims, RecordingEnforcer())
        node.make_device_nodes()
        yield node
