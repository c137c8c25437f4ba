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
from collections.abc import Mapping, Sequence
from typing import Any


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


class SliceCache:
    """The slices of one node and driver by name, with the resource version to watch from."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, Mapping[str, Any]] = {}
        self._synced = False
        self._version = ""
        self._written: dict[str, str] = {}
        self._deleted: set[str] = set()

    @property
    def resource_version(self) -> str:
        """Where a watch resumes ("" before the first LIST)."""
        with self._lock:
            return self._version

    def replace(self, items: Sequence[Mapping[str, Any]], resource_version: str) -> None:
        """Fill from a LIST (its ``items`` and ``metadata.resourceVersion``); pending writes are
        forgotten (the list shows them, or their absence)."""
        with self._lock:
            self._items = {_name(o): copy.deepcopy(o) for o in items}
            self._version = resource_version
            self._written.clear()
            self._deleted.clear()
            self._synced = True

    def invalidate(self) -> None:
        """The watch ended without a resource version to resume from (410 Gone, an error):
        withhold the snapshot until the next :meth:`replace`."""
        with self._lock:
            self._synced = False
            self._version = ""

    def snapshot(self) -> list[Mapping[str, Any]] | None:
        """The cached slices (copies), or None when the publisher must list: not filled yet,
        the watch broken, or a write of this publisher not yet seen in the watch."""
        with self._lock:
            if not self._synced or self._written or self._deleted:
                return None
            return [copy.deepcopy(o) for _, o in sorted(self._items.items())]

    def wrote(self, stored: Mapping[str, Any]) -> None:
        """The publisher created or replaced a slice; ``stored`` is the API server's answer.
        Its event may have come first (the watch can beat the answer): then nothing waits."""
        name, version = _name(stored), _version(stored)
        with self._lock:
            if _version(self._items.get(name) or {}) != version:
                self._written[name] = version

    def deleted(self, name: str) -> None:
        """The publisher deleted the slice ``name`` (unless its event came first)."""
        with self._lock:
            if name in self._items:
                self._deleted.add(name)

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
                if name in self._deleted:
                    self._deleted.discard(name)
                    return False
                return True
            self._items[name] = copy.deepcopy(obj)
            if self._written.get(name) == version:
                del self._written[name]
                return False
            return True
