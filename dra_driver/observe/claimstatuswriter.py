"""Writing prepared claims' ``status.devices`` (see :mod:`dra_driver.observe.claimstatus`) in the
background, so Prepare never waits on it.

For each submitted claim the writer takes the claim as Prepare read it or as its own last
update left it (else it reads the claim), checks it is still the claim prepared (same UID) and
allocated on this node (the plugin never writes another node's claim; the API server would
refuse it too, with ``associated-node`` authorization), skips the write when the entries are
already there (so a plugin restart re-submitting its prepared claims costs one read each), and
otherwise updates the claim's ``status`` with them (PUT, guarded by the ``resourceVersion``
read; a conflict re-reads).

Why an update in protobuf, of the claim as read: the API server compares
``status.allocation`` with the stored one, the raw bytes of each opaque configuration's
parameters included, and refuses any change. It keeps those bytes as their creator sent them
but serves JSON compacted and escaped, so on a claim created by a client that formats JSON its
own way (the Python client's spaces, another key order, unescaped ``&<>``) every JSON update,
patch or server-side apply of the status fails with 422 ``status.allocation: field cannot be
modified once set`` (seen on Kubernetes 1.37.2, also for the parameters a DeviceClass's config
copies into the allocation). The protobuf encoding carries them as stored
(:mod:`dra_driver.prepare.claimwire`).

Permissions (Kubernetes >= 1.36 granular status authorization): ``update`` on
``resourceclaims/status`` and ``associated-node:update`` on ``resourceclaims/driver`` with
``resourceNames: [<driver>]``; the chart grants both (``rbac.claimDeviceStatus``). A refused
write is logged with that hint and counted; Prepare is never failed by it.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog
from urllib3.exceptions import HTTPError

from dra_driver._proto import k8s_resourceclaim_pb2 as pb
from dra_driver.enforce.tiers import EnforcementReport
from dra_driver.infra.metrics import Metrics
from dra_driver.infra.rawapi import ApiClient, ApiException
from dra_driver.model.plans import ClaimPlan
from dra_driver.model.textlimits import shorten
from dra_driver.model.vocabulary import Tier
from dra_driver.observe.claimstatus import (
    ClientsCondition,
    Enforcement,
    allocated_node,
    already_written,
    device_entries,
)
from dra_driver.observe.consumers import ClaimConsumers
from dra_driver.prepare import claimwire
from dra_driver.prepare.claims import ClaimWire, is_protobuf

log = structlog.get_logger(__name__)

REMEMBERED = 1024
"""Claims kept for their next status write (:meth:`ClaimStatusWriter.remember`)."""
REMEMBERED_BYTES = 16 * 1024 * 1024
"""Encoded bytes of those claims at most (a claim can be large: 32 opaque configurations of
10 KiB; a tenant cycling failing claims near that size grew the plugin by 600 MiB when only
their number was bounded, found by review)."""

RBAC_HINT = (
    "grant the plugin's service account update on resourceclaims/status and "
    "associated-node:update on resourceclaims/driver for this driver (Helm value "
    "rbac.claimDeviceStatus=true)"
)


class ClaimStatusApi(Protocol):
    """Reads a claim and updates its status (protobuf messages,
    :mod:`dra_driver.prepare.claimwire`)."""

    def read(self, namespace: str, name: str, timeout: float) -> pb.ResourceClaim:
        """The claim.

        Raises:
            ApiException: the API server refused or has no such claim.
            urllib3.exceptions.HTTPError: no answer within ``timeout`` seconds.
            claimwire.WireError: the answer is not a protobuf ResourceClaim.
        """
        ...

    def replace(
        self, namespace: str, name: str, claim: pb.ResourceClaim, timeout: float
    ) -> pb.ResourceClaim | None:
        """Update the claim's ``status`` subresource with ``claim`` (as read, changed); returns
        the claim as the API server stored it, when it answered in protobuf (else None).

        Raises:
            ApiException: refused (409: ``resourceVersion`` or UID no longer match).
            urllib3.exceptions.HTTPError: no answer within ``timeout`` seconds.
        """
        ...


class ApiClaimStatus:
    """:class:`ClaimStatusApi` over the official client's connection pool and credentials, one
    try per call (its own copy of the configuration with urllib3 retries off; the writer
    retries itself). The generated methods speak JSON only, so the requests are sent through
    the client's pool directly: reads ask for protobuf, updates send it (errors come back as
    JSON, so their messages can be logged)."""

    def __init__(self, api_client: ApiClient) -> None:
        self._wire = ClaimWire(api_client)

    def read(self, namespace: str, name: str, timeout: float) -> pb.ResourceClaim:
        """GET the claim in protobuf."""
        headers = {"Accept": claimwire.CONTENT_TYPE}
        path = ClaimWire.path(namespace, name)
        return claimwire.decode(self._wire.request("GET", path, headers, timeout).data)

    def replace(
        self, namespace: str, name: str, claim: pb.ResourceClaim, timeout: float
    ) -> pb.ResourceClaim | None:
        """PUT ``claim`` to the status subresource in protobuf; the answer (the claim as
        stored) asked for in protobuf too, so that the next write of the claim need not read
        it (a refusal then comes as a protobuf ``Status``, whose message :class:`ClaimWire`
        gives)."""
        accept = f"{claimwire.CONTENT_TYPE}, application/json"
        headers = {"Content-Type": claimwire.CONTENT_TYPE, "Accept": accept}
        path = ClaimWire.path(namespace, name) + "/status"
        resp = self._wire.request("PUT", path, headers, timeout, claimwire.encode(claim))
        return claimwire.decode(resp.data) if is_protobuf(resp) else None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _retryable(exc: Exception) -> bool:
    """Transport errors, conflicts (409: the claim changed since it was read), 429 and 5xx
    are worth another try (after a new read); other refusals and an answer that does not parse
    are not."""
    if isinstance(exc, ApiException):
        return exc.status in (409, 429) or (exc.status or 0) >= 500
    return not isinstance(exc, claimwire.WireError)


def _server_message(body: object) -> str:
    """The ``message`` of the API server's JSON ``Status`` body, else the body itself (a
    protobuf ``Status``'s message, :class:`~dra_driver.prepare.claims.ClaimWire`)."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    try:
        doc = json.loads(text)
    except ValueError:
        return text
    return str(doc.get("message") or text) if isinstance(doc, dict) else text


def _describe(exc: Exception) -> str:
    """One line for the log, with what the API server said (which field it refused); a
    refusal for want of rights (403, or the API server's 422 with a ``resourceclaims/driver``
    cause) gets :data:`RBAC_HINT`."""
    if isinstance(exc, ApiException):
        said = shorten(_server_message(exc.body), 300)
        text = f"HTTP {exc.status} {exc.reason}" + (f": {said}" if said else "")
        if exc.status == 403 or "resourceclaims/driver" in str(exc.body):
            return f"{text}; {RBAC_HINT}"
        return text
    return f"{type(exc).__name__}: {exc}"


class ClaimStatusWriter:
    """Background writer of prepared claims' device status (one thread: :meth:`run`).

    Args:
        api: claim reads and status applies.
        driver: our driver name.
        node: this node's name; only claims allocated on it are written.
        enforcement: GPU UUID -> its tier and reasons (from tier detection).
        metrics: counts results in ``dra_gpu_fraction_claim_status_writes_total``.
        timeout: seconds per API call.
        attempts: tries per claim for retryable failures (transport, 429, 5xx).
        backoff: seconds before the second try, doubled for each further one.
        now: RFC 3339 time of the condition (tests pass a fixed clock).
        default_percentage: active thread percentage of sm-sharing claims that set none
            (``--default-active-thread-percentage``).
    """

    def __init__(
        self,
        api: ClaimStatusApi,
        driver: str,
        node: str,
        enforcement: Mapping[str, Enforcement],
        metrics: Metrics,
        *,
        timeout: float = 5.0,
        attempts: int = 3,
        backoff: float = 1.0,
        now: Callable[[], str] = _now,
        default_percentage: int = 100,
    ) -> None:
        self.api = api
        self.driver = driver
        self.node = node
        self.enforcement = dict(enforcement)
        self.metrics = metrics
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.now = now
        self.default_percentage = default_percentage
        self._queue: queue.Queue[ClaimPlan] = queue.Queue()
        self._root: set[str] = set()
        self._consumers: dict[str, tuple[str, ...]] = {}
        self._clients: dict[str, ClientsCondition] = {}
        self._read: dict[str, tuple[pb.ResourceClaim, int]] = {}
        self._read_bytes = 0
        self._read_lock = threading.Lock()

    @classmethod
    def of(
        cls,
        api_client: ApiClient,
        driver: str,
        node: str,
        report: EnforcementReport,
        metrics: Metrics,
        default_percentage: int,
    ) -> ClaimStatusWriter:
        """The plugin's writer: the API through ``api_client``, each GPU's enforcement from
        tier detection's ``report``."""
        enforcement = {
            uuid: Enforcement(Tier(d.tier), d.reasons) for uuid, d in report.decisions.items()
        }
        api = ApiClaimStatus(api_client)
        return cls(api, driver, node, enforcement, metrics, default_percentage=default_percentage)

    def submit(self, plan: ClaimPlan) -> None:
        """Queue ``plan``'s claim for a status write (returns at once)."""
        self._queue.put(plan)

    def remember(self, message: pb.ResourceClaim) -> None:
        """A claim as Prepare just read it, or as the API server stored the writer's last
        update: the next write of it starts from this message instead of reading the claim
        again (one API request fewer per write). A claim changed since (another pod reserved
        it) makes that update a 409 conflict, and the retry reads it. At most
        :data:`REMEMBERED` claims and :data:`REMEMBERED_BYTES` are kept, the oldest dropped
        first."""
        size = message.ByteSize()
        with self._read_lock:
            self._forget(message.metadata.uid)
            self._read[message.metadata.uid] = (message, size)
            self._read_bytes += size
            while len(self._read) > REMEMBERED or self._read_bytes > REMEMBERED_BYTES:
                self._forget(next(iter(self._read)))

    def _forget(self, uid: str) -> pb.ResourceClaim | None:
        """Drop ``uid``'s remembered message (lock held); returns it."""
        kept = self._read.pop(uid, None)
        if kept is None:
            return None
        self._read_bytes -= kept[1]
        return kept[0]

    def _take(self, uid: str) -> pb.ResourceClaim | None:
        with self._read_lock:
            return self._forget(uid)

    def observe(self, plan: ClaimPlan, consumers: ClaimConsumers) -> None:
        """``plan``'s claim has other running consumers, or a container that runs as root
        (:mod:`dra_driver.observe.consumers`): write its status again, listing them and, for a
        root container, with the ``NonRootClients=False`` condition (returns at once)."""
        uid = plan.claim.uid
        if consumers.root:
            self._root.add(uid)
        self._consumers[uid] = tuple(c.who or c.container_id for c in consumers.running)
        self._queue.put(plan)

    def flag_clients(self, plan: ClaimPlan, condition: ClientsCondition) -> None:
        """``plan``'s claim has a new ``MpsClientsConnected`` condition
        (:mod:`dra_driver.observe.mpsoutages`): write its status again with it (returns at
        once)."""
        self._clients[plan.claim.uid] = condition
        self._queue.put(plan)

    def run(self, stop: threading.Event) -> None:
        """Write queued claims one by one until ``stop`` is set (thread target). A claim whose
        write fails unexpectedly (a bug, a claim of a shape never seen) is logged and counted
        as failed; the thread goes on with the next one."""
        while not stop.is_set():
            try:
                plan = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                self.write(plan, stop)
            except Exception:
                ref = plan.claim
                log.exception(
                    "claim device status write failed unexpectedly",
                    claim_uid=ref.uid,
                    namespace=ref.namespace,
                    name=ref.name,
                )
                self.metrics.claim_status_writes.labels(result="failed").inc()

    def write(self, plan: ClaimPlan, stop: threading.Event | None = None) -> str:
        """Write one claim's device status now; returns the result counted: ``written``,
        ``unchanged``, ``skipped`` or ``failed`` (each logged). Never raises for API errors."""
        claim = plan.claim
        bound = log.bind(claim_uid=claim.uid, namespace=claim.namespace, name=claim.name)
        error: Exception | None = None
        for attempt in range(self.attempts):
            pause = self.backoff * 2 ** (attempt - 1)
            if attempt and (stop or threading.Event()).wait(pause):
                break
            try:
                result = self._write_once(plan, bound)
            except (ApiException, HTTPError, OSError, claimwire.WireError) as exc:
                error = exc
                if not _retryable(exc):
                    break
                continue
            self.metrics.claim_status_writes.labels(result=result).inc()
            return result
        bound.warning(
            "claim device status not written",
            error=_describe(error) if error else "stopped",
            attempts=self.attempts,
        )
        self.metrics.claim_status_writes.labels(result="failed").inc()
        return "failed"

    def _write_once(self, plan: ClaimPlan, bound: Any) -> str:
        ref = plan.claim
        message = self._take(ref.uid)
        try:
            if message is None:
                message = self.api.read(ref.namespace, ref.name, self.timeout)
        except ApiException as exc:
            if exc.status == 404:
                bound.info("claim gone before its device status was written")
                return "skipped"
            raise
        claim = claimwire.view(message)
        uid = claim["metadata"]["uid"]
        node = allocated_node(claim)
        if uid != ref.uid or node != self.node:
            bound.info(
                "claim device status not written: not the claim prepared on this node",
                claim_uid_now=uid,
                allocated_node=node,
            )
            return "skipped"
        entries = device_entries(
            plan,
            self.driver,
            self.enforcement,
            self.now(),
            self.default_percentage,
            runs_as_root=ref.uid in self._root,
            consumers=self._consumers.get(ref.uid, ()),
            clients=self._clients.get(ref.uid),
        )
        if already_written(claim, entries):
            self.remember(message)
            return "unchanged"
        started = time.perf_counter()
        try:
            stored = self.api.replace(
                ref.namespace, ref.name, claimwire.with_devices(message, entries), self.timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                bound.info("claim deleted before its device status was written")
                return "skipped"
            raise
        if stored is not None:
            self.remember(stored)  # the next write of this claim (a consumer) starts from it
        bound.info(
            "claim device status written",
            devices=[d.device for d in plan.devices],
            seconds=round(time.perf_counter() - started, 3),
        )
        return "written"
