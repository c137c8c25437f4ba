"""The two gRPC servers on unix sockets: registration and DRA (+ health).

Socket paths (as k8s.io/dynamic-resource-allocation ``kubeletplugin/draplugin.go`` names
them): registration ``<registry-dir>/<driver>-reg.sock`` and DRA
``<plugin-dir>/<driver>/dra.sock``; with a rolling-update UID (the pod UID)
``<driver>-<uid>-reg.sock`` and ``dra-<uid>.sock`` so old and new instances coexist.
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
from dra_driver.atomicfile import ensure_dir
from dra_driver.driver import Driver
from dra_driver.kubelet.dra import v1_servicer, v1beta1_servicer
from dra_driver.kubelet.health import DeviceStatus, HealthServicer
from dra_driver.kubelet.registration import RegistrationServicer

log = structlog.get_logger(__name__)

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/plugins"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"


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
    """Serves registration and DRA/health for one :class:`Driver` until :meth:`stop`."""

    def __init__(
        self,
        driver: Driver,
        paths: SocketPaths,
        health: Callable[[], Mapping[str, DeviceStatus]],
        health_interval: float = 20.0,
    ) -> None:
        self.driver = driver
        self.paths = paths
        self._stop = threading.Event()
        self._dra = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(v1_servicer(driver), self._dra)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(v1beta1_servicer(driver), self._dra)
        health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            HealthServicer(health_v1_pb2, driver.pool, health, self._stop, health_interval),
            self._dra,
        )
        health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            HealthServicer(health_v1alpha1_pb2, driver.pool, health, self._stop, health_interval),
            self._dra,
        )
        self.registration = RegistrationServicer(
            driver.driver_name, str(paths.dra), on_rejected=self._schedule_reregister
        )
        self._reg: grpc.Server | None = None
        self._reg_lock = threading.Lock()

    def start(self) -> None:
        """Listen on both sockets (stale socket files are replaced)."""
        _listen(self._dra, self.paths.dra)
        self._dra.start()
        self._start_registration()
        log.info(
            "plugin listening", dra=str(self.paths.dra), registration=str(self.paths.registration)
        )

    def _start_registration(self) -> None:
        with self._reg_lock:
            if self._reg is not None:
                self._reg.stop(grace=1).wait()
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
            registration_pb2_grpc.add_RegistrationServicer_to_server(self.registration, server)
            _listen(server, self.paths.registration)
            server.start()
            self._reg = server

    def _schedule_reregister(self, error: str) -> None:
        def again() -> None:
            if not self._stop.wait(2.0):
                self._start_registration()

        threading.Thread(target=again, name="reregister", daemon=True).start()

    def stop(self, grace: float = 5.0) -> None:
        """Stop serving and remove both socket files (ResourceSlices are left in place)."""
        self._stop.set()
        with self._reg_lock:
            if self._reg is not None:
                self._reg.stop(grace=grace).wait()
        self._dra.stop(grace=grace).wait()
        for path in (self.paths.registration, self.paths.dra):
            path.unlink(missing_ok=True)
        log.info("plugin stopped; sockets removed")
