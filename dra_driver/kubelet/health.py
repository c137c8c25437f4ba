"""``DRAResourceHealth`` (v1alpha1 and v1): a stream of every device's health.

Each message carries the complete device list: the kubelet turns a device it has not heard
about Unknown once its timeout passes (k8s.io/kubernetes ``pkg/kubelet/cm/dra/healthinfo.go``)
and shows the status in the pod's ``status.containerStatuses[].allocatedResourcesStatus``.
What is healthy is decided by the plugin (see :class:`DeviceStatus`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc

HEALTH_TIMEOUT_SECONDS = 60
"""How long the kubelet trusts one report; we resend well within it."""
MESSAGE_LIMIT = 1024
"""The kubelet keeps at most 1024 characters of a health message (k8s.io/api ``core/v1``
``ResourceHealthMessageMaxLength``; ``pkg/kubelet/cm/dra/manager.go`` truncates)."""


@dataclass(frozen=True)
class DeviceStatus:
    """Health of one device: healthy or not, and why (<= 1024 characters are sent)."""

    healthy: bool
    message: str


def _stream(
    pb: Any,
    pool: str,
    health: Callable[[], Mapping[str, DeviceStatus]],
    stop: threading.Event,
    interval: float,
    context: grpc.ServicerContext,
) -> Iterator[Any]:
    while context.is_active() and not stop.is_set():
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
        stop.wait(interval)


class HealthServicer:
    """``DRAResourceHealth`` of one version (``pb``: ``health_v1_pb2`` or
    ``health_v1alpha1_pb2``; the messages are the same)."""

    def __init__(
        self,
        pb: ModuleType,
        pool: str,
        health: Callable[[], Mapping[str, DeviceStatus]],
        stop: threading.Event,
        interval: float = 20.0,
    ) -> None:
        self._args = (pb, pool, health, stop, interval)

    def NodeWatchResources(  # noqa: N802
        self, request: Any, context: grpc.ServicerContext
    ) -> Iterator[Any]:
        """Stream the full device list every ``interval`` seconds until cancelled."""
        yield from _stream(*self._args, context)
