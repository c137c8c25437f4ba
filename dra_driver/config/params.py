"""The driver's opaque claim parameters (pure): parsing, validation and merging.

A ResourceClaim (or DeviceClass) carries them in ``spec.devices.config[].opaque`` with
``driver: <our driver>``; the allocation result copies them to
``status.allocation.devices.config`` with ``source`` FromClass or FromClaim. Shape::

    apiVersion: gpu-fraction.dra.dev/v1alpha1
    kind: GpuFractionParameters
    memoryLimit: 60Gi            # absolute ceiling (Kubernetes quantity), or
    memoryLimitPortion: "0.8"    # ceiling as a portion of the card, in (0, 1]
    computeMode: sm-sharing      # or time-slicing; must equal the GPU's mode
    activeThreadPercentage: 50   # 1..100, sm-sharing only
    maxConsumers: 2              # 1..32 containers using the claim at once (default 1);
                                 # the ceiling and the request are divided among them
    maxMemoryLimit: 40Gi         # caps (an admin writes them in a DeviceClass's config)
    maxMemoryLimitPortion: "0.5"
    maxActiveThreadPercentage: 25

Every field is optional. Class configs apply first, then claim configs; a later config
overrides the fields it sets (Kubernetes DRA: "the later wins"), except the ``max*`` caps:
every config may lower a cap, none may raise one (the smallest wins), so a tenant's claim
cannot undo its class's caps. How caps are resolved against the node's defaults:
:func:`dra_driver.config.caps.memory_ceiling_cap`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from decimal import Decimal
from fractions import Fraction
from typing import Any

from dra_driver.model.apijson import json_kind
from dra_driver.model.errors import ClaimError
from dra_driver.model.quantities import QuantityError, quantity_decimal
from dra_driver.model.textlimits import shorten, shown
from dra_driver.model.vocabulary import COMPUTE_MODES, ComputeMode

PARAMS_API_VERSION = "gpu-fraction.dra.dev/v1alpha1"
PARAMS_KIND = "GpuFractionParameters"
"""The two compute modes; one GPU carries exactly one of them."""

CAP_FIELDS = ("maxMemoryLimit", "maxMemoryLimitPortion", "maxActiveThreadPercentage")
"""The caps: maxima of ``memoryLimit`` (bytes), of the ceiling as a portion of the card, and of
``activeThreadPercentage``; in a class config, in a claim config (only lowers them) and, as
the node's defaults, in the node configuration's ``claimLimits``."""

_FIELDS = {
    "apiVersion",
    "kind",
    "memoryLimit",
    "memoryLimitPortion",
    "computeMode",
    "activeThreadPercentage",
    "maxConsumers",
    *CAP_FIELDS,
}

MAX_CONSUMERS = 32
"""Most containers one claim may serve at once (``maxConsumers``): each gets at least 1/32 of
the claim's ceiling, and the claim's MPS clients stay within its share of the server's client
table (``docs/enforcement.md``, "Sharing a claim")."""


MAX_BYTES = 2**63 - 1
"""Largest byte count accepted (Kubernetes quantities are int64 in the API server)."""
_DECIMAL = re.compile(r"[0-9]*\.?[0-9]+")
"""Plain decimal notation, as the claim-parameters admission policy accepts it."""


class ParameterError(ClaimError, ValueError):
    """Invalid claim parameters; the message names the field and how to fix it."""


@dataclass(frozen=True)
class ClaimLimits:
    """Caps on what a claim's parameters may ask (None: that cap is not set here).

    Attributes:
        max_memory_limit_bytes: largest ceiling, bytes (``maxMemoryLimit``).
        max_memory_limit_portion: largest ceiling as a portion of the card, in (0, 1]
            (``maxMemoryLimitPortion``).
        max_active_thread_percentage: largest SM ceiling, 1..100
            (``maxActiveThreadPercentage``).
    """

    max_memory_limit_bytes: int | None = None
    max_memory_limit_portion: Fraction | None = None
    max_active_thread_percentage: int | None = None

    @property
    def caps_memory(self) -> bool:
        """Whether a memory cap (bytes or portion) is set."""
        return self.max_memory_limit_bytes is not None or self.max_memory_limit_portion is not None

    def lowered(self, other: ClaimLimits) -> ClaimLimits:
        """Each cap: the smaller of this one's and ``other``'s (unset caps do not count)."""

        def low(a: Any, b: Any) -> Any:
            return b if a is None else a if b is None else min(a, b)

        return ClaimLimits(
            low(self.max_memory_limit_bytes, other.max_memory_limit_bytes),
            low(self.max_memory_limit_portion, other.max_memory_limit_portion),
            low(self.max_active_thread_percentage, other.max_active_thread_percentage),
        )


def parse_limits(raw: Any, where: str) -> ClaimLimits:
    """The caps of a parameters object or of the node configuration's ``claimLimits``: the
    entries of :data:`CAP_FIELDS` present in ``raw`` (a mapping), validated.

    Raises:
        ParameterError: a malformed quantity, a portion outside (0, 1], a percentage outside
            1..100.
    """
    pct = raw.get("maxActiveThreadPercentage")
    if pct is not None and (
        isinstance(pct, bool) or not isinstance(pct, int) or not 1 <= pct <= 100
    ):
        raise ParameterError(f"{where}.maxActiveThreadPercentage: {shown(pct)} must be 1..100")
    return ClaimLimits(
        max_memory_limit_bytes=(
            quantity_bytes(raw["maxMemoryLimit"], f"{where}.maxMemoryLimit")
            if "maxMemoryLimit" in raw
            else None
        ),
        max_memory_limit_portion=(
            _portion(raw["maxMemoryLimitPortion"], f"{where}.maxMemoryLimitPortion")
            if "maxMemoryLimitPortion" in raw
            else None
        ),
        max_active_thread_percentage=pct,
    )


@dataclass(frozen=True)
class ClaimParameters:
    """Validated parameters for one allocated device (after merging).

    Attributes:
        memory_limit_bytes: absolute ceiling in bytes, or None.
        memory_limit_portion: ceiling as a portion of the card in (0, 1], or None.
        compute_mode: ``time-slicing`` | ``sm-sharing`` | None (= the GPU's mode).
        active_thread_percentage: 1..100 or None (sm-sharing only).
        max_consumers: 1..:data:`MAX_CONSUMERS` containers that may use the claim at once, or
            None (= 1).
        limits: the caps these parameters set (:class:`ClaimLimits`).
    """

    memory_limit_bytes: int | None = None
    memory_limit_portion: Fraction | None = None
    compute_mode: str | None = None
    active_thread_percentage: int | None = None
    max_consumers: int | None = None
    limits: ClaimLimits = ClaimLimits()

    def merged(self, later: ClaimParameters) -> ClaimParameters:
        """Return these parameters overridden by every field ``later`` sets, and each cap
        lowered to ``later``'s where that is smaller (a later config never raises a cap).

        Setting one of the two memory-limit fields clears the other, so a claim's portion
        replaces a class's absolute limit (and vice versa).
        """
        out = self
        if later.memory_limit_bytes is not None or later.memory_limit_portion is not None:
            out = replace(out, memory_limit_bytes=None, memory_limit_portion=None)
        for f in fields(later):
            value = getattr(later, f.name)
            if f.name == "limits":
                out = replace(out, limits=out.limits.lowered(value))
            elif value is not None:
                out = replace(out, **{f.name: value})
        return out


def quantity_bytes(value: Any, where: str) -> int:
    """A positive whole number of bytes from a Kubernetes quantity (string or integer).

    Args:
        value: the decoded JSON value, e.g. ``"60Gi"``.
        where: the field, prefixed to messages.

    Raises:
        ParameterError: not a quantity, not above zero, above :data:`MAX_BYTES`, or a
            fraction of a byte.
    """
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ParameterError(
            f"{where}: {shown(value)} must be a Kubernetes quantity (e.g. 60Gi, 512Mi)"
        )
    try:
        q = Decimal(value) if isinstance(value, int) else quantity_decimal(value)
    except QuantityError as exc:
        raise ParameterError(
            f"{where}: {shown(value)} is not a Kubernetes quantity (e.g. 60Gi, 512Mi)"
        ) from exc
    if q <= 0:
        raise ParameterError(f"{where}: {shown(value)} must be greater than zero")
    if q > MAX_BYTES:  # compare before int(): int() of 1e1000000 takes minutes
        raise ParameterError(f"{where}: {shown(value)} is larger than any GPU's memory")
    if q != q.to_integral_value():
        raise ParameterError(f"{where}: {shown(value)} must be a whole number of bytes")
    return int(q)


def _portion(value: Any, where: str) -> Fraction:
    plain = isinstance(value, str) and _DECIMAL.fullmatch(value) is not None
    if isinstance(value, bool) or not (plain or isinstance(value, int | float)):
        raise ParameterError(f'{where}: {shown(value)} must be a number in (0, 1], e.g. "0.8"')
    try:
        portion = Fraction(Decimal(str(value)))
    except (ValueError, OverflowError) as exc:  # NaN, infinity
        raise ParameterError(f"{where}: {shown(value)} is outside (0, 1]") from exc
    if not 0 < portion <= 1:
        raise ParameterError(f"{where}: {shown(value)} is outside (0, 1]")
    return portion


def parse_parameters(raw: Any, where: str = "parameters") -> ClaimParameters:
    """Validate one opaque ``parameters`` object.

    Args:
        raw: the decoded JSON object from ``opaque.parameters``.
        where: a prefix for error messages, e.g. ``claim config #0``.

    Raises:
        ParameterError: not an object, wrong apiVersion/kind, unknown field, malformed
            quantity, portion outside (0, 1], both limit forms at once, unknown compute
            mode, percentage outside 1..100, a percentage with time-slicing, or
            ``maxConsumers`` outside 1..:data:`MAX_CONSUMERS`.
    """
    if not isinstance(raw, dict):
        raise ParameterError(f"{where}: expected an object, got {json_kind(raw)}")
    if raw.get("apiVersion") != PARAMS_API_VERSION or raw.get("kind") != PARAMS_KIND:
        raise ParameterError(
            f"{where}: apiVersion/kind must be {PARAMS_API_VERSION}/{PARAMS_KIND}, "
            f"got {shown(raw.get('apiVersion'))}/{shown(raw.get('kind'))}"
        )
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise ParameterError(
            f"{where}: unknown field(s) {shorten(', '.join(unknown))}; "
            f"known: {', '.join(sorted(_FIELDS))}"
        )
    if "memoryLimit" in raw and "memoryLimitPortion" in raw:
        raise ParameterError(f"{where}: set memoryLimit or memoryLimitPortion, not both")
    mode = raw.get("computeMode")
    if mode is not None and mode not in COMPUTE_MODES:
        raise ParameterError(
            f"{where}.computeMode: {shown(mode)} must be one of {', '.join(COMPUTE_MODES)}"
        )
    pct = raw.get("activeThreadPercentage")
    if pct is not None:
        if isinstance(pct, bool) or not isinstance(pct, int) or not 1 <= pct <= 100:
            raise ParameterError(f"{where}.activeThreadPercentage: {shown(pct)} must be 1..100")
        if mode == ComputeMode.TIME_SLICING:
            raise ParameterError(
                f"{where}.activeThreadPercentage is only valid with computeMode sm-sharing"
            )
    consumers = raw.get("maxConsumers")
    if consumers is not None and (
        isinstance(consumers, bool)
        or not isinstance(consumers, int)
        or not 1 <= consumers <= MAX_CONSUMERS
    ):
        raise ParameterError(
            f"{where}.maxConsumers: {shown(consumers)} must be 1..{MAX_CONSUMERS} (containers "
            "that may use the claim at once; its memory is divided among them)"
        )
    return ClaimParameters(
        memory_limit_bytes=(
            quantity_bytes(raw["memoryLimit"], f"{where}.memoryLimit")
            if "memoryLimit" in raw
            else None
        ),
        memory_limit_portion=(
            _portion(raw["memoryLimitPortion"], f"{where}.memoryLimitPortion")
            if "memoryLimitPortion" in raw
            else None
        ),
        compute_mode=mode,
        active_thread_percentage=pct,
        max_consumers=consumers,
        limits=parse_limits(raw, where),
    )
