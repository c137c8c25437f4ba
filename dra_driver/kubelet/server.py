"""The two gRPC servers on unix sockets: registration and DRA (+ health).

Socket paths (as k8s.io/dynamic-resource-allocation ``kubeletplugin/draplugin.go`` names
them): registration ``<registry-dir>/<driver>-reg.sock`` and DRA
``<plugin-dir>/<driver>/dra.sock``; with a rolling-update UID (the pod UID)
``<driver>-<uid>-reg.sock`` and ``dra-<uid>.sock`` so old and new instances coexist.

Threads: the DRA server's pool has :data:`DRA_WORKERS` threads for Prepare/Unprepare plus one
per admitted health stream (:data:`~dra_driver.kubelet.healthstream.MAX_HEALTH_STREAMS`), so open
or cancelled health streams never make Prepare wait. Both servers refuse requests that do not
decode (:mod:`dra_driver.kubelet.decoding`) and keep a bounded receive size.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from dra_driver._proto import (
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    registration_pb2_grpc,
)
from dra_driver.infra.atomicfile import ensure_dir, private_dir
from dra_driver.kubelet.decoding import DecodeInHandler
from dra_driver.kubelet.dra import v1_servicer, v1beta1_servicer
from dra_driver.kubelet.healthstream import MAX_HEALTH_STREAMS, HealthServicer, StreamSlots
from dra_driver.kubelet.registration import RegistrationServicer, Reregistrar
from dra_driver.model.devices import DeviceStatus
from dra_driver.prepare.preparation import ClaimPreparation

log = structlog.get_logger(__name__)

DRA_WORKERS = 8
"""Threads of the DRA server for Prepare/Unprepare (health streams get their own on top)."""
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""Largest request accepted, bytes: gRPC's default receive limit (4 MiB), set explicitly."""
SERVER_OPTIONS = (("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),)


@dataclass(frozen=True)
class SocketPaths:
    """Where the plugin listens."""

    registration: Path
    dra: Path

    @classmethod
    def for_driver(
        cls, driver_name: str, plugin_dir: str, registry_dir: str, rolling_uid: str = ""
    ) -> SocketPaths:
        """Kubelet-conventional paths for ``driver_name`` (optionally rolling-update style)."""
        suffix = f"-{rolling_uid}" if rolling_uid else ""
        return cls(
            registration=Path(registry_dir) / f"{driver_name}{suffix}-reg.sock",
            dra=Path(plugin_dir) / driver_name / (f"dra{suffix}.sock"),
        )


def _server(workers: int) -> grpc.Server:
    """A gRPC server with ``workers`` threads, our options and the decoding interceptor."""
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers),
        interceptors=[DecodeInHandler()],
        options=SERVER_OPTIONS,
    )


def _listen(server: grpc.Server, path: Path) -> None:
    """Bind ``server`` to the unix socket ``path``: owner-only (0600, the kubelet runs as root),
    in a directory created owner-only (0700) if missing, whatever the umask. The server is
    not started yet, so nothing is served before the mode is set."""
    ensure_dir(path.parent, 0o700)
    path.unlink(missing_ok=True)
    if server.add_insecure_port(f"unix://{path}") == 0:
        raise OSError(f"cannot listen on {path}")
    os.chmod(path, 0o600)


class PluginServer:
    """Serves registration and DRA/health for one :class:`ClaimPreparation` until :meth:`stop`."""

    def __init__(
        self,
        preparation: ClaimPreparation,
        paths: SocketPaths,
        health: Callable[[], Mapping[str, DeviceStatus]],
        health_interval: float = 20.0,
    ) -> None:
        self.preparation = preparation
        self.paths = paths
        self.health_streams = StreamSlots(MAX_HEALTH_STREAMS)
        self._dra = _server(DRA_WORKERS + MAX_HEALTH_STREAMS)
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(v1_servicer(preparation), self._dra)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
            v1beta1_servicer(preparation), self._dra
        )
        health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            HealthServicer(
                health_v1_pb2, preparation.pool, health, self.health_streams, health_interval
            ),
            self._dra,
        )
        health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            HealthServicer(
                health_v1alpha1_pb2, preparation.pool, health, self.health_streams, health_interval
            ),
            self._dra,
        )
        self._reregistrar = Reregistrar(self._start_registration)
        self.registration = RegistrationServicer(
            preparation.driver_name, str(paths.dra), on_rejected=self._reregistrar.request
        )
        self._reg: grpc.Server | None = None
        self._reg_lock = threading.Lock()
        self._stopped = False

    @property
    def reregistrations(self) -> int:
        """How many times the registration socket was re-created after a rejection."""
        return self._reregistrar.restarts

    def start(self) -> None:
        """Listen on both sockets (stale socket files are replaced)."""
        private_dir(self.paths.dra.parent)  # ours alone: 0700 even if the kubelet made it
        _listen(self._dra, self.paths.dra)
        self._dra.start()
        self._start_registration()
        log.info(
            "plugin listening", dra=str(self.paths.dra), registration=str(self.paths.registration)
        )

    def _start_registration(self) -> None:
        with self._reg_lock:
            if self._stopped:
                return
            if self._reg is not None:
                self._reg.stop(grace=1).wait()
            server = _server(2)
            registration_pb2_grpc.add_RegistrationServicer_to_server(self.registration, server)
            _listen(server, self.paths.registration)
            server.start()
            self._reg = server

    def stop(self, grace: float = 5.0) -> None:
        """Stop serving and remove both socket files (ResourceSlices are left in place)."""
        self._reregistrar.close()
        self.health_streams.close()
        with self._reg_lock:
            self._stopped = True
            if self._reg is not None:
                self._reg.stop(grace=grace).wait()
        self._dra.stop(grace=grace).wait()
        for path in (self.paths.registration, self.paths.dra):
            path.unlink(missing_ok=True)
        log.info("plugin stopped; sockets removed")
