"""Reading ResourceClaims from the API server as API JSON (dicts, camelCase)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from kubernetes.client import ApiClient, ResourceV1Api
from kubernetes.client.exceptions import ApiException

from dra_driver.prepare import PrepareError


class ClaimReader(Protocol):
    """Reads one ResourceClaim by namespace and name."""

    def read(self, namespace: str, name: str) -> Mapping[str, Any]:
        """Return the claim as API JSON.

        Raises:
            PrepareError: the claim does not exist or the API server refused the read.
        """
        ...


class ApiClaimReader:
    """A :class:`ClaimReader` over the official client (``ResourceV1Api``), skipping model
    deserialization: the raw JSON is parsed directly (faster, and unknown fields survive)."""

    def __init__(self, api_client: ApiClient) -> None:
        self._api = ResourceV1Api(api_client)

    def read(self, namespace: str, name: str) -> Mapping[str, Any]:
        """GET ``/apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>``."""
        try:
            resp: Any = self._api.read_namespaced_resource_claim(
                name, namespace, _preload_content=False, _request_timeout=10
            )
        except ApiException as exc:
            if exc.status == 404:
                raise PrepareError(f"claim {namespace}/{name} not found") from exc
            raise PrepareError(
                f"reading claim {namespace}/{name} failed: HTTP {exc.status} {exc.reason}"
            ) from exc
        doc: Mapping[str, Any] = json.loads(resp.data)
        return doc
