"""``DRAResourceHealth`` (v1alpha1 and v1): a stream of every device's health.

Each message carries the complete device list (dra-notes: devices not reported turn
Unknown after their timeout). A device is HEALTHY while its GPU is in the inventory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grpc

from dra_driver._proto import health_v1_pb2 as h1
from dra_driver._proto import health_v1_pb2_grpc as h1_grpc
from dra_driver._proto import health_v1alpha1_pb2 as h1a1
from dra_driver._proto import health_v1alpha1_pb2_grpc as h1a1_grpc
from dra_driver.slices import FractionDevice

HEALTH_TIMEOUT_SECONDS = 60
"""How long the kubelet trusts one report; we resend well within it."""


def _stream(
    pb: Any,
    pool: str,
    devices: Callable[[], Mapping[str, FractionDevice]],
    stop: threading.Event,
    interval: float,
    context: grpc.ServicerContext,
) -> Iterator[Any]:
    while context.is_active() and not stop.is_set():
        now = int(time.time())
        reply = pb.NodeWatchResourcesResponse()
        for name in sorted(devices()):
            reply.devices.add(
                device=pb.DeviceIdentifier(pool_name=pool, device_name=name),
                health=pb.HEALTHY,
                last_updated_time=now,
                health_check_timeout_seconds=HEALTH_TIMEOUT_SECONDS,
                message="GPU present",
            )
        yield reply
        stop.wait(interval)


class HealthV1Servicer(h1_grpc.DRAResourceHealthServicer):
    """``v1.DRAResourceHealth``."""

    def __init__(
        self,
        pool: str,
        devices: Callable[[], Mapping[str, FractionDevice]],
        stop: threading.Event,
        interval: float = 20.0,
    ) -> None:
        self._args = (pool, devices, stop, interval)

    def NodeWatchResources(  # noqa: N802
        self, request: h1.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[h1.NodeWatchResourcesResponse]:
        """Stream the full device list every ``interval`` seconds until cancelled."""
        yield from _stream(h1, *self._args, context)


class HealthV1alpha1Servicer(h1a1_grpc.DRAResourceHealthServicer):
    """``v1alpha1.DRAResourceHealth``."""

    def __init__(
        self,
        pool: str,
        devices: Callable[[], Mapping[str, FractionDevice]],
        stop: threading.Event,
        interval: float = 20.0,
    ) -> None:
        self._args = (pool, devices, stop, interval)

    def NodeWatchResources(  # noqa: N802
        self, request: h1a1.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[h1a1.NodeWatchResourcesResponse]:
        """Stream the full device list every ``interval`` seconds until cancelled."""
        yield from _stream(h1a1, *self._args, context)
