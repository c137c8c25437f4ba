"""publish: the node's offer as ResourceSlices (devices, counters, taints, health),
kept in sync with the API server.
May import: model, infra, config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dra_driver.faces import lazy_face

if TYPE_CHECKING:
    from dra_driver.publish.devicehealth import device_health
    from dra_driver.publish.devicetaints import DeviceTaint, TaintMemory
    from dra_driver.publish.nodeowner import NodeOwner
    from dra_driver.publish.offer import offered_devices
    from dra_driver.publish.publisher import SlicePublisher
    from dra_driver.publish.slices import build_slices

__all__ = [
    "DeviceTaint",
    "NodeOwner",
    "SlicePublisher",
    "TaintMemory",
    "build_slices",
    "device_health",
    "offered_devices",
]

__getattr__ = lazy_face(__name__, __file__)
