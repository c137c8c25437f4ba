"""Warning events on the pods of a claim: the pods from ``status.reservedFor``, one core/v1
Event each (through the official client, against an HTTP stub of the API server), queued and
posted in the background, and every failure logged, never raised."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

from structlog.testing import capture_logs

from dra_driver.model.plans import ClaimRef
from dra_driver.observe.podevents import ApiEvents, PodEvents, PodRef, claim_pods, event_body
from tests.support.apiserver_stub import ClaimServer, StubError

UID = "0a000000-0000-4000-8000-00000000000a"
REF = ClaimRef(namespace="team-a", name="train", uid=UID)
NOW = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
EVENTS_PATH = "/api/v1/namespaces/team-a/events"


def claim(uid: str = UID, reserved: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team-a", "name": "train", "uid": uid},
        "status": {
            "reservedFor": reserved
            if reserved is not None
            else [
                {"resource": "pods", "name": "train-0", "uid": "pod-uid-0"},
                {"resource": "pods", "name": "train-1", "uid": "pod-uid-1"},
            ]
        },
    }


class EventServer(ClaimServer):
    """Claims (GET) and events (POST, recorded; ``refuse``: answer with that status)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []
        self.refuse: int | None = None
        self.delay = 0.0

    def handle(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if method == "POST" and path.startswith(EVENTS_PATH):
            time.sleep(self.delay)
            if self.refuse:
                raise StubError(self.refuse, "Forbidden")
            self.events.append(body)
            return 201, body
        return super().handle(method, path, body)


def poster(server: EventServer, **kw: Any) -> PodEvents:
    return PodEvents(
        ApiEvents(server.api_client()), "gpu.example.com", "node-a", now=lambda: NOW, **kw
    )


def test_pods_of_a_claim_are_those_it_is_reserved_for() -> None:
    doc = claim(
        reserved=[
            {"resource": "pods", "name": "a", "uid": "1"},
            {"apiGroup": "batch", "resource": "jobs", "name": "j", "uid": "2"},
            {"resource": "pods", "name": "", "uid": "3"},
        ]
    )
    assert claim_pods(doc) == [PodRef("team-a", "a", "1")]
    assert claim_pods({"metadata": {}}) == []


def test_event_body_is_a_warning_on_the_pod() -> None:
    body = event_body(PodRef("team-a", "a", "1"), "R" * 200, "m" * 5000, "drv", "node-a", NOW)
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "team-a",
        "name": "a",
        "uid": "1",
    }
    assert body["metadata"] == {"name": f"a.{int(NOW.timestamp() * 1e9):x}", "namespace": "team-a"}
    assert (body["type"], body["source"], body["count"]) == (
        "Warning",
        {"component": "drv", "host": "node-a"},
        1,
    )
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-12-01T10:00:00Z"
    assert len(body["reason"]) == 128 and len(body["message"]) <= 1024


def test_one_event_on_each_pod_of_the_claim() -> None:
    with EventServer() as server:
        server.add(claim())
        assert poster(server).post(REF, "MpsServerRestarted", "restart your pod") == 2
    assert [(e["involvedObject"]["name"], e["involvedObject"]["uid"]) for e in server.events] == [
        ("train-0", "pod-uid-0"),
        ("train-1", "pod-uid-1"),
    ]
    assert {(e["reason"], e["message"], e["type"]) for e in server.events} == {
        ("MpsServerRestarted", "restart your pod", "Warning")
    }


def test_failures_are_logged_never_raised() -> None:
    with EventServer() as server, capture_logs() as logs:
        events = poster(server, timeout=0.5)
        assert events.post(REF, "R", "m") == 0  # no such claim
        server.add(claim(uid="another"))
        assert events.post(REF, "R", "m") == 0  # re-created under the same name
        server.add(claim(reserved=[]))
        assert events.post(REF, "R", "m") == 0  # nobody uses it
        server.add(claim())
        server.refuse = 403
        assert events.post(REF, "R", "m") == 0
        server.refuse, server.delay = None, 2.0
        started = time.monotonic()
        assert events.post(REF, "R", "m") == 0  # no answer in time
        assert time.monotonic() - started < 1.9
    said = [(e["event"], e.get("error", "")) for e in logs]
    assert said[0][0] == "pod event not posted: claim not read" and "404" in said[0][1]
    assert "pod event not posted: the claim was deleted or re-created" in [s for s, _ in said]
    assert "pod event not posted: no pod uses the claim" in [s for s, _ in said]
    # "HTTP 403", not "403": the timeout's message names the stub's port, e.g. 40385 (CI)
    refused = [e for s, e in said if s == "pod event not posted" and "HTTP 403" in e]
    assert len(refused) == 2 and "create on events" in refused[0]
    assert all(e["claim_uid"] == UID and e["name"] == "train" for e in logs)


def test_events_are_queued_and_posted_in_the_background() -> None:
    with EventServer() as server:
        server.add(claim(reserved=[{"resource": "pods", "name": "p", "uid": "u"}]))
        events = poster(server, capacity=2)
        with capture_logs() as logs:
            for reason in ("A", "B", "C"):
                events.claim_event(REF, reason, "m")  # returns at once; the third is dropped
        assert [e["event"] for e in logs] == ["pod event dropped: too many waiting"]
        assert logs[0]["reason"] == "C"
        stop = threading.Event()
        worker = threading.Thread(target=events.run, args=(stop,))
        worker.start()
        try:
            deadline = time.monotonic() + 5
            while len(server.events) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            stop.set()
            worker.join(5)
    assert [e["reason"] for e in server.events] == ["A", "B"]
