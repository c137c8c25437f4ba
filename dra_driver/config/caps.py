"""Caps on what a claim may ask (pure): the largest memory ceiling and SM percentage a device
share may get, from its DeviceClass's caps, the node's defaults (``claimLimits``) and the
claim's own (which only lower them). An admin grants burst above the guaranteed request by
setting a memory cap; without one a ceiling is the request.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_driver.config.params import ClaimLimits
from dra_driver.model.quantities import canonical_quantity


@dataclass(frozen=True)
class CapPolicy:
    """The caps that bound a claim's parameters on this node.

    Attributes:
        node: the node's default caps (node configuration ``claimLimits``), for requests
            whose class sets none.
        default_threads: the SM ceiling of sm-sharing claims that ask none
            (``--default-active-thread-percentage``), 1..100.
    """

    node: ClaimLimits = ClaimLimits()
    default_threads: int = 100


def memory_ceiling_cap(
    card: int, request: int, class_caps: ClaimLimits, claim_caps: ClaimLimits, node: ClaimLimits
) -> tuple[int, str]:
    """The largest ceiling (bytes) a device share may get, and where that cap comes from.

    The admin's level is the class's caps when its configs set a memory cap, else the node's
    (``claimLimits``); a portion is of the card, rounded down to a whole byte (as a
    ``memoryLimitPortion`` ceiling is). Without a
    memory cap at that level the ceiling is the request: no burst into the neighbours'
    memory unless an admin allows it. A claim's own caps only lower it. Never below the
    request (a cap below the request leaves the request as the ceiling).
    """
    level, source = (class_caps, "its DeviceClass") if class_caps.caps_memory else (node, "node")
    candidates: list[tuple[int, str]] = []
    for caps, src in ((level, source), (claim_caps, "the claim's own")):
        if caps.max_memory_limit_bytes is not None:
            text = f"maxMemoryLimit {canonical_quantity(caps.max_memory_limit_bytes)}"
            candidates.append((caps.max_memory_limit_bytes, f"{text} ({src})"))
        if caps.max_memory_limit_portion is not None:
            text = f"maxMemoryLimitPortion {caps.max_memory_limit_portion}"
            cap = int(card * caps.max_memory_limit_portion)  # as memoryLimitPortion's ceiling
            candidates.append((cap, f"{text} ({src})"))
    if not level.caps_memory:
        candidates.append((request, "the request: no burst without a cap set by an admin"))
    cap, why = min(candidates)
    return max(cap, request), why


def thread_cap(class_caps: ClaimLimits, claim_caps: ClaimLimits, node: ClaimLimits) -> int | None:
    """The largest active thread percentage a share may get (None: 100): the class's cap, else
    the node's, lowered by the claim's own."""
    level = class_caps if class_caps.max_active_thread_percentage is not None else node
    caps = [
        c
        for c in (level.max_active_thread_percentage, claim_caps.max_active_thread_percentage)
        if c is not None
    ]
    return min(caps) if caps else None
