"""One lock for Prepare/Unprepare shared by threads and by plugin instances.

During a rolling update two plugin processes serve the same node; the kubelet may send
Prepare to one and Unprepare to the other (k8s.io/dynamic-resource-allocation
``kubeletplugin``, ``DRAPlugin.UnprepareResourceClaims`` and ``RollingUpdate``), so the
instances serialize through a file lock. :class:`PrepareLock` holds a ``threading.Lock`` and
an exclusive ``flock`` on a file in the plugin directory. A caller with a time budget waits
at most ``timeout`` seconds (``flock`` has no timeout, so the file lock is polled).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dra_driver.infra.atomicfile import ensure_dir
from dra_driver.model.errors import ClaimError

POLL_INTERVAL_S = 0.01
"""Seconds between two tries of the file lock while waiting with a timeout."""


class LockTimeout(ClaimError, TimeoutError):
    """The lock was not obtained within the caller's timeout (another call or instance holds
    it)."""


class PrepareLock:
    """Exclusive lock over ``path`` (created if missing) for threads and processes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._thread_lock = threading.Lock()

    @contextmanager
    def held(self, timeout: float | None = None) -> Iterator[None]:
        """Hold both the thread lock and the file lock for the ``with`` block.

        Args:
            timeout: seconds to wait for both together; None waits as long as it takes.

        Raises:
            LockTimeout: not obtained within ``timeout``.
        """
        ends = None if timeout is None else time.monotonic() + timeout
        if not self._thread_lock.acquire(timeout=-1 if ends is None else _left(ends)):
            raise LockTimeout(f"prepare lock {self.path} not obtained within {timeout:.3g} s")
        try:
            ensure_dir(self.path.parent, 0o700)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                _flock(fd, ends, self.path, timeout)
                yield
            finally:
                os.close(fd)
        finally:
            self._thread_lock.release()


def _left(ends: float) -> float:
    return max(0.0, ends - time.monotonic())


def _flock(fd: int, ends: float | None, path: Path, timeout: float | None) -> None:
    """Take an exclusive ``flock`` on ``fd``, polling until ``ends`` (monotonic) if given."""
    if ends is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if _left(ends) <= 0:
                raise LockTimeout(
                    f"prepare lock {path} (held by another plugin instance) not obtained "
                    f"within {timeout:.3g} s"
                ) from None
            time.sleep(min(POLL_INTERVAL_S, _left(ends)))
