"""What each fraction uses, for ``dra-driver occupancy`` (pure): the plugins' own metrics.

``occupancy`` talks to the API server only; the usage it shows (columns USED, SM% and NOTE)
comes from each node's kubelet plugin's ``/metrics``, fetched through the API server's pod
proxy (:func:`dra_driver.cluster.occupancyread.read_usage`:
``GET /api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/metrics``; the caller needs
``get`` on ``pods/proxy`` in the driver's namespace, and where a NetworkPolicy guards the
metrics port the API server must be admitted by it). Plugin pods are the Running pods matching
``--plugin-selector`` (default :data:`PLUGIN_SELECTOR`) with a container port named
``metrics``. A node whose plugin cannot be read is named with the reason; its claims show
``?``. Nothing here writes to the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

IDLE_NOTE_S = 1800.0
"""Idle seconds from which NOTE says ``idle``."""

Json = Mapping[str, Any]
Key = tuple[str, str]
"""(claim UID, GPU UUID)."""


@dataclass(frozen=True)
class ClaimUse:
    """What one claim uses on one GPU, from its node's plugin (None: the plugin does not know).

    Attributes:
        used_bytes: GPU memory in use, bytes.
        sm_percent: SM utilization, percent of the whole GPU.
        sm_normalized: SM utilization over the portion the claim bought, percent (max 100).
        near_ceiling: used memory is at least 0.9 of the ceiling.
        idle_seconds: seconds without SM use (0 while busy).
    """

    used_bytes: int | None = None
    sm_percent: float | None = None
    sm_normalized: float | None = None
    near_ceiling: bool = False
    idle_seconds: float | None = None


_FIELDS = {
    "dra_gpu_fraction_claim_memory_used_bytes": "used_bytes",
    "dra_gpu_fraction_claim_sm_utilization_percent": "sm_percent",
    "dra_gpu_fraction_claim_sm_utilization_normalized_percent": "sm_normalized",
    "dra_gpu_fraction_claim_near_ceiling": "near_ceiling",
    "dra_gpu_fraction_claim_idle_seconds": "idle_seconds",
}


def parse_metrics(text: str) -> dict[Key, ClaimUse]:
    """Pure: the per-claim usage in a plugin's Prometheus text, keyed (claim UID, GPU UUID).

    Raises:
        ValueError: the text is not the Prometheus text format.
    """
    values: dict[Key, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = _FIELDS.get(sample.name)
            uid, gpu = sample.labels.get("claim_uid"), sample.labels.get("gpu_uuid")
            if name is None or uid is None or gpu is None:
                continue
            value: Any = sample.value
            if name == "used_bytes":
                value = int(value)
            elif name == "near_ceiling":
                value = value >= 1
            values.setdefault((uid, gpu), {})[name] = value
    return {key: ClaimUse(**fields) for key, fields in values.items()}


def metrics_port(pod: Json) -> int | None:
    """Pure: the pod's container port named ``metrics`` (None when it has none)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "metrics" and port.get("containerPort"):
                return int(port["containerPort"])
    return None


def note(use: ClaimUse | None) -> str:
    """Pure: NOTE column: ``near-ceiling``, ``idle <minutes>m``, both, or ``-``."""
    if use is None:
        return "-"
    notes = ["near-ceiling"] if use.near_ceiling else []
    if use.idle_seconds is not None and use.idle_seconds >= IDLE_NOTE_S:
        notes.append(f"idle {int(use.idle_seconds // 60)}m")
    return ",".join(notes) or "-"
