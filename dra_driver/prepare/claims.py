"""Reading ResourceClaims from the API server: in protobuf when the server speaks it (the real
one does), viewed as API JSON (dicts, camelCase) for planning, the message handed on so that
the claim status writer need not read the claim again."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from urllib3 import BaseHTTPResponse, Timeout
from urllib3.exceptions import TimeoutError as Urllib3TimeoutError

from dra_driver._proto import k8s_resourceclaim_pb2 as pb
from dra_driver.infra.kubeconfig import single_try
from dra_driver.infra.rawapi import ApiClient, ApiException
from dra_driver.model.errors import PrepareError
from dra_driver.prepare import claimwire


class ClaimReadTimeout(PrepareError):
    """The API server did not answer a claim read within the time given."""


class ClaimNotFound(PrepareError):
    """The API server answered 404: no claim of that namespace and name."""


class ClaimReader(Protocol):
    """Reads one ResourceClaim by namespace and name."""

    def read(self, namespace: str, name: str, timeout: float) -> Mapping[str, Any]:
        """Return the claim as API JSON, within ``timeout`` seconds.

        Raises:
            ClaimReadTimeout: no answer within ``timeout``.
            ClaimNotFound: the claim does not exist.
            PrepareError: the API server refused the read.
        """
        ...


class ClaimWire:
    """ResourceClaim requests sent through the official client's connection pool, credentials
    and User-Agent, one try each (urllib3 retries off: the callers bound their time and retry
    themselves). The generated methods speak JSON only; these read and write protobuf
    (:mod:`dra_driver.prepare.claimwire`)."""

    def __init__(self, api_client: ApiClient) -> None:
        self._client = single_try(api_client)

    def request(
        self, method: str, path: str, headers: dict[str, str], timeout: float, body: bytes = b""
    ) -> BaseHTTPResponse:
        """One request to ``path`` under the API server, within ``timeout`` seconds.

        Raises:
            ApiException: the API server answered 400 or more (``body``: the answer, or the
                message of a protobuf ``Status``).
            urllib3.exceptions.HTTPError: no answer within ``timeout``, connection refused.
        """
        config = self._client.configuration
        for auth in config.auth_settings().values():  # the client's own bearer token header
            headers[auth["key"]] = str(auth["value"])
        headers["User-Agent"] = self._client.user_agent
        resp = self._client.rest_client.pool_manager.request(
            method,
            f"{config.host}{path}",
            headers=headers,
            timeout=Timeout(total=timeout),
            retries=False,
            body=body or None,
        )
        if resp.status >= 400:
            exc = ApiException(http_resp=resp)
            said = claimwire.status_message(resp.data)
            if said is not None:  # a refusal in protobuf, when the request accepted it
                exc.body = said
            raise exc
        return resp

    @staticmethod
    def path(namespace: str, name: str) -> str:
        """``/apis/resource.k8s.io/v1/namespaces/<namespace>/resourceclaims/<name>``."""
        return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


def is_protobuf(resp: BaseHTTPResponse) -> bool:
    """Whether the answer's body is in the Kubernetes protobuf encoding."""
    return str(resp.headers.get("Content-Type", "")).startswith(claimwire.CONTENT_TYPE)


class ApiClaimReader:
    """A :class:`ClaimReader` over the official client's connection (:class:`ClaimWire`).

    It asks for protobuf, else JSON: the real API server answers protobuf, which is decoded and
    viewed as API JSON (:func:`claimwire.view`) and handed to ``on_read`` (the claim status
    writer then updates the claim from it instead of reading it again); an answer in JSON is
    parsed as it is (unknown fields survive). One try at most ``timeout`` seconds: the
    caller's budget is the only limit; the kubelet retries Prepare itself.

    Args:
        api_client: the plugin's client.
        on_read: called with each claim read in protobuf.
    """

    def __init__(
        self, api_client: ApiClient, on_read: Callable[[pb.ResourceClaim], None] | None = None
    ) -> None:
        self._wire = ClaimWire(api_client)
        self._on_read = on_read

    def read(self, namespace: str, name: str, timeout: float) -> Mapping[str, Any]:
        """GET ``/apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>``, one try,
        at most ``timeout`` seconds (connect and answer together)."""
        accept = f"{claimwire.CONTENT_TYPE}, application/json"
        try:
            resp = self._wire.request(
                "GET", ClaimWire.path(namespace, name), {"Accept": accept}, timeout
            )
        except Urllib3TimeoutError as exc:
            raise ClaimReadTimeout(
                f"reading claim {namespace}/{name} timed out after {timeout:.3g} s"
            ) from exc
        except ApiException as exc:
            if exc.status == 404:
                raise ClaimNotFound(f"claim {namespace}/{name} not found") from exc
            raise PrepareError(
                f"reading claim {namespace}/{name} failed: HTTP {exc.status} {exc.reason}"
            ) from exc
        if not is_protobuf(resp):
            doc: Mapping[str, Any] = json.loads(resp.data)
            return doc
        message = claimwire.decode(resp.data)
        view = claimwire.view(message)
        if self._on_read is not None:
            self._on_read(message)
        return view
