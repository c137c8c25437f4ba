"""prepare: a claim from the kubelet's call to its CDI spec (read, plan, over-commit
check, enforce, write, record) and back (unprepare); the checkpoint.
May import: model, infra, config, gpus, enforce, and the generated _proto."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dra_driver.faces import lazy_face

if TYPE_CHECKING:
    from dra_driver.prepare.checkpoint import CheckpointFormatError, read_boot_id
    from dra_driver.prepare.checkpoint import parse as parse_checkpoint
    from dra_driver.prepare.claims import ApiClaimReader
    from dra_driver.prepare.orphans import OrphanSweep
    from dra_driver.prepare.preparation import ClaimPreparation
    from dra_driver.prepare.reads import CLAIM_READERS

__all__ = [
    "ApiClaimReader",
    "CLAIM_READERS",
    "CheckpointFormatError",
    "ClaimPreparation",
    "OrphanSweep",
    "parse_checkpoint",
    "read_boot_id",
]

__getattr__ = lazy_face(__name__, __file__)
