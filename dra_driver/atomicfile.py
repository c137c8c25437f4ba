"""Crash-safe file replacement: write a temp file, fsync it, rename over the target."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: str | Path, data: bytes, mode: int = 0o644, sync_dir: bool = False) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never half.

    The temp file lives beside the target (same filesystem, hidden name ending ``.tmp``).
    With ``sync_dir`` the directory is fsynced too, so the rename survives a power loss.

    Raises:
        OSError: when the directory is not writable or the disk is full (the target is
            left untouched and the temp file removed).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        dfd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
