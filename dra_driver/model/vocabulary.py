"""The driver's vocabulary: the one place where its enumerated names are spelled.

String enums, so a member equals its text (``ComputeMode.SM_SHARING == "sm-sharing"``) and
values read from YAML, JSON or the API compare with members directly.
"""

from __future__ import annotations

from enum import StrEnum


class ComputeMode(StrEnum):
    """How claims on one GPU share its streaming multiprocessors (SMs).

    - ``time-slicing``: every claim may use all SMs; the MPS server of the GPU time-shares them.
    - ``sm-sharing``: each claim gets an MPS active thread percentage (a share of the SMs).

    One GPU is in one compute mode at a time (never both).
    """

    TIME_SLICING = "time-slicing"
    SM_SHARING = "sm-sharing"


class Tier(StrEnum):
    """How the memory ceiling of a fraction is enforced (see docs/enforcement.md).

    - ``hard``: the MPS pinned device memory limit is applied to every client.
    - ``cooperative``: the limit is set where the platform allows it, but some clients may get
      around it (e.g. a GPU or driver branch without per-client limits).
    - ``none``: the ceiling is published and accounted, not enforced on the GPU.
    """

    HARD = "hard"
    COOPERATIVE = "cooperative"
    NONE = "none"


class FractionModel(StrEnum):
    """How a GPU is offered: fixed-size ``products`` or consumable ``capacity`` (memory)."""

    PRODUCTS = "products"
    CAPACITY = "capacity"


COMPUTE_MODES: tuple[ComputeMode, ...] = tuple(ComputeMode)
"""All compute modes, in the order they are documented and rendered."""

TIERS: tuple[Tier, ...] = tuple(Tier)
"""All enforcement tiers, strongest first."""

FRACTION_MODELS: tuple[FractionModel, ...] = tuple(FractionModel)
"""All fraction models."""

ANY_PRODUCT = "*"
"""``product`` attribute of a GPU's shared products device: it serves every product the GPU
offers (an extended-resource device names its one product instead)."""

AUTO_COMPUTE_MODE = "auto"
"""Node-configuration value for a GPU whose compute mode follows its claims: it publishes one
device per mode, and the scheduler gives it claims of one mode at a time."""

COMPUTE_MODE_SETTINGS: tuple[str, ...] = (AUTO_COMPUTE_MODE, *COMPUTE_MODES)
"""Values of ``computeMode`` in the node configuration: ``auto`` or one pinned mode."""
