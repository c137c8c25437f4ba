"""``DRAPlugin`` v1 and v1beta1: NodePrepareResources / NodeUnprepareResources.

Both versions share one implementation; v1 adds ``share_id`` on devices.
"""

from __future__ import annotations

from typing import Any

import grpc

from dra_driver._proto import dra_v1_pb2 as v1
from dra_driver._proto import dra_v1_pb2_grpc as v1_grpc
from dra_driver._proto import dra_v1beta1_pb2 as v1beta1
from dra_driver._proto import dra_v1beta1_pb2_grpc as v1beta1_grpc
from dra_driver.driver import Driver
from dra_driver.prepare import ClaimRef


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


def _prepare(driver: Driver, request: Any, pb: Any, with_share_id: bool) -> Any:
    reply = pb.NodePrepareResourcesResponse()
    for uid, outcome in driver.prepare(_refs(request)).items():
        entry = reply.claims[uid]
        if outcome.error:
            entry.error = outcome.error
            continue
        for d in outcome.devices:
            device = entry.devices.add(
                request_names=list(d.request_names),
                pool_name=d.pool,
                device_name=d.device,
                cdi_device_ids=list(d.cdi_device_ids),
            )
            if with_share_id and d.share_id:
                device.share_id = d.share_id
    return reply


def _unprepare(driver: Driver, request: Any, pb: Any) -> Any:
    reply = pb.NodeUnprepareResourcesResponse()
    for uid, error in driver.unprepare(_refs(request)).items():
        reply.claims[uid].error = error
    return reply


class DraV1Servicer(v1_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` over a :class:`Driver`."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def NodePrepareResources(  # noqa: N802
        self, request: v1.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1.NodePrepareResourcesResponse:
        """Prepare every claim in the request; per-claim errors go in the reply."""
        reply: v1.NodePrepareResourcesResponse = _prepare(self.driver, request, v1, True)
        return reply

    def NodeUnprepareResources(  # noqa: N802
        self, request: v1.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1.NodeUnprepareResourcesResponse:
        """Unprepare every claim in the request; per-claim errors go in the reply."""
        reply: v1.NodeUnprepareResourcesResponse = _unprepare(self.driver, request, v1)
        return reply


class DraV1beta1Servicer(v1beta1_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`` (deprecated in 1.34, still served)."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def NodePrepareResources(  # noqa: N802
        self, request: v1beta1.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1beta1.NodePrepareResourcesResponse:
        """Prepare every claim in the request; per-claim errors go in the reply."""
        reply: v1beta1.NodePrepareResourcesResponse = _prepare(self.driver, request, v1beta1, False)
        return reply

    def NodeUnprepareResources(  # noqa: N802
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        """Unprepare every claim in the request; per-claim errors go in the reply."""
        reply: v1beta1.NodeUnprepareResourcesResponse = _unprepare(self.driver, request, v1beta1)
        return reply
