"""Validation of identifiers that end up in file names, MPS names and API paths."""

from __future__ import annotations

import re

from dra_driver.model.errors import PrepareError
from dra_driver.model.textlimits import shown

_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""An RFC 1123 label (Kubernetes ``IsDNS1123Label``); use with ``fullmatch``."""
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_SUBDOMAIN_MAX = 253
DNS_LABEL_RULE = "1-63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit"


def is_dns_label(text: str) -> bool:
    """Whether ``text`` is an RFC 1123 label in full (no trailing newline, at most 63)."""
    return DNS_LABEL.fullmatch(text) is not None


def is_dns_subdomain(text: str, max_length: int = _DNS_SUBDOMAIN_MAX) -> bool:
    """Whether ``text`` is an RFC 1123 subdomain in full (Kubernetes ``IsDNS1123Subdomain``:
    at most 253 characters, or ``max_length``; no trailing newline)."""
    return len(text) <= max_length and _DNS_SUBDOMAIN.fullmatch(text) is not None


def is_uid(text: str) -> bool:
    """Whether ``text`` is a lower-case RFC 4122 UUID (the Kubernetes UID form)."""
    return _UID.fullmatch(text) is not None


def validate_uid(uid: str) -> str:
    """Return ``uid`` if it is a lower-case RFC 4122 UUID (the Kubernetes UID form).

    UIDs go into file names and MPS names, so anything else is refused.

    Raises:
        PrepareError: when the UID is malformed.
    """
    if not is_uid(uid):
        raise PrepareError(
            f"claim UID is not a Kubernetes UID (a lower-case RFC 4122 UUID): {shown(uid)}"
        )
    return uid


def validate_claim_name(namespace: str, name: str) -> None:
    """Check the namespace and name the kubelet sent before they go into an API path.

    Rules (Kubernetes API conventions): a namespace is an RFC 1123 label, a ResourceClaim
    name an RFC 1123 subdomain (at most 253 characters).

    Raises:
        PrepareError: either is malformed.
    """
    if not is_dns_label(namespace):
        raise PrepareError(
            f"claim namespace {shown(namespace)} is not a DNS label ({DNS_LABEL_RULE})"
        )
    if not is_dns_subdomain(name):
        raise PrepareError(
            f"claim name {shown(name)} is not a DNS subdomain (at most 253 characters of a-z, "
            "0-9, '-' and '.')"
        )
