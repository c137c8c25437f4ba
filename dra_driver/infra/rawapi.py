"""API requests with JSON bodies through the official client's connection, credentials and
User-Agent (``ApiClient.param_serialize`` and ``call_api``), without its generated API classes:
importing ``CoreV1Api`` loads about 235 model modules (20 MiB of the plugin's memory, measured
with ``ru_maxrss``) for the two core/v1 calls the plugin makes (read its Node, create an
Event).

The API client's connection type and its error are handed on from here (``ApiClient``,
``ApiException``), so that code which only passes a client along or reads an error's status
does not import the client library itself (``tests/test_layering.py`` lists the modules that
do)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

__all__ = ["ApiClient", "ApiException", "json_request"]


def json_request(
    client: ApiClient,
    method: str,
    path: str,
    timeout: float,
    body: Mapping[str, Any] | None = None,
) -> Any:
    """One request to ``path`` (e.g. ``/api/v1/nodes/<name>``) with ``body`` as JSON; returns
    the decoded JSON answer (None for an empty one), within ``timeout`` seconds.

    Raises:
        ApiException: the API server answered 400 or more (``status``, ``reason``, ``body``
            as the generated methods give them).
        urllib3.exceptions.HTTPError: no answer within ``timeout``, connection refused.
    """
    _, url, headers, data, _ = client.param_serialize(
        method=method,
        resource_path=path,
        header_params={"Accept": "application/json", "Content-Type": "application/json"},
        body=dict(body) if body is not None else None,
        auth_settings=["BearerToken"],
    )
    resp = client.call_api(method, url, header_params=headers, body=data, _request_timeout=timeout)
    resp.read()
    if resp.status >= 400:
        raise ApiException(http_resp=resp)
    return json.loads(resp.data) if resp.data else None
