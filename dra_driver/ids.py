"""Validation of identifiers that end up in file names and MPS object names."""

from __future__ import annotations

import re

_UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class PrepareError(ValueError):
    """One claim cannot be prepared; the message tells the user what to change."""


def validate_uid(uid: str) -> str:
    """Return ``uid`` if it is a lower-case RFC 4122 UUID (the Kubernetes UID form).

    UIDs go into file names and MPS names, so anything else is refused.

    Raises:
        PrepareError: when the UID is malformed.
    """
    if not _UID.fullmatch(uid):
        raise PrepareError(f"claim UID {uid!r} is not a Kubernetes UID")
    return uid
