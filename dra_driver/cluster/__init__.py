"""cluster: what runs off the node, against the whole cluster: the ``dra-driver occupancy``
command: who holds which fraction of which GPU, how much memory each uses, and why a pod
waits. (The cluster-wide objects, the DeviceClasses and the sizing admission policies, are
written once, in the chart: ``devtools/chartrender.py`` renders them for everything else.)
May import: model, infra, config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dra_driver.faces import lazy_face

if TYPE_CHECKING:
    from dra_driver.cluster.occupancy import gib
    from dra_driver.cluster.occupancycmd import OccupancyError, occupancy_report
    from dra_driver.cluster.occupancyrender import render_json, render_table

__all__ = [
    "OccupancyError",
    "gib",
    "occupancy_report",
    "render_json",
    "render_table",
]

__getattr__ = lazy_face(__name__, __file__)
