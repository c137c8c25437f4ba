"""Crash-safe file replacement: write a temp file, optionally fsync it, rename over the target."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: str | Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never half.

    The temp file lives beside the target (same filesystem, hidden name ending ``.tmp``);
    ``rename`` makes the switch atomic for every other process, even if this one is killed.
    With ``durable`` the data is fsynced before the rename, so a power loss cannot leave an
    empty file under the target name. Files that do not outlive a reboot anyway (CDI specs
    on the ``/var/run`` tmpfs) skip it.

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
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
