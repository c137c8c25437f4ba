"""Fraction enforcement on the node (MPS memory ceilings and compute mode), behind one interface.

The plugin calls a :class:`FractionEnforcer` during Prepare/Unprepare. Implementations:
:class:`RecordingEnforcer` (simulated GPUs: records what it was asked and returns the CDI
edits a real node would get) and the MPS-backed enforcer for real GPUs.
"""

from __future__ import annotations

from dra_driver.mps.base import FractionEnforcer, MpsError
from dra_driver.mps.recording import RecordingEnforcer

__all__ = ["FractionEnforcer", "MpsError", "RecordingEnforcer"]
