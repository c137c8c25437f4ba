"""The slice cache and its watch: a round that changes nothing costs no API request, the
publisher's own writes are not taken for someone else's, a broken watch lists again."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

from kubernetes import client as k8s

from dra_driver.publish.publisher import SlicePublisher
from dra_driver.publish.slicecache import PENDING_S, SliceCache
from dra_driver.publish.slicewatch import SliceWatch
from tests.unit.publish.test_publisher import DRIVER, NODE, FakeResourceV1Api, desired

SERIALIZER = k8s.ApiClient()


def obj(name: str, version: str, node: str = NODE) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "resourceVersion": version},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        },
    }


def test_snapshot_is_withheld_until_filled_and_until_own_writes_are_seen() -> None:
    cache = SliceCache()
    assert cache.snapshot() is None  # never listed
    cache.replace([obj("a", "5")], "7")
    assert [s["metadata"]["name"] for s in cache.snapshot() or []] == ["a"]
    assert cache.resource_version == "7"
    cache.wrote(obj("a", "8"))
    assert cache.snapshot() is None  # the watch has not shown our write yet
    assert cache.apply("MODIFIED", obj("a", "6")) is True  # an older, foreign change
    assert cache.snapshot() is None
    assert cache.apply("MODIFIED", obj("a", "8")) is False  # our own write's event
    assert (cache.snapshot() or [])[0]["metadata"]["resourceVersion"] == "8"
    cache.deleted("a")
    assert cache.snapshot() is None
    assert cache.apply("DELETED", obj("a", "9")) is False
    assert cache.snapshot() == []


def test_an_event_that_beats_the_write_answer_leaves_nothing_waiting() -> None:
    """The watch may deliver the event of a create before the create's answer reaches the
    publisher (seen on a real API server: every later round listed, waiting for an event that
    had come already)."""
    cache = SliceCache()
    cache.replace([obj("a", "5")], "5")
    assert cache.apply("ADDED", obj("b", "6")) is True  # not yet known to be ours
    cache.wrote(obj("b", "6"))
    assert cache.apply("DELETED", obj("a", "7")) is True
    cache.deleted("a")
    assert [s["metadata"]["name"] for s in cache.snapshot() or []] == ["b"]


def test_foreign_deletion_and_bookmarks() -> None:
    cache = SliceCache()
    cache.replace([obj("a", "5"), obj("b", "5")], "5")
    assert cache.apply("BOOKMARK", {"metadata": {"resourceVersion": "12"}}) is False
    assert cache.resource_version == "12"
    assert cache.apply("DELETED", obj("b", "13")) is True  # a kubelet restart wiped it
    assert [s["metadata"]["name"] for s in cache.snapshot() or []] == ["a"]
    cache.invalidate()
    assert cache.snapshot() is None and cache.resource_version == ""


class Stream:
    """A watch response: lines of JSON events, as urllib3 streams them."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.released = False

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        for event in self.events:
            yield (json.dumps(event) + "\n").encode()

    def release_conn(self) -> None:
        self.released = True


class WatchApi:
    """``list_resource_slice`` answering LISTs from ``items`` and watches from ``streams``;
    records every call's keyword arguments."""

    def __init__(self, items: list[dict[str, Any]], streams: list[Stream]) -> None:
        self.items = items
        self.streams = streams
        self.calls: list[dict[str, Any]] = []

    def list_resource_slice(self, **kw: Any) -> Any:
        self.calls.append(kw)
        if kw.get("watch"):
            return self.streams.pop(0)
        return k8s.V1ResourceSliceList(
            items=[k8s.V1ResourceSlice.from_dict(o) for o in self.items],
            metadata=k8s.V1ListMeta(resource_version="10"),
        )


def test_watch_lists_once_then_resumes_from_the_last_version() -> None:
    stop = threading.Event()
    changes: list[str] = []
    cache = SliceCache()
    later = Stream([{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "30"}}}])

    first = Stream(
        [
            {"type": "MODIFIED", "object": {**obj("a", "11"), "unknownField": 1}},
            {"type": "DELETED", "object": obj("b", "12")},
        ]
    )
    api = WatchApi([obj("a", "5"), obj("b", "5")], [first, later])
    watch = SliceWatch(
        api.list_resource_slice,
        "spec.nodeName=n",
        cache,
        changes.append,
        SERIALIZER.sanitize_for_serialization,
    )

    def follow_then_stop(s: threading.Event) -> None:
        SliceWatch.follow(watch, s)
        if len(api.calls) == 3:
            stop.set()

    watch.follow = follow_then_stop  # type: ignore[method-assign]
    watch.run(stop)
    assert changes == ["MODIFIED", "DELETED"]
    assert [c.get("watch", False) for c in api.calls] == [False, True, True]
    assert api.calls[1]["resource_version"] == "10" and api.calls[1]["allow_watch_bookmarks"]
    assert 300 <= api.calls[1]["timeout_seconds"] <= 600
    assert api.calls[2]["resource_version"] == "12"  # resumed, not listed again
    assert cache.resource_version == "30"
    snapshot = cache.snapshot() or []
    assert [s["metadata"]["name"] for s in snapshot] == ["a"]
    assert "unknownField" not in snapshot[0]  # cached in the form a LIST gives
    assert first.released and later.released


def test_watch_gone_lists_again_at_once() -> None:
    stop = threading.Event()
    gone = Stream([{"type": "ERROR", "object": {"code": 410, "message": "too old"}}])
    api = WatchApi([obj("a", "5")], [gone, Stream([])])
    cache = SliceCache()
    watch = SliceWatch(
        api.list_resource_slice, "", cache, lambda _: None, SERIALIZER.sanitize_for_serialization
    )

    def follow(s: threading.Event) -> None:
        if len(api.calls) >= 3:
            stop.set()
        SliceWatch.follow(watch, s)

    watch.follow = follow  # type: ignore[method-assign]
    watch.run(stop)
    assert [c.get("watch", False) for c in api.calls] == [False, True, False, True]
    assert cache.snapshot() is not None


def test_a_round_with_a_current_cache_makes_no_request() -> None:
    api = FakeResourceV1Api()
    pub = SlicePublisher(api, DRIVER, NODE, sleep=lambda _: None)
    first = pub.publish(desired())
    assert first.created and api.calls["list"] == 1
    assert pub.cache.snapshot() is None  # the cache was never filled: it lists
    pub.cache.replace(list(api.store.list("")), "100")
    api.calls.clear()
    assert pub.publish(desired()).writes == 0
    assert sum(api.calls.values()) == 0
    gpu_gone = desired("simulated:H200x7")
    changed = pub.publish(gpu_gone)
    assert changed.updated and api.calls["list"] == 0  # decided on the cache
    api.calls.clear()
    assert pub.publish(gpu_gone).writes == 0
    assert api.calls["list"] == 1  # own writes not yet seen in the watch: listed
    for stored in api.store.list(""):
        pub.cache.apply("MODIFIED", stored)
    api.calls.clear()
    assert pub.publish(gpu_gone).writes == 0 and sum(api.calls.values()) == 0


def test_a_write_superseded_before_its_answer_leaves_nothing_waiting() -> None:
    """Found by review: the write's own event and a newer one (someone's edit) both came before
    the write's answer; the write then waited for its version forever and every round listed."""
    cache = SliceCache()
    cache.replace([obj("a", "5")], "5")
    cache.apply("MODIFIED", obj("a", "8"))  # the publisher's replace
    cache.apply("MODIFIED", obj("a", "9"))  # an admin's label, just after
    cache.wrote(obj("a", "8"))
    assert (cache.snapshot() or [])[0]["metadata"]["resourceVersion"] == "9"


def test_a_write_whose_event_never_comes_is_waited_for_a_while_only() -> None:
    now = [100.0]
    cache = SliceCache(clock=lambda: now[0])
    cache.replace([obj("a", "5")], "5")
    cache.apply("DELETED", obj("a", "6"))  # deleted by someone ...
    cache.apply("ADDED", obj("a", "7"))  # ... and made again, before our delete's answer
    cache.deleted("a")
    assert cache.snapshot() is None
    now[0] += PENDING_S + 1
    assert [s["metadata"]["name"] for s in cache.snapshot() or []] == ["a"]


def test_a_relist_reports_what_the_broken_watch_missed() -> None:
    changes: list[str] = []
    api = WatchApi([obj("a", "5"), obj("b", "5")], [])
    cache = SliceCache()
    watch = SliceWatch(
        api.list_resource_slice, "", cache, changes.append, SERIALIZER.sanitize_for_serialization
    )
    watch.relist()
    assert changes == []  # the first fill is no change
    api.items = [obj("a", "5")]  # b deleted while the watch was down
    watch.relist()
    api.items = [obj("a", "9")]
    watch.relist()
    assert changes == ["DELETED", "MODIFIED"]


def test_a_watch_closed_at_once_is_not_reopened_in_a_loop() -> None:
    """Found by review: a proxy that answers a watch with 200 and closes it at once had the
    watch reopened about 100,000 times in half a second."""
    stop = threading.Event()
    api = WatchApi([obj("a", "5")], [Stream([]) for _ in range(1000)])
    cache = SliceCache()
    watch = SliceWatch(
        api.list_resource_slice, "", cache, lambda _: None, SERIALIZER.sanitize_for_serialization
    )
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    watch.run(stop)
    timer.join()
    assert sum(1 for c in api.calls if c.get("watch")) <= 2
