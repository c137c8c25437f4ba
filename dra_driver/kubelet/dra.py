"""``DRAPlugin`` v1 and v1beta1: NodePrepareResources / NodeUnprepareResources.

Both versions have the same messages (v1 adds ``share_id`` on devices), so one servicer
class serves both, parameterized by the version's generated message module.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import grpc

from dra_driver._proto import dra_v1_pb2, dra_v1beta1_pb2
from dra_driver.driver import Driver
from dra_driver.prepare import ClaimRef


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


class DraServicer:
    """One ``DRAPlugin`` version over a :class:`Driver`.

    Args:
        driver: does the work.
        pb: the version's message module (``dra_v1_pb2`` or ``dra_v1beta1_pb2``); devices
            get a ``share_id`` only where its ``Device`` message has the field (v1).
    """

    def __init__(self, driver: Driver, pb: ModuleType) -> None:
        self.driver = driver
        self.pb = pb
        self.with_share_id = "share_id" in pb.Device.DESCRIPTOR.fields_by_name

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Prepare every claim in the request; per-claim errors go in the reply."""
        reply = self.pb.NodePrepareResourcesResponse()
        for uid, outcome in self.driver.prepare(_refs(request)).items():
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
                if self.with_share_id and d.share_id:
                    device.share_id = d.share_id
        return reply

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Unprepare every claim in the request; per-claim errors go in the reply."""
        reply = self.pb.NodeUnprepareResourcesResponse()
        for uid, error in self.driver.unprepare(_refs(request)).items():
            reply.claims[uid].error = error
        return reply


def v1_servicer(driver: Driver) -> DraServicer:
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``."""
    return DraServicer(driver, dra_v1_pb2)


def v1beta1_servicer(driver: Driver) -> DraServicer:
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`` (deprecated in 1.34, still served)."""
    return DraServicer(driver, dra_v1beta1_pb2)
