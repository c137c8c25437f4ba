"""Builders of ResourceClaim API JSON as the scheduler leaves it (allocated)."""

from __future__ import annotations

import uuid
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.config.params import PARAMS_API_VERSION, PARAMS_KIND

DRIVER = DEFAULT_DRIVER_NAME


def result(
    device: str,
    pool: str,
    request: str = "gpu",
    driver: str = DRIVER,
    share_id: str | None = None,
    memory: str | None = None,
    slots: str | None = None,
) -> dict[str, Any]:
    r: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if share_id:
        r["shareID"] = share_id
    if memory:
        r["consumedCapacity"] = {"memory": memory}
    if slots:
        r["consumedCapacity"] = {"slots": slots}
    return r


def opaque(
    source: str = "FromClaim", requests: list[str] | None = None, **fields: Any
) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "source": source,
        "opaque": {
            "driver": DRIVER,
            "parameters": {"apiVersion": PARAMS_API_VERSION, "kind": PARAMS_KIND, **fields},
        },
    }
    if requests:
        cfg["requests"] = requests
    return cfg


def pod(name: str, uid: str | None = None) -> dict[str, Any]:
    """A ``status.reservedFor`` entry naming a pod (as the scheduler writes it)."""
    return {"resource": "pods", "name": name, "uid": uid or str(uuid.uuid4())}


def claim(
    results: list[dict[str, Any]],
    configs: list[dict[str, Any]] | None = None,
    namespace: str = "default",
    name: str | None = None,
    uid: str | None = None,
    reserved_for: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    uid = uid or str(uuid.uuid4())
    status: dict[str, Any] = {
        "allocation": {"devices": {"results": results, "config": configs or []}}
    }
    if reserved_for is not None:
        status["reservedFor"] = reserved_for
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name or f"claim-{uid[:8]}", "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": status,
    }


def on_node(claim: dict[str, Any], node: str) -> dict[str, Any]:
    """``claim`` with the allocation's node selector the scheduler writes for devices of a
    node-local slice (one term, ``metadata.name In [node]``)."""
    claim["status"]["allocation"]["nodeSelector"] = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }
    return claim
