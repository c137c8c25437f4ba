"""Candidate layout (c): per GPU ``gpu-<i>-ts`` and ``gpu-<i>-sm``, shareable, capacity
``fraction``, both consuming the GPU's counter ``gpu: 1`` (see ``modes.py``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import modes  # noqa: E402


def slices(node: str, gpus: int) -> list[dict[str, Any]]:
    return modes.slices(node, gpus, memory=False)


def classes() -> list[dict[str, Any]]:
    return modes.classes(memory=False)


claim_spec = modes.claim_spec
