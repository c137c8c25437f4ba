"""A second, minimal DRA driver for a real node: registration and ``v1.DRAPlugin`` over unix
sockets in the node's kubelet directory, as any kubelet plugin serves them.

It prepares whatever the kubelet sends it: for each claim it reads the claim from the API
server and answers every allocation result whose driver is its own (no CDI devices: nothing
to inject), and records the calls. It exists so that a test can allocate one claim to two
drivers on one node (kubernetes-sigs/dra-driver-nvidia-gpu#1327, #435) and see that the
kubelet hands the whole claim to both.

The sockets are created at host paths inside the node's directory (``<node>/kubelet/...``,
bind-mounted at ``/var/lib/kubelet`` in the node), and ``GetInfo`` names the path the kubelet
sees, which is the same socket.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dra_driver._proto import dra_v1_pb2 as dra
from dra_driver._proto import dra_v1_pb2_grpc as dra_grpc
from dra_driver._proto import registration_pb2 as reg
from dra_driver._proto import registration_pb2_grpc as reg_grpc

KUBELET_DIR = "/var/lib/kubelet"


@dataclass
class OtherDriver:
    """The driver ``name`` on a node whose kubelet directory is ``kubelet_dir`` on the host.

    Attributes:
        read_claim: (namespace, name) -> the ResourceClaim as the API server returns it.
        prepared / unprepared: claim UIDs in call order.
        registered: set once the kubelet reported the registration accepted.
    """

    name: str
    kubelet_dir: Path
    read_claim: Callable[[str, str], Mapping[str, Any]]
    prepared: list[str] = field(default_factory=list)
    unprepared: list[str] = field(default_factory=list)
    registered: threading.Event = field(default_factory=threading.Event)
    _servers: list[grpc.Server] = field(default_factory=list)
    _links: Path | None = None

    @property
    def dra_socket(self) -> Path:
        return self.kubelet_dir / "plugins" / self.name / "dra.sock"

    @property
    def registration_socket(self) -> Path:
        return self.kubelet_dir / "plugins_registry" / f"{self.name}-reg.sock"

    def start(self) -> None:
        """Listen on the DRA socket, then on the registration socket (the kubelet's cue).

        A node directory can be deeper than a unix socket path may be long (107 bytes), so
        each socket is bound through a short symlink to its directory (bind follows it)."""
        self._links = Path(tempfile.mkdtemp(prefix="odrv-"))
        for i, (socket, servicer) in enumerate(
            ((self.dra_socket, _Dra(self)), (self.registration_socket, _Registration(self)))
        ):
            socket.parent.mkdir(parents=True, exist_ok=True)
            link = self._links / str(i)
            link.symlink_to(socket.parent)
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            if isinstance(servicer, _Dra):
                dra_grpc.add_DRAPluginServicer_to_server(servicer, server)
            else:
                reg_grpc.add_RegistrationServicer_to_server(servicer, server)
            server.add_insecure_port(f"unix://{link / socket.name}")
            server.start()
            self._servers.append(server)

    def stop(self) -> None:
        """Stop serving and remove both sockets (the kubelet then forgets the driver)."""
        for server in reversed(self._servers):
            server.stop(grace=1).wait()
        self._servers.clear()
        for path in (self.registration_socket, self.dra_socket):
            path.unlink(missing_ok=True)
        with_parent = self.dra_socket.parent
        if with_parent.is_dir() and not any(with_parent.iterdir()):
            with_parent.rmdir()
        if self._links is not None:
            shutil.rmtree(self._links, ignore_errors=True)


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, driver: OtherDriver) -> None:
        self.driver = driver

    def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:  # noqa: N802
        relative = self.driver.dra_socket.relative_to(self.driver.kubelet_dir)
        return reg.PluginInfo(
            type="DRAPlugin",
            name=self.driver.name,
            endpoint=f"{KUBELET_DIR}/{relative}",
            supported_versions=["v1.DRAPlugin"],
        )

    def NotifyRegistrationStatus(  # noqa: N802
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            self.driver.registered.set()
        return reg.RegistrationStatusResponse()


class _Dra(dra_grpc.DRAPluginServicer):
    def __init__(self, driver: OtherDriver) -> None:
        self.driver = driver

    def NodePrepareResources(  # noqa: N802
        self, request: dra.NodePrepareResourcesRequest, context: Any
    ) -> dra.NodePrepareResourcesResponse:
        out = dra.NodePrepareResourcesResponse()
        for c in request.claims:
            self.driver.prepared.append(c.uid)
            claim = self.driver.read_claim(c.namespace, c.name)
            results = claim["status"]["allocation"]["devices"]["results"]
            answer = out.claims[c.uid]
            for r in results:
                if r["driver"] == self.driver.name:
                    answer.devices.add(
                        request_names=[r["request"]], pool_name=r["pool"], device_name=r["device"]
                    )
        return out

    def NodeUnprepareResources(  # noqa: N802
        self, request: dra.NodeUnprepareResourcesRequest, context: Any
    ) -> dra.NodeUnprepareResourcesResponse:
        out = dra.NodeUnprepareResourcesResponse()
        for c in request.claims:
            self.driver.unprepared.append(c.uid)
            out.claims[c.uid].error = ""
        return out
