"""Typed reading of untrusted API JSON, with errors that name the field path.

The kubelet names a claim; its body comes from the API server (or anything that answers in
its place) and is read field by field through :class:`Field`. Each accessor checks one JSON
type and, when the value has another, raises :class:`~dra_driver.model.ids.PrepareError` naming
the path and both types, e.g. ``status.allocation.devices.results[0].consumedCapacity:
expected an object, got a list``. Kubernetes omits empty optional fields and may write
``null`` for them; both read as absent where a field is optional.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from dra_driver.model.errors import PrepareError


class _Missing:
    """The value of a field that is not in its object."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING: Final = _Missing()


def json_kind(value: Any) -> str:
    """The JSON type of a decoded value, with its article: ``null``, ``a boolean``, ``a
    number``, ``a string``, ``a list``, ``an object`` (``nothing`` for a missing field)."""
    if value is MISSING:
        return "nothing"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


@dataclass(frozen=True)
class Field:
    """One value of a JSON document and where it is.

    Attributes:
        value: the decoded value, or :data:`MISSING`.
        path: dotted path from the document root (``""`` for the root), e.g.
            ``status.allocation.devices.results[0].shareID``.
        owner: what the document is, prefixed to every message (e.g. ``claim ns/name``).
        root: how the root is named in messages (e.g. ``ResourceClaim``).
    """

    value: Any
    path: str = ""
    owner: str = ""
    root: str = "document"

    @property
    def label(self) -> str:
        """The path, or the root's name for the root."""
        return self.path or self.root

    @property
    def absent(self) -> bool:
        """Whether the field is missing or ``null``."""
        return self.value is MISSING or self.value is None

    @property
    def raw(self) -> Any:
        """The value, ``None`` when missing."""
        return None if self.value is MISSING else self.value

    def error(self, problem: str) -> PrepareError:
        """A :class:`PrepareError` ``<owner>: <path>: <problem>``."""
        prefix = f"{self.owner}: " if self.owner else ""
        return PrepareError(f"{prefix}{self.label}: {problem}")

    def _expected(self, what: str) -> PrepareError:
        if self.value is MISSING:
            return self.error(f"missing; expected {what}")
        return self.error(f"expected {what}, got {json_kind(self.value)}")

    def _child(self, value: Any, key: str | int) -> Field:
        if isinstance(key, int):
            path = f"{self.path}[{key}]"
        else:
            path = f"{self.path}.{key}" if self.path else key
        return Field(value, path, self.owner, self.root)

    def __getitem__(self, key: str) -> Field:
        """The member ``key`` of this object (missing when this field is absent).

        Raises:
            PrepareError: this field is present but not an object.
        """
        if self.absent:
            return self._child(MISSING, key)
        return self._child(self.object().get(key, MISSING), key)

    def object(self) -> Mapping[str, Any]:
        """The value as an object.

        Raises:
            PrepareError: it is anything else (or missing).
        """
        if not isinstance(self.value, Mapping):
            raise self._expected("an object")
        return self.value

    def items(self) -> list[Field]:
        """The elements of an optional list (none when absent).

        Raises:
            PrepareError: it is present but not a list.
        """
        if self.absent:
            return []
        if not isinstance(self.value, list):
            raise self._expected("a list")
        return [self._child(v, i) for i, v in enumerate(self.value)]

    def string(self) -> str:
        """The value of a required string.

        Raises:
            PrepareError: it is missing or not a string.
        """
        if not isinstance(self.value, str):
            raise self._expected("a string")
        return self.value

    def boolean(self) -> bool:
        """The value of a required boolean.

        Raises:
            PrepareError: it is missing or not ``true``/``false``.
        """
        if not isinstance(self.value, bool):
            raise self._expected("a boolean")
        return self.value

    def optional_string(self) -> str | None:
        """The value of an optional string, ``None`` when absent.

        Raises:
            PrepareError: it is present but not a string.
        """
        return None if self.absent else self.string()
