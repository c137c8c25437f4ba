"""The node's own ResourceSlices as the last watch event left them: an informer-style cache, so
that a publishing round that changes nothing costs no API request.

:class:`SliceCache` holds the slices (API JSON) of one node and driver, filled by a LIST and kept
current by the WATCH that follows it (:mod:`dra_driver.publish.slicewatch`). The publisher
reads it instead of listing (:meth:`SliceCache.snapshot`) and tells it what it wrote
(:meth:`SliceCache.wrote`, :meth:`SliceCache.deleted`): until the watch has delivered the events
of those writes the snapshot is withheld and the publisher lists, so a round never decides on a
cache older than its own last write. :meth:`SliceCache.apply` says whether an event was someone
else's change (a kubelet restart wiping the node's slices, an admin's edit, the garbage
collector deleting slices whose Node went away): the publisher's next round starts at once.

Thread-safe: the watch thread applies events while the publisher's thread reads and writes.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

PENDING_S = 30.0
"""Seconds a write of the publisher may wait for its watch event before the cache stops
waiting for it (the watch delivers events in order: one not seen by then was superseded, e.g.
a newer change applied before the write's answer came)."""
HISTORY = 8
"""Resource versions remembered per slice from the watch (to recognise a write whose event
came before its answer and was then superseded)."""


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


class SliceCache:
    """The slices of one node and driver by name, with the resource version to watch from."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._items: dict[str, Mapping[str, Any]] = {}
        self._synced = False
        self._version = ""
        self._written: dict[str, tuple[str, float]] = {}
        self._deleted: dict[str, float] = {}
        self._seen: dict[str, deque[str]] = {}

    @property
    def resource_version(self) -> str:
        """Where a watch resumes ("" before the first LIST)."""
        with self._lock:
            return self._version

    def replace(self, items: Sequence[Mapping[str, Any]], resource_version: str) -> str:
        """Fill from a LIST (its ``items`` and ``metadata.resourceVersion``); pending writes are
        forgotten (the list shows them, or their absence). Returns how the list differs from
        what the cache held when it was filled before (a watch that broke may have missed
        events): ``DELETED`` (a slice is gone), ``MODIFIED`` (another change) or ``""``."""
        fresh = {_name(o): copy.deepcopy(o) for o in items}
        with self._lock:
            before = {n: _version(o) for n, o in self._items.items()} if self._synced else None
            self._items = fresh
            self._version = resource_version
            self._written.clear()
            self._deleted.clear()
            self._seen = {n: deque([_version(o)], maxlen=HISTORY) for n, o in fresh.items()}
            self._synced = True
        now = {n: _version(o) for n, o in fresh.items()}
        if before is None or before == now:
            return ""
        return "DELETED" if set(before) - set(now) else "MODIFIED"

    def invalidate(self) -> None:
        """The watch ended without a resource version to resume from (410 Gone, an error):
        withhold the snapshot until the next :meth:`replace`."""
        with self._lock:
            self._synced = False
            self._version = ""

    def snapshot(self) -> list[Mapping[str, Any]] | None:
        """The cached slices (copies), or None when the publisher must list: not filled yet,
        the watch broken, or a write of this publisher not yet seen in the watch (for at most
        :data:`PENDING_S` seconds)."""
        with self._lock:
            late = self._clock() - PENDING_S
            self._written = {n: w for n, w in self._written.items() if w[1] > late}
            self._deleted = {n: at for n, at in self._deleted.items() if at > late}
            if not self._synced or self._written or self._deleted:
                return None
            return [copy.deepcopy(o) for _, o in sorted(self._items.items())]

    def wrote(self, stored: Mapping[str, Any]) -> None:
        """The publisher created or replaced a slice; ``stored`` is the API server's answer.
        Its event may have come first (the watch can beat the answer): then nothing waits."""
        name, version = _name(stored), _version(stored)
        with self._lock:
            if version not in self._seen.get(name, ()):
                self._written[name] = (version, self._clock())

    def deleted(self, name: str) -> None:
        """The publisher deleted the slice ``name`` (unless its event came first)."""
        with self._lock:
            if name in self._items:
                self._deleted[name] = self._clock()

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        """Apply one watch event (``ADDED``, ``MODIFIED``, ``DELETED``, ``BOOKMARK``) and move
        the resource version on; returns whether it was someone else's change (not the event
        of a write this publisher made)."""
        name, version = _name(obj), _version(obj)
        with self._lock:
            if version:
                self._version = version
            if event_type == "BOOKMARK":
                return False
            if event_type == "DELETED":
                self._items.pop(name, None)
                self._written.pop(name, None)
                self._seen.pop(name, None)
                return self._deleted.pop(name, None) is None
            self._items[name] = copy.deepcopy(obj)
            self._seen.setdefault(name, deque(maxlen=HISTORY)).append(version)
            if self._written.get(name, ("", 0.0))[0] == version:
                del self._written[name]
                return False
            return True
