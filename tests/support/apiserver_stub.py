"""HTTP-level stand-ins for parts of kube-apiserver (unit tests only).

:class:`ApiStub` serves JSON over real HTTP the way kube-apiserver does (HTTP/1.1 keep-alive,
TCP_NODELAY, ``Status`` bodies for errors), so the official client's real code runs against
it; subclasses answer requests in :meth:`ApiStub.handle`. :class:`ClaimServer` serves
ResourceClaim GETs from a dict. End-to-end tests use the real API server instead.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from kubernetes import client as k8s

from dra_driver._proto import k8s_resourceclaim_pb2 as pb
from dra_driver.prepare import claimwire
from dra_driver.prepare.reads import CLAIM_READERS

_CLAIM_PATH = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/?]+)")


ALLOCATION_MODIFIED = "status.allocation: Invalid value: null: field cannot be modified once set"
"""kube-apiserver 1.37's message for a status update that changes the claim's allocation."""


class StubError(Exception):
    """Answer the request with a Kubernetes ``Status`` failure."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message


class ApiStub:
    """A threaded loopback HTTP server; use as a context manager."""

    def handle(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Return ``(status, JSON body)`` for one request, or raise :class:`StubError`."""
        raise StubError(405, "MethodNotAllowed")

    headers: list[dict[str, str]]
    """The headers of every request received, in order."""

    def handle_raw(self, method: str, path: str, raw: bytes) -> tuple[int, Any]:
        """:meth:`handle` of the parsed body; override to see the body's bytes. A ``bytes``
        answer is sent as protobuf."""
        return self.handle(method, path, json.loads(raw) if raw else {})

    def request_headers(self) -> dict[str, str]:
        """The headers of the request this thread is answering."""
        headers: dict[str, str] = self._local.headers
        return headers

    def __init__(self) -> None:
        stub = self
        self.headers = []
        self._local = threading.local()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as kube-apiserver
            disable_nagle_algorithm = True  # TCP_NODELAY, as Go's net/http

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                stub.headers.append(dict(self.headers))
                stub._local.headers = dict(self.headers)
                try:
                    status, reply = stub.handle_raw(self.command, self.path, raw)
                except StubError as exc:
                    status = exc.status
                    reply = {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": exc.reason,
                        "code": exc.status,
                        **({"message": exc.message} if exc.message else {}),
                    }
                ctype = "application/json"
                if isinstance(reply, bytes):  # a protobuf body
                    data, ctype = reply, claimwire.CONTENT_TYPE
                else:
                    data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                # The client may have given up waiting (a hung request timed out).
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # serve_forever checks for shutdown() every poll_interval s (default 0.5 s, paid by
        # every test that leaves the ``with`` block).
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def api_client(self) -> k8s.ApiClient:
        """An official client pointed at this stub."""
        cfg = k8s.Configuration()
        cfg.host = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        cfg.connection_pool_maxsize = CLAIM_READERS  # as kubeconfig.api_client
        return k8s.ApiClient(cfg)


class ClaimServer(ApiStub):
    """ResourceClaims by (namespace, name); ``requests`` counts requests and ``gets`` GETs per
    claim; unknown ones are 404. :meth:`hang` makes the GETs of a claim block until
    :meth:`release` (or the end of the ``with`` block); ``hanging`` counts those blocked now."""

    def __init__(self) -> None:
        super().__init__()
        self.claims: dict[tuple[str, str], Any] = {}
        self.requests = 0
        self.gets: Counter[tuple[str, str]] = Counter()
        self.hung: set[tuple[str, str]] = set()
        self.hanging = 0
        self._lock = threading.Lock()
        self._released = threading.Event()

    def hang(self, claim: dict[str, Any]) -> None:
        """Make every GET of ``claim`` hang (no answer) until :meth:`release`."""
        meta = claim["metadata"]
        self.hung.add((meta["namespace"], meta["name"]))

    def release(self) -> None:
        """Let hung GETs answer; later GETs answer at once."""
        self.hung.clear()
        self._released.set()

    def __exit__(self, *exc: object) -> None:
        self.release()
        super().__exit__(*exc)

    def handle(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        self.requests += 1
        m = _CLAIM_PATH.match(path)
        key = (m.group(1), m.group(2)) if m else ("", "")
        if method == "GET":
            with self._lock:
                self.gets[key] += 1
        if key in self.hung:
            with self._lock:
                self.hanging += 1
            self._released.wait()
            with self._lock:
                self.hanging -= 1
        if not (m and method == "GET") or key not in self.claims:  # a body may be JSON null
            raise StubError(404, "NotFound")
        return 200, self.claims[key]

    def add(self, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = claim

    def add_body(self, namespace: str, name: str, body: Any) -> None:
        """Serve ``body`` (any JSON value, even ``null``) as the claim ``namespace/name``."""
        self.claims[(namespace, name)] = body


_STATUS_PATH = re.compile(
    r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/?]+)/status$"
)


class ClaimStatusServer(ClaimServer):
    """A :class:`ClaimServer` that also speaks the API server's protobuf for claims, as the
    claim status writer uses it (:mod:`dra_driver.prepare.claimwire`): a GET asking for
    protobuf gets the claim encoded, and ``PUT .../resourceclaims/<name>/status`` takes an
    update in protobuf. As the API server does, it refuses with 409 an update whose
    ``metadata.uid`` or ``resourceVersion`` differs from the stored claim's, and with 422 and
    the API server's message one whose ``status.allocation`` bytes differ from those stored:
    the allocation as its creator sent it (:meth:`add`'s ``client``: by default a Go client's
    compact JSON for opaque parameters), which a JSON client could not send back unchanged.
    Else the update's ``status.devices`` are stored and the resourceVersion bumped.
    ``updates`` records the raw body of each PUT; ``update_failures`` lists HTTP statuses (or
    ``(status, message)``) to answer the next PUTs with, one each."""

    def __init__(self) -> None:
        super().__init__()
        self.updates: list[bytes] = []
        self.update_failures: list[int | tuple[int, str]] = []
        self.allocations: dict[tuple[str, str], bytes] = {}

    def add(self, claim: dict[str, Any], client: Callable[[Any], str] | None = None) -> None:
        """Store ``claim``; ``client``: how its creator's client wrote each opaque
        configuration's ``parameters`` as JSON (default: compact, keys as given, as Go's
        encoding/json), the bytes the API server keeps and serves in protobuf."""
        claim["metadata"].setdefault("resourceVersion", "1")
        super().add(claim)
        meta = claim["metadata"]
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation is None:
            return
        message = _allocation_message(allocation, client or _compact)
        self.allocations[(meta["namespace"], meta["name"])] = message.SerializeToString()

    def encoded(self, key: tuple[str, str]) -> bytes:
        """The stored claim ``key`` as a protobuf body."""
        claim = self.claims[key]
        meta = claim["metadata"]
        message = pb.ResourceClaim()
        message.metadata.name, message.metadata.namespace = meta["name"], meta["namespace"]
        message.metadata.uid, message.metadata.resourceVersion = (
            meta["uid"],
            meta["resourceVersion"],
        )
        if key in self.allocations:
            message.status.allocation = self.allocations[key]
        for r in (claim.get("status") or {}).get("reservedFor") or []:
            ref = pb.ResourceClaimConsumerReference(
                resource=r["resource"], name=r["name"], uid=r["uid"]
            )
            if r.get("apiGroup"):
                ref.apiGroup = r["apiGroup"]
            message.status.reservedFor.append(ref.SerializeToString())
        for d in (claim.get("status") or {}).get("devices") or []:
            message.status.devices.append(claimwire.device_message(d))
        return claimwire.encode(message)

    def handle_raw(self, method: str, path: str, raw: bytes) -> tuple[int, Any]:
        m = _STATUS_PATH.match(path)
        claim = _CLAIM_PATH.match(path)
        wants_protobuf = claimwire.CONTENT_TYPE in (self.request_headers().get("Accept") or "")
        if method == "GET" and claim and wants_protobuf:
            status, _ = super().handle_raw(method, path, raw)  # 404s, hangs and counts
            return status, self.encoded((claim.group(1), claim.group(2)))
        if method != "PUT" or not m:
            return super().handle_raw(method, path, raw)
        self.updates.append(raw)
        if self.update_failures:
            failure = self.update_failures.pop(0)
            code, message = failure if isinstance(failure, tuple) else (failure, "")
            raise StubError(code, "Injected", message)
        key = (m.group(1), m.group(2))
        stored = self.claims.get(key)
        if stored is None:
            raise StubError(404, "NotFound")
        sent = claimwire.decode(raw)
        if (sent.metadata.uid, sent.metadata.resourceVersion) != (
            stored["metadata"]["uid"],
            stored["metadata"]["resourceVersion"],
        ):
            raise StubError(409, "Conflict")
        if sent.status.allocation != self.allocations.get(key, b""):
            raise StubError(422, "Invalid", ALLOCATION_MODIFIED)
        stored.setdefault("status", {})["devices"] = [
            claimwire.device_json(d) for d in sent.status.devices
        ]
        stored["metadata"]["resourceVersion"] = str(int(stored["metadata"]["resourceVersion"]) + 1)
        if wants_protobuf:  # the answer in protobuf, as kube-apiserver gives it when asked
            return 200, self.encoded(key)
        return 200, stored


def _compact(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def _allocation_message(allocation: dict[str, Any], client: Callable[[Any], str]) -> Any:
    """``status.allocation`` (API JSON) as the API server's protobuf ``AllocationResult``,
    the opaque parameters written by ``client``."""
    message = pb.AllocationResult()
    devices = allocation.get("devices") or {}
    for r in devices.get("results") or []:
        result = message.devices.results.add(
            request=r["request"], driver=r["driver"], pool=r["pool"], device=r["device"]
        )
        if "adminAccess" in r:
            result.adminAccess = r["adminAccess"]
        if "shareID" in r:
            result.shareID = r["shareID"]
        for name, quantity in (r.get("consumedCapacity") or {}).items():
            result.consumedCapacity[name].string = quantity
    for c in devices.get("config") or []:
        config = message.devices.config.add(source=c["source"], requests=c.get("requests") or [])
        if "opaque" in c:
            opaque = config.deviceConfiguration.opaque
            opaque.driver = c["opaque"]["driver"]
            opaque.parameters.raw = client(c["opaque"]["parameters"]).encode()
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    for t in terms:
        term = message.nodeSelector.nodeSelectorTerms.add()
        for kind in ("matchExpressions", "matchFields"):
            for req in t.get(kind) or []:
                getattr(term, kind).add(
                    key=req["key"], operator=req["operator"], values=req.get("values") or []
                )
    return message
