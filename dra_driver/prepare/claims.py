"""Reading ResourceClaims from the API server as API JSON (dicts, camelCase)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from kubernetes.client import ApiClient, ResourceV1Api
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import TimeoutError as Urllib3TimeoutError

from dra_driver.infra.kubeconfig import single_try
from dra_driver.model.errors import PrepareError


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


class ApiClaimReader:
    """A :class:`ClaimReader` over the official client (``ResourceV1Api``), skipping model
    deserialization: the raw JSON is parsed directly (faster, and unknown fields survive).

    It uses its own copy of the client's configuration with retries off: urllib3 would
    otherwise retry a timed-out GET three times (its ``Retry.DEFAULT``), four times the time the
    caller gave. The caller's budget is the only limit; the kubelet retries Prepare itself.
    """

    def __init__(self, api_client: ApiClient) -> None:
        self._api = ResourceV1Api(single_try(api_client))

    def read(self, namespace: str, name: str, timeout: float) -> Mapping[str, Any]:
        """GET ``/apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>``, one try,
        at most ``timeout`` seconds (connect and answer together)."""
        try:
            resp: Any = self._api.read_namespaced_resource_claim(
                name, namespace, _preload_content=False, _request_timeout=timeout
            )
            doc: Mapping[str, Any] = json.loads(resp.data)
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
        return doc
