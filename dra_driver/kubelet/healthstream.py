"""``DRAResourceHealth`` (v1alpha1 and v1): a stream of every device's health.

Each message carries the complete device list: the kubelet turns a device it has not heard
about Unknown once its timeout passes (k8s.io/kubernetes ``pkg/kubelet/cm/dra/healthinfo.go``)
and shows the status in the pod's ``status.containerStatuses[].allocatedResourcesStatus``.
What is healthy is decided by the plugin (see :class:`DeviceStatus`).

A stream holds one thread of the gRPC server's pool for its whole life (grpcio's synchronous
server runs a streaming handler in a pool thread), so streams are bounded: at most
:data:`MAX_HEALTH_STREAMS` at once over both versions (the kubelet keeps one per plugin,
``pkg/kubelet/cm/dra/manager.go``), further ones are refused with ``RESOURCE_EXHAUSTED``, and
the server's pool has that many threads on top of those for Prepare/Unprepare. A stream that
the client cancels (or whose connection drops) wakes at once and gives its thread back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import grpc

from dra_driver.model.devices import DeviceStatus

HEALTH_TIMEOUT_SECONDS = 60
"""How long the kubelet trusts one report; we resend well within it."""
MESSAGE_LIMIT = 1024
"""The kubelet keeps at most 1024 characters of a health message (k8s.io/api ``core/v1``
``ResourceHealthMessageMaxLength``; ``pkg/kubelet/cm/dra/manager.go`` truncates)."""
MAX_HEALTH_STREAMS = 4
"""Health streams served at once, both versions together (the kubelet needs one)."""


class StreamSlots:
    """Admission of health streams: at most ``limit`` at once; :meth:`close` ends them all.

    Args:
        limit: streams served at once.
    """

    def __init__(self, limit: int = MAX_HEALTH_STREAMS) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._ends: set[threading.Event] = set()
        self._closed = False

    @property
    def active(self) -> int:
        """Streams being served now."""
        with self._lock:
            return len(self._ends)

    @contextmanager
    def slot(self, context: grpc.ServicerContext) -> Iterator[threading.Event]:
        """Admit one stream for the ``with`` block; yields the event that is set when the
        stream must end (client cancelled, connection gone, or :meth:`close`).

        Aborts the RPC with ``RESOURCE_EXHAUSTED`` when ``limit`` streams run already.
        """
        end = threading.Event()
        with self._lock:
            admitted = not self._closed and len(self._ends) < self.limit
            if admitted:
                self._ends.add(end)
        if not admitted:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {self.limit} health streams at once; the kubelet keeps one per "
                "plugin, so close the others",
            )
        if not context.add_callback(end.set):
            end.set()  # already over
        try:
            yield end
        finally:
            with self._lock:
                self._ends.discard(end)

    def close(self) -> None:
        """End every stream now and admit no more (plugin shutdown)."""
        with self._lock:
            self._closed = True
            ends = list(self._ends)
        for end in ends:
            end.set()


def _stream(
    pb: Any,
    pool: str,
    health: Callable[[], Mapping[str, DeviceStatus]],
    end: threading.Event,
    interval: float,
    context: grpc.ServicerContext,
) -> Iterator[Any]:
    while context.is_active() and not end.is_set():
        now = int(time.time())
        reply = pb.NodeWatchResourcesResponse()
        for name, status in sorted(health().items()):
            reply.devices.add(
                device=pb.DeviceIdentifier(pool_name=pool, device_name=name),
                health=pb.HEALTHY if status.healthy else pb.UNHEALTHY,
                last_updated_time=now,
                health_check_timeout_seconds=HEALTH_TIMEOUT_SECONDS,
                message=status.message[:MESSAGE_LIMIT],
            )
        yield reply
        end.wait(interval)


class HealthServicer:
    """``DRAResourceHealth`` of one version (``pb``: ``health_v1_pb2`` or
    ``health_v1alpha1_pb2``; the messages are the same); ``slots`` is shared by the versions."""

    def __init__(
        self,
        pb: ModuleType,
        pool: str,
        health: Callable[[], Mapping[str, DeviceStatus]],
        slots: StreamSlots,
        interval: float = 20.0,
    ) -> None:
        self._pb = pb
        self._pool = pool
        self._health = health
        self._slots = slots
        self._interval = interval

    def NodeWatchResources(  # noqa: N802
        self, request: Any, context: grpc.ServicerContext
    ) -> Iterator[Any]:
        """Stream the full device list every ``interval`` seconds until cancelled.

        Aborts with ``RESOURCE_EXHAUSTED`` when :data:`MAX_HEALTH_STREAMS` streams run already.
        """
        with self._slots.slot(context) as end:
            yield from _stream(self._pb, self._pool, self._health, end, self._interval, context)
