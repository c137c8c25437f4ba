"""cluster: what runs off the node, against the whole cluster: the ``dra-driver occupancy``
command (who holds which fraction of which GPU, and how much memory each uses), and the
cluster-wide objects the chart installs beside the node's slices (the DeviceClasses and the
sizing admission policies).
May import: model, infra, config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dra_driver.faces import lazy_face

if TYPE_CHECKING:
    from dra_driver.cluster.deviceclasses import build_device_classes
    from dra_driver.cluster.occupancy import gib
    from dra_driver.cluster.occupancycmd import OccupancyError, occupancy_report
    from dra_driver.cluster.occupancyrender import render_json, render_table
    from dra_driver.cluster.sizing import class_slots, sizing_policy

__all__ = [
    "OccupancyError",
    "build_device_classes",
    "class_slots",
    "gib",
    "occupancy_report",
    "render_json",
    "render_table",
    "sizing_policy",
]

__getattr__ = lazy_face(__name__, __file__)
