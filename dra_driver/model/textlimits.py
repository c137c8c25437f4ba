"""Bounds on text built from untrusted input (error messages, log values, gRPC replies).

A claim or a kubelet request may carry values of megabytes; echoing them whole would make
a Prepare reply exceed gRPC's default 4 MiB message limit and flood the logs. Every echo of
input goes through :func:`shown`, every long log value through :func:`shorten`.
"""

from __future__ import annotations

from typing import Any

MAX_VALUE_CHARS = 200
"""Characters of one echoed input value kept in a message."""
ELLIPSIS = "..."


def shorten(text: str, limit: int = MAX_VALUE_CHARS, length: int | None = None) -> str:
    """``text`` cut to ``limit`` characters plus ``... (<length> characters)`` when longer.

    Args:
        text: the text to bound.
        limit: characters kept (>= 0).
        length: the original length to report; default ``len(text)``.
    """
    if len(text) <= limit:
        return text
    return f"{text[:limit]}{ELLIPSIS} ({len(text) if length is None else length} characters)"


def shown(value: Any, limit: int = MAX_VALUE_CHARS) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters.

    The reported length is the value's own length for a string (what the user wrote), else
    the length of its ``repr``. Control characters and lone surrogates come out escaped.
    """
    text = repr(value)
    return shorten(text, limit, len(value) if isinstance(value, str) else None)


def utf8_bounded(text: str, max_bytes: int) -> str:
    """``text`` as valid UTF-8 (lone surrogates escaped) of at most ``max_bytes`` bytes.

    A cut text ends with ``... (<n> characters)``; a budget too small even for that marker
    gives the plain cut. protobuf ``string`` fields must be valid UTF-8, so reply text goes
    through this.
    """
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    marker = f"{ELLIPSIS} ({len(text)} characters)".encode()
    if len(marker) > max_bytes:
        return data[:max_bytes].decode("utf-8", "ignore")
    return data[: max_bytes - len(marker)].decode("utf-8", "ignore") + marker.decode()
