"""Crash-safe file replacement (write a temp file, optionally fsync it, rename over the target)
and directory creation with modes that do not depend on the process umask."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)


def ensure_dir(path: str | Path, mode: int) -> Path:
    """Create ``path`` and its missing parents with exactly ``mode`` (e.g. ``0o700``),
    whatever the umask; existing directories keep their mode (they may be shared, e.g. the
    kubelet's). Returns ``path``.

    Raises:
        OSError: when a directory cannot be created (e.g. a file is in the way).
    """
    target = Path(path)
    missing = []
    for p in (target, *target.parents):
        if p.is_dir():
            break
        missing.append(p)
    for p in reversed(missing):
        try:
            os.mkdir(p, mode)
        except FileExistsError:
            continue  # made meanwhile by another process: its mode is its maker's choice
        os.chmod(p, mode)  # mkdir's mode is masked by the umask
    return target


def private_dir(path: str | Path, mode: int = 0o700) -> Path:
    """:func:`ensure_dir`, and an existing directory set to exactly ``mode`` too (a hostPath
    the kubelet made with 0755 before the plugin started, a directory of an older version).
    Returns ``path``.

    Raises:
        OSError: when the directory cannot be created or its mode set.
    """
    target = ensure_dir(path, mode)
    if target.stat().st_mode & 0o7777 != mode:
        os.chmod(target, mode)
    return target


def owner_only(path: str | Path) -> bool:
    """Make ``path`` (a file or a unix socket) readable, writable and connectable by its owner
    only (0600); returns False when it does not exist.

    Raises:
        OSError: when it exists and its mode cannot be set.
    """
    try:
        os.chmod(path, 0o600)
    except FileNotFoundError:
        return False
    return True


def write_atomic(
    path: str | Path,
    data: bytes,
    mode: int = 0o644,
    durable: bool = True,
    dir_mode: int = 0o755,
) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never half.

    The temp file lives beside the target (same filesystem, hidden name ending ``.tmp``);
    ``rename`` makes the switch atomic for every other process, even if this one is killed.
    With ``durable`` the data is fsynced before the rename, so a power loss cannot leave an
    empty file under the target name. Files that do not outlive a reboot anyway (CDI specs
    on the ``/var/run`` tmpfs) skip it. The file gets exactly ``mode`` and a missing directory
    exactly ``dir_mode`` (:func:`ensure_dir`), whatever the umask.

    Raises:
        OSError: when the directory is not writable or the disk is full (the target is
            left untouched and the temp file removed).
    """
    target = Path(path)
    ensure_dir(target.parent, dir_mode)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_temp_files(*dirs: Path) -> None:
    """Remove temp files a killed write left behind (``.<name>.<pid>.tmp``)."""
    for d in dirs:
        if d.is_dir():
            for tmp in d.glob(".*.tmp"):
                tmp.unlink(missing_ok=True)
                log.info("removed temp file left by a killed write", path=str(tmp))


def record_state(path: Path, fields: Mapping[str, Any], what: str) -> None:
    """Write ``fields`` plus ``since`` (now, RFC 3339 UTC) as JSON to ``path``, atomically and
    owner-only (a state file that ``dra-driver status`` shows); a write that fails is logged
    as "<what> not recorded", never raised (the caller goes on)."""
    doc = {**fields, "since": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    try:
        write_atomic(path, json.dumps(doc).encode(), 0o600)
    except OSError as exc:
        log.warning(f"{what} not recorded", error=str(exc))
