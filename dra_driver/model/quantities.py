"""Kubernetes quantities (``1Gi``, ``256Mi``, ``500m``, ``1e3``): the one parser and writer.

Parsing is the official client's :func:`kubernetes.utils.parse_quantity`, after a check against
the grammar of k8s.io/apimachinery ``pkg/api/resource`` (no blanks, suffixes ``Ki``..``Ei``,
``n``..``E``, or an exponent); this module adds exact fractions and the canonical string form
the API server writes back.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from kubernetes.utils import parse_quantity

from dra_driver.model.errors import DriverError

_SYNTAX = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?"
)
"""The quantity grammar of k8s.io/apimachinery ``pkg/api/resource`` (``ParseQuantity``). The
client's parser alone is laxer (it accepts ``"1 Gi"`` and ``"1Gi "``, which the API server
refuses), so text must match this first."""
_BINARY_NAMES = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
_DECIMAL_NAMES = {0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
_MAX_EXPONENT = 64
"""Largest decimal exponent :func:`quantity_value` turns into an exact fraction; it keeps
``1e1000000`` from becoming a million-digit number."""
_HINT = "is not a Kubernetes quantity (e.g. 1Gi, 256Mi, 1073741824)"


class QuantityError(DriverError, ValueError):
    """Text that is not a Kubernetes quantity; callers prefix the field it came from."""


def quantity_decimal(text: str) -> Decimal:
    """A Kubernetes quantity string as a :class:`~decimal.Decimal` (``"1Gi"`` -> 1073741824).

    Cheap for any input: a huge exponent (``1e1000000``) stays a small Decimal, so callers
    compare it with their bound before converting.

    Raises:
        QuantityError: when ``text`` is not a quantity (e.g. ``"1Gi "``, ``"1GB"``, ``"-"``).
    """
    if not isinstance(text, str) or not _SYNTAX.fullmatch(text):
        raise QuantityError(f"{text!r} {_HINT}")
    try:
        value = parse_quantity(text)
    except (ValueError, TypeError, InvalidOperation) as exc:
        raise QuantityError(f"{text!r} {_HINT}") from exc
    if not value.is_finite():
        raise QuantityError(f"{text!r} {_HINT}")
    return Decimal(value)


def quantity_value(text: str) -> Fraction:
    """Exact value of a Kubernetes quantity string (``"1Gi"`` -> 1073741824, ``"500m"`` -> 1/2).

    Raises:
        QuantityError: when ``text`` is not a quantity (:func:`quantity_decimal`) or its
            exponent is beyond 10^64 either way (no real GPU quantity comes near).
    """
    value = quantity_decimal(text)
    exponent = value.as_tuple().exponent
    if not isinstance(exponent, int) or abs(exponent) > _MAX_EXPONENT:
        raise QuantityError(f"{text!r} is out of range (at most 10^{_MAX_EXPONENT})")
    return Fraction(value)


def canonical_quantity(value: int, binary: bool = True) -> str:
    """Write a non-negative integer as the API server's canonical quantity string.

    ``binary=True`` gives the BinarySI form for multiples of 1024 (``150754820096`` ->
    ``"143771Mi"``); other values, and all values with ``binary=False``, get the DecimalSI form
    (``8`` -> ``"8"``, ``1500`` -> ``"1500"``, ``15000`` -> ``"15k"``). Either way the server
    parses the string and writes it back unchanged. Rule source: ``Quantity.CanonicalizeBytes``
    in k8s.io/apimachinery ``pkg/api/resource``.

    Raises:
        ValueError: for a negative value.
    """
    if value < 0:
        raise ValueError(f"quantity {value} must not be negative")
    if value == 0:
        return "0"
    if binary and value % 1024 == 0:
        exponent = 0
        while value % 1024 == 0 and exponent < len(_BINARY_NAMES) - 1:
            value //= 1024
            exponent += 1
        return f"{value}{_BINARY_NAMES[exponent]}"
    zeros = 0
    while value % 10 == 0:
        value //= 10
        zeros += 1
    exponent = min(zeros - zeros % 3, 18)
    return f"{value * 10 ** (zeros - exponent)}{_DECIMAL_NAMES[exponent]}"
