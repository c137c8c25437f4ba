"""One lock for Prepare/Unprepare shared by threads and by plugin instances.

During a rolling update two plugin processes serve the same node; the kubelet may send
Prepare to one and Unprepare to the other (k8s.io/dynamic-resource-allocation
``kubeletplugin``, ``DRAPlugin.UnprepareResourceClaims`` and ``RollingUpdate``), so the
instances serialize through a file lock. :class:`PrepareLock` holds a ``threading.Lock`` and
an exclusive ``flock`` on a file in the plugin directory.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dra_driver.atomicfile import ensure_dir


class PrepareLock:
    """Exclusive lock over ``path`` (created if missing) for threads and processes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._thread_lock = threading.Lock()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Block until both the thread lock and the file lock are held."""
        with self._thread_lock:
            ensure_dir(self.path.parent, 0o700)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)
