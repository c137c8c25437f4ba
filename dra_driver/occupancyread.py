"""Reads what ``dra-driver occupancy`` needs from the API server (read-only, no node access):
the driver's ResourceSlices, ResourceClaims, ResourceClaimTemplates, Pending pods,
ResourceQuotas, DeviceClasses and Nodes, as raw API JSON (:class:`~dra_driver.occupancy.Cluster`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from dra_driver.occupancy import Cluster, Json

PAGE = 500
"""Objects per list call (the API server pages with ``continue`` tokens)."""

TIMEOUT_S = (5.0, 30.0)
"""Connect and read timeout of each list call, seconds."""


def api_client(kubeconfig: str | None) -> k8s.ApiClient:
    """A client from ``kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config`` when it
    exists, else the in-cluster service account.

    Raises:
        ConfigException: unusable kubeconfig (the message names the file) or no configuration.
    """
    from dra_driver.kubeconfig import load_kubeconfig

    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    cfg = k8s.Configuration()
    if kubeconfig or Path(path).exists():
        load_kubeconfig(Path(path), cfg)
    else:
        k8s_config.load_incluster_config(client_configuration=cfg)
    cfg.retries = 1
    return k8s.ApiClient(cfg)


def list_all(call: Callable[..., Any], **kwargs: Any) -> list[Json]:
    """Every item of a list call, page by page, as API JSON.

    Raises:
        ApiException: the API server refused (e.g. 403 without list permission).
        urllib3.exceptions.HTTPError, OSError: the API server is unreachable.
    """
    items: list[Json] = []
    token: str | None = None
    while True:
        page = {"limit": PAGE, "_continue": token} if token else {"limit": PAGE}
        resp = call(_preload_content=False, _request_timeout=TIMEOUT_S, **kwargs, **page)
        body = json.loads(resp.data)
        items += body.get("items") or []
        token = (body.get("metadata") or {}).get("continue")
        if not token:
            return items


def read_cluster(api: k8s.ApiClient, driver: str) -> Cluster:
    """The objects the occupancy report is decided from (see :func:`list_all` for errors)."""
    res, core = k8s.ResourceV1Api(api), k8s.CoreV1Api(api)
    return Cluster(
        slices=list_all(res.list_resource_slice, field_selector=f"spec.driver={driver}"),
        claims=list_all(res.list_resource_claim_for_all_namespaces),
        templates=list_all(res.list_resource_claim_template_for_all_namespaces),
        pods=list_all(core.list_pod_for_all_namespaces, field_selector="status.phase=Pending"),
        quotas=list_all(core.list_resource_quota_for_all_namespaces),
        classes=list_all(res.list_device_class),
        nodes=list_all(core.list_node),
    )
