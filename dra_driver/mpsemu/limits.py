"""Names, limits and namespace rows of the MPS emulator (pure).

Names are 1-64 characters of ``[a-z0-9_]``; memory values take ``G``, ``M`` or ``K`` (binary
units); thread percentages are 1-100 (NVIDIA MPS docs, "MPS v3 Interface").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from dra_driver.mpsemu.model import DEFAULT_NAMESPACE, Namespace, Server, mem_text

_NAME = re.compile(r"^[a-z0-9_]{1,64}$")
_MEM = re.compile(r"^([0-9]+)([GMK])$")
_UNIT = {"G": 1024**3, "M": 1024**2, "K": 1024}
LIMIT_KEYS = frozenset({"pinned-memory-limit", "active-thread-percentage", "client-priority"})
"""Options of ``namespace set`` / ``server set``; at least one is needed."""


def valid_name(name: str) -> bool:
    """Whether ``name`` is a valid server or namespace name."""
    return bool(_NAME.match(name))


def apply_limits(ns: Namespace, kv: Mapping[str, str]) -> str | None:
    """Apply ``--pinned-memory-limit``/``--active-thread-percentage`` from ``kv`` to ``ns``.

    Returns:
        None on success; else the error text, and ``ns`` is unchanged.
    """
    if not LIMIT_KEYS & kv.keys():
        return "set needs at least one option"
    pinned, threads = ns.pinned, ns.threads
    if "pinned-memory-limit" in kv:
        m = _MEM.match(kv["pinned-memory-limit"])
        if not m:
            return f"invalid memory value {kv['pinned-memory-limit']!r}"
        pinned = int(m.group(1)) * _UNIT[m.group(2)]
    if "active-thread-percentage" in kv:
        raw = kv["active-thread-percentage"]
        if not raw.isdigit() or not 1 <= int(raw) <= 100:
            return f"invalid active thread percentage {raw!r}"
        threads = int(raw)
    ns.pinned, ns.threads = pinned, threads
    return None


def threads_text(value: int | None) -> str:
    """An active thread percentage as ``list`` prints it (``-`` when not set)."""
    return "-" if value is None else str(value)


def namespace_rows(pipe: Path, server: Server, only: str | None) -> list[str]:
    """``namespace list`` rows of ``server`` (``default`` first, then the others in creation
    order), only the namespace ``only`` when given: ``name,server,status,pinned,threads,
    priority,pipe-directory``."""
    spaces = [Namespace(DEFAULT_NAMESPACE), *server.namespaces.values()]
    if DEFAULT_NAMESPACE in server.namespaces:
        spaces = sorted(server.namespaces.values(), key=lambda n: n.name != DEFAULT_NAMESPACE)
    return [
        f"{ns.name},{server.name},{server.status},{mem_text(ns.pinned)},"
        f"{threads_text(ns.threads)},{ns.priority},{pipe / server.name / ns.name}"
        for ns in spaces
        if only is None or ns.name == only
    ]
