"""``pluginregistration.Registration``: how the kubelet discovers the plugin.

The kubelet watches ``<registry-dir>`` for ``<driver>-reg.sock``, calls ``GetInfo`` and
then ``NotifyRegistrationStatus`` (k8s.io/kubernetes ``pkg/kubelet/pluginmanager``). After a
rejection the plugin re-creates its registration socket so that the kubelet tries again; the
:class:`Reregistrar` does that in one worker thread, however many rejections arrive.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc
import structlog

from dra_driver._proto import registration_pb2 as pb
from dra_driver._proto import registration_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

SUPPORTED_VERSIONS = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
)
"""Services we serve, in preference order: the kubelet takes the first it supports."""


class RegistrationServicer(pb_grpc.RegistrationServicer):
    """Answers ``GetInfo`` and records ``NotifyRegistrationStatus``.

    ``on_rejected`` is called (with the kubelet's error text) when the kubelet reports
    ``plugin_registered=false``; the plugin then re-creates its registration socket so the
    kubelet tries again.
    """

    def __init__(
        self, driver_name: str, endpoint: str, on_rejected: Callable[[str], None] | None = None
    ) -> None:
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.on_rejected = on_rejected
        self.registered = threading.Event()
        self.called = threading.Event()
        """Set by the kubelet's first ``GetInfo``: it found the registration socket."""
        self.last_error = ""

    def GetInfo(self, request: pb.InfoRequest, context: grpc.ServicerContext) -> pb.PluginInfo:  # noqa: N802
        """Return type DRAPlugin, our name, DRA socket path and supported versions."""
        self.called.set()
        return pb.PluginInfo(
            type="DRAPlugin",
            name=self.driver_name,
            endpoint=self.endpoint,
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    def NotifyRegistrationStatus(  # noqa: N802
        self, request: pb.RegistrationStatus, context: grpc.ServicerContext
    ) -> pb.RegistrationStatusResponse:
        """Log the kubelet's verdict; on rejection schedule a re-registration."""
        if request.plugin_registered:
            self.last_error = ""
            self.registered.set()
            log.info("registered with kubelet", driver=self.driver_name)
        else:
            self.last_error = request.error
            self.registered.clear()
            log.error("kubelet rejected registration; retrying", error=request.error)
            if self.on_rejected is not None:
                self.on_rejected(request.error)
        return pb.RegistrationStatusResponse()


class Reregistrar:
    """One worker that re-creates the registration socket after rejections.

    Requests coalesce: any number of them while a re-registration is pending or running
    cause at most one more. The worker (started by the first request) waits ``delay``
    seconds before each re-registration, so a kubelet that keeps rejecting is not answered
    in a tight loop, and ends on :meth:`close`.

    Args:
        restart: re-creates the registration server (called in the worker thread only).
        delay: seconds between a request and the re-registration it causes.
    """

    def __init__(self, restart: Callable[[], None], delay: float = 2.0) -> None:
        self._restart = restart
        self._delay = delay
        self._wanted = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self.restarts = 0
        """Re-registrations done so far."""

    def request(self, error: str = "") -> None:
        """Ask for a re-registration (``error``: the kubelet's reason, unused); never blocks."""
        self._wanted.set()
        with self._lock:
            if self._worker is None and not self._closed.is_set():
                self._worker = threading.Thread(target=self._run, name="reregister", daemon=True)
                self._worker.start()

    def close(self) -> None:
        """Stop the worker (a pending re-registration is dropped)."""
        self._closed.set()
        self._wanted.set()

    def _run(self) -> None:
        while self._wanted.wait() and not self._closed.wait(self._delay):
            self._wanted.clear()
            try:
                self._restart()
                self.restarts += 1
            except Exception as exc:  # keep the worker for the next request
                log.error("re-registration failed; waiting for the next rejection", error=str(exc))
