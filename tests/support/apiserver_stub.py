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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from kubernetes import client as k8s

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
        """:meth:`handle` of the parsed body; override to see the body's bytes."""
        return self.handle(method, path, json.loads(raw) if raw else {})

    def __init__(self) -> None:
        stub = self
        self.headers = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as kube-apiserver
            disable_nagle_algorithm = True  # TCP_NODELAY, as Go's net/http

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                stub.headers.append(dict(self.headers))
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
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
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
    """A :class:`ClaimServer` that also takes updates of claims' ``status``
    (``PUT .../resourceclaims/<name>/status``), as the API server does: a body whose
    ``metadata.uid`` or ``metadata.resourceVersion`` differs from the stored claim's is refused
    with 409, and one whose ``status.allocation`` differs from the stored one (compared as the
    raw bytes of each opaque ``parameters``, as the API server compares them) with 422 and the
    API server's message; else the body's status is stored and the resourceVersion bumped.
    The stored bytes are those the claim's writer sent: by default a Go client's (compact,
    ``&``, ``<``, ``>`` escaped as ``\\u0026``...), with ``go_client=False`` a client that
    escapes nothing. ``updates`` records the raw body of each PUT; ``update_failures`` lists
    HTTP statuses to answer the next PUTs with, one each."""

    def __init__(self) -> None:
        super().__init__()
        self.updates: list[bytes] = []
        self.update_failures: list[int] = []
        self.stored_parameters: dict[tuple[str, str], list[bytes]] = {}

    def add(self, claim: dict[str, Any], go_client: bool = True) -> None:
        claim["metadata"].setdefault("resourceVersion", "1")
        super().add(claim)
        meta = claim["metadata"]
        sent = _compact(claim)
        if go_client:
            sent = re.sub(rb"[&<>]", lambda m: b"\\u%04x" % ord(m.group()), sent)
        self.stored_parameters[(meta["namespace"], meta["name"])] = _allocation_bytes(sent)

    def handle_raw(self, method: str, path: str, raw: bytes) -> tuple[int, Any]:
        m = _STATUS_PATH.match(path)
        if method != "PUT" or not m:
            return super().handle_raw(method, path, raw)
        self.updates.append(raw)
        if self.update_failures:
            raise StubError(self.update_failures.pop(0), "Injected")
        stored = self.claims.get((m.group(1), m.group(2)))
        if stored is None:
            raise StubError(404, "NotFound")
        sent = json.loads(raw)
        meta = sent["metadata"]
        if (meta.get("uid"), meta.get("resourceVersion")) != (
            stored["metadata"]["uid"],
            stored["metadata"]["resourceVersion"],
        ):
            raise StubError(409, "Conflict")
        if _allocation_bytes(raw) != self.stored_parameters[(m.group(1), m.group(2))]:
            raise StubError(422, "Invalid", ALLOCATION_MODIFIED)
        stored["status"] = sent["status"]
        stored["metadata"]["resourceVersion"] = str(int(stored["metadata"]["resourceVersion"]) + 1)
        return 200, stored


def _compact(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _allocation_bytes(raw: bytes) -> list[bytes]:
    """The raw bytes of every opaque ``parameters`` object in ``raw``'s allocation (the API
    server keeps them as sent and compares them byte by byte)."""
    allocation = raw[raw.find(b'"allocation":') :]
    out = []
    for m in re.finditer(rb'"parameters":', allocation):
        start, depth = m.end(), 0
        for i in range(start, len(allocation)):
            depth += {ord("{"): 1, ord("}"): -1}.get(allocation[i], 0)
            if depth == 0:
                out.append(allocation[start : i + 1])
                break
    return out
