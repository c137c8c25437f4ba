"""An HTTP-level stand-in for the ResourceClaim GET of kube-apiserver (unit tests only).

Serves ``GET /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>`` from a dict,
answering 404 with a Kubernetes ``Status`` body for unknown claims, so the real client code
(``ApiClaimReader``) runs over real HTTP. End-to-end tests use the real API server instead.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client as k8s

_PATH = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/?]+)")


class ClaimServer:
    """Claims by (namespace, name); ``requests`` counts GETs."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as kube-apiserver
            disable_nagle_algorithm = True  # TCP_NODELAY, as Go's net/http

            def do_GET(self) -> None:  # noqa: N802
                server.requests += 1
                m = _PATH.match(self.path)
                claim = server.claims.get((m.group(1), m.group(2))) if m else None
                status = 200 if claim is not None else 404
                body = claim or {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "NotFound",
                    "code": 404,
                }
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> ClaimServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def api_client(self) -> k8s.ApiClient:
        cfg = k8s.Configuration()
        cfg.host = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        return k8s.ApiClient(cfg)

    def add(self, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = claim
