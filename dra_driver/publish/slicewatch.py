"""LIST then WATCH the node's own ResourceSlices into a :class:`SliceCache`, the way client-go's
reflector does: one LIST, then watches that resume from the last resource version seen.

Each watch asks for bookmarks (``allowWatchBookmarks``: the API server sends the current
resource version about once a minute, so a resumed watch is not refused as too old) and ends
after a random 5 to 10 minutes (``timeoutSeconds``; client-go's reflector picks from the same
range, so a fleet's watches do not reconnect in step). An idle node costs one watch request per
5 to 10 minutes. A watch refused with 410 Gone (its resource version compacted away) or
broken by an error lists again, and what the list shows that the cache lacked is reported as
a change; errors, a connection silent for :data:`READ_TIMEOUT_S` seconds and a watch closed
at once wait :data:`RETRY_S` seconds first.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes.client import V1ResourceSlice
from kubernetes.watch.watch import iter_resp_lines

from dra_driver.model.errors import DriverError
from dra_driver.publish.slicecache import SliceCache

log = structlog.get_logger(__name__)

WATCH_S = (300, 600)
"""Bounds of one watch's ``timeoutSeconds`` (client-go's reflector: 5 minutes, up to twice)."""
READ_TIMEOUT_S = 150
"""Seconds without a byte before a watch's connection counts as dead: the API server sends a
bookmark about once a minute (``defaultBookmarkFrequency``, k8s.io/apiserver
pkg/storage/cacher), so a connection silent for 2.5 minutes is gone (a dropped connection
leaves no error to read)."""
SHORT_S = 1.0
"""A watch that ends sooner without an event counts as failed (client-go's reflector does
the same): something between here and the API server closes it, and reopening at once would
spin."""
RETRY_S = 5.0
"""Seconds before a failed list or watch is tried again."""


GONE = 410
"""The code of the ERROR event that ends a watch whose resource version is too old."""


class WatchEnded(DriverError, RuntimeError):
    """The API server ended the watch with an ERROR event (``code``: 410 Gone, or another)."""

    def __init__(self, code: object, message: object) -> None:
        super().__init__(f"watch ended by the API server: {code} {message}")
        self.code = code


class SliceWatch:
    """Keeps ``cache`` equal to the API server's slices matching ``field_selector``.

    Args:
        list_slices: ``ResourceV1Api.list_resource_slice`` (keyword arguments as the official
            client takes them).
        field_selector: ``spec.nodeName=<node>,spec.driver=<driver>``.
        cache: the cache to fill.
        on_change: called with the event type (``ADDED``, ``MODIFIED``, ``DELETED``) of each
            change that was not the event of the publisher's own write.
        to_json: turns a client model (``V1ResourceSlice``, ``V1ResourceSliceList``) into API
            JSON; objects are cached in that form (the one the publisher compares), so a field
            the client does not know is dropped here as from a LIST.
    """

    def __init__(
        self,
        list_slices: Callable[..., Any],
        field_selector: str,
        cache: SliceCache,
        on_change: Callable[[str], None],
        to_json: Callable[[Any], dict[str, Any]],
    ) -> None:
        self._list = list_slices
        self._selector = field_selector
        self.cache = cache
        self._on_change = on_change
        self._to_json = to_json

    def run(self, stop: threading.Event) -> None:
        """List, then watch until ``stop`` is set (thread target); errors are logged and
        retried after :data:`RETRY_S` seconds."""
        while not stop.is_set():
            try:
                if not self.cache.resource_version:
                    self.relist()
                started = time.monotonic()
                if self.follow(stop) == 0 and time.monotonic() - started < SHORT_S:
                    raise WatchEnded(None, f"watch closed within {SHORT_S:g} s with no event")
            except Exception as exc:  # API server away, 410 Gone: list again
                self.cache.invalidate()
                if not (isinstance(exc, WatchEnded) and exc.code == GONE):
                    log.warning("resource slice watch failed; listing again", error=str(exc))
                    stop.wait(RETRY_S)

    def relist(self) -> None:
        """LIST the slices into the cache (one request); a difference from what the cache
        held (events the broken watch missed) is reported to ``on_change``."""
        doc = self._to_json(self._list(field_selector=self._selector))
        missed = self.cache.replace(doc.get("items") or [], doc["metadata"]["resourceVersion"])
        if missed:
            self._on_change(missed)

    def follow(self, stop: threading.Event) -> int:
        """One WATCH from the cache's resource version, its events applied, until the server
        ends it (``timeoutSeconds``) or ``stop`` is set; returns the events seen (bookmarks
        included).

        Raises:
            WatchEnded: an ERROR event (410: the resource version is too old, relist).
        """
        timeout = random.randint(*WATCH_S)
        resp = self._list(
            field_selector=self._selector,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=self.cache.resource_version,
            timeout_seconds=timeout,
            _preload_content=False,
            _request_timeout=(10, READ_TIMEOUT_S),
        )
        events = 0
        try:
            for line in iter_resp_lines(resp):
                if stop.is_set():
                    return events
                if not line:
                    continue
                events += 1
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise WatchEnded(obj.get("code"), obj.get("message"))
                if kind != "BOOKMARK":  # a bookmark carries only the resource version
                    obj = self._to_json(V1ResourceSlice.from_dict(obj))
                if self.cache.apply(kind, obj):
                    self._on_change(kind)
        finally:
            resp.release_conn()
        return events
