"""Warning events on the pods that use a claim, posted in the background.

The plugin sees claims, not pods; what a user reads first is ``kubectl describe pod``, whose
Events section lists the core/v1 Events whose ``involvedObject`` is the pod (kubectl searches
them by the pod's UID, name and namespace). So :class:`PodEvents` reads the claim, takes the
pods its ``status.reservedFor`` lists (the scheduler reserves a claim for each pod that uses
it; Kubernetes API reference, ResourceClaimStatus), and creates one core/v1 ``Event`` of type
``Warning`` on each, with ``source.component`` the driver's name and ``source.host`` the node.

:meth:`PodEvents.claim_event` only queues (bounded: a full queue drops the event with a log
line), so Prepare and the MPS supervision never wait on the API server; one worker thread
(:meth:`PodEvents.run`) posts, one try per call within ``timeout`` seconds; a failure is
logged, never raised. Each event is new (name ``<pod>.<nanoseconds in hex>``, as client-go
names them), not an update of an earlier one, so the plugin needs ``create`` on events and
nothing else (the chart's ClusterRole grants it).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog
from kubernetes.client import ApiClient, ResourceV1Api
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from dra_driver.infra.kubeconfig import single_try
from dra_driver.infra.rawapi import json_request
from dra_driver.model.plans import ClaimRef
from dra_driver.model.textlimits import shorten

log = structlog.get_logger(__name__)

MAX_REASON = 128
"""Characters of an event's reason (the events.k8s.io/v1 validation limit, kept here too)."""
MAX_MESSAGE = 1024
"""Characters of an event's message (the events.k8s.io/v1 note limit, 1 KiB)."""
QUEUE_SIZE = 256
"""Events waiting to be posted; more are dropped."""


@dataclass(frozen=True)
class PodRef:
    """A pod a claim is reserved for."""

    namespace: str
    name: str
    uid: str


def claim_pods(claim: Mapping[str, Any]) -> list[PodRef]:
    """Pure: the pods in ``claim``'s ``status.reservedFor`` (API JSON as read), in its order;
    other consumers (another resource or API group) are left out. A claim's consumers are in
    its own namespace."""
    namespace = str((claim.get("metadata") or {}).get("namespace") or "")
    pods = []
    for ref in (claim.get("status") or {}).get("reservedFor") or []:
        if ref.get("resource") == "pods" and not ref.get("apiGroup"):
            pods.append(PodRef(namespace, str(ref.get("name") or ""), str(ref.get("uid") or "")))
    return [p for p in pods if p.name and p.uid]


def event_body(
    pod: PodRef, reason: str, message: str, component: str, host: str, now: datetime
) -> dict[str, Any]:
    """Pure: the core/v1 ``Event`` (API JSON) of a ``Warning`` on ``pod``; ``reason`` cut to
    :data:`MAX_REASON`, ``message`` to :data:`MAX_MESSAGE` characters; ``now`` is the first and
    last time (UTC)."""
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{pod.name}.{int(now.timestamp() * 1e9):x}",
            "namespace": pod.namespace,
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": pod.namespace,
            "name": pod.name,
            "uid": pod.uid,
        },
        "type": "Warning",
        "reason": reason[:MAX_REASON],
        "message": shorten(message, MAX_MESSAGE - 40),
        "source": {"component": component, "host": host},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventsApi(Protocol):
    """Reads a claim and creates an event (API JSON)."""

    def read_claim(self, namespace: str, name: str, timeout: float) -> Mapping[str, Any]:
        """The claim as API JSON.

        Raises:
            ApiException: refused, or no such claim (404).
            urllib3.exceptions.HTTPError: no answer within ``timeout`` seconds.
        """
        ...

    def create_event(self, namespace: str, body: Mapping[str, Any], timeout: float) -> None:
        """Create the event ``body`` in ``namespace``.

        Raises:
            ApiException: refused (403: no ``create`` on events).
            urllib3.exceptions.HTTPError: no answer within ``timeout`` seconds.
        """
        ...


class ApiEvents:
    """:class:`EventsApi` over the official client, one try per call (events through
    :func:`~dra_driver.infra.rawapi.json_request`)."""

    def __init__(self, api_client: ApiClient) -> None:
        self._client = single_try(api_client)
        self._claims = ResourceV1Api(self._client)

    def read_claim(self, namespace: str, name: str, timeout: float) -> Mapping[str, Any]:
        resp: Any = self._claims.read_namespaced_resource_claim(
            name, namespace, _preload_content=False, _request_timeout=timeout
        )
        doc: Mapping[str, Any] = json.loads(resp.data)
        return doc

    def create_event(self, namespace: str, body: Mapping[str, Any], timeout: float) -> None:
        json_request(self._client, "POST", f"/api/v1/namespaces/{namespace}/events", timeout, body)


@dataclass(frozen=True)
class _Item:
    claim: ClaimRef
    reason: str
    message: str


def _now() -> datetime:
    return datetime.now(UTC)


class PodEvents:
    """Posts Warning events on the pods of a claim from one background thread (:meth:`run`).

    Args:
        api: claim reads and event creation.
        component: ``source.component`` of the events (the driver's name).
        host: ``source.host`` (this node's name).
        capacity: events that may wait; more are dropped (logged).
        timeout: seconds per API call.
        now: the events' time (tests pass a fixed clock).
    """

    def __init__(
        self,
        api: EventsApi,
        component: str,
        host: str,
        *,
        capacity: int = QUEUE_SIZE,
        timeout: float = 5.0,
        now: Callable[[], datetime] = _now,
    ) -> None:
        self.api = api
        self.component = component
        self.host = host
        self.timeout = timeout
        self.now = now
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=capacity)

    @classmethod
    def of(cls, api_client: ApiClient, component: str, host: str) -> PodEvents:
        """The plugin's poster, through ``api_client``."""
        return cls(ApiEvents(api_client), component, host)

    def claim_event(self, claim: ClaimRef, reason: str, message: str) -> None:
        """Queue a Warning event with ``reason`` (CamelCase, e.g. ``MpsServerRestarted``) and
        ``message`` (one paragraph for the pod's owner) for each pod that uses ``claim``;
        returns at once. A full queue drops it, with a warning logged."""
        try:
            self._queue.put_nowait(_Item(claim, reason, message))
        except queue.Full:
            log.warning(
                "pod event dropped: too many waiting",
                claim_uid=claim.uid,
                namespace=claim.namespace,
                name=claim.name,
                reason=reason,
                waiting=self._queue.qsize(),
            )

    def run(self, stop: threading.Event) -> None:
        """Post queued events until ``stop`` is set (thread target); an unexpected error is
        logged and the thread goes on."""
        while not stop.is_set():
            try:
                item = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                self.post(item.claim, item.reason, item.message)
            except Exception:
                log.exception("pod event failed unexpectedly", claim_uid=item.claim.uid)

    def post(self, claim: ClaimRef, reason: str, message: str) -> int:
        """Post the event on each pod of ``claim`` now; returns how many were created. API
        errors and time-outs are logged, never raised."""
        bound = log.bind(
            claim_uid=claim.uid, namespace=claim.namespace, name=claim.name, reason=reason
        )
        started = time.monotonic()
        try:
            doc = self.api.read_claim(claim.namespace, claim.name, self.timeout)
        except (ApiException, HTTPError, OSError) as exc:
            bound.warning("pod event not posted: claim not read", error=_describe(exc))
            return 0
        if (doc.get("metadata") or {}).get("uid") != claim.uid:
            bound.info("pod event not posted: the claim was deleted or re-created")
            return 0
        pods = claim_pods(doc)
        if not pods:
            bound.info("pod event not posted: no pod uses the claim")
            return 0
        posted = 0
        for pod in pods:
            body = event_body(pod, reason, message, self.component, self.host, self.now())
            try:
                self.api.create_event(pod.namespace, body, self.timeout)
            except (ApiException, HTTPError, OSError) as exc:
                bound.warning("pod event not posted", pod=pod.name, error=_describe(exc))
                continue
            posted += 1
        bound.info(
            "pod events posted",
            pods=[p.name for p in pods],
            posted=posted,
            seconds=round(time.monotonic() - started, 3),
        )
        return posted


def _describe(exc: Exception) -> str:
    """One line for the log; a 403 says which permission is missing."""
    if isinstance(exc, ApiException):
        text = f"HTTP {exc.status} {exc.reason}"
        if exc.status == 403:
            return (
                f"{text}: the plugin's service account needs create on events (the chart's "
                "ClusterRole grants it)"
            )
        return text
    return f"{type(exc).__name__}: {exc}"
