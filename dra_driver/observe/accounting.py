"""Per-fraction accounting: a Prometheus custom collector over the prepared claims.

For every prepared claim and every GPU it uses (devices of one claim on one GPU are summed,
as the enforcer does), at scrape time:

- ``dra_gpu_fraction_claim_memory_request_bytes``: guaranteed memory (soft limit), bytes;
- ``dra_gpu_fraction_claim_memory_limit_bytes``: ceiling (hard limit), bytes;
- ``dra_gpu_fraction_claim_memory_used_bytes``: GPU memory in use, bytes (only when the
  usage source knows it; never a made-up zero);
- ``dra_gpu_fraction_claim_clients``: client processes (MPS clients of the claim's namespace);
- ``dra_gpu_fraction_accounting_up``: 1 when the usage source answered this scrape, else 0.

Labels: ``claim_namespace``, ``claim_name``, ``claim_uid``, ``gpu_uuid``, ``compute_mode``.
The usage source is injectable (:class:`UsageSource`): the MPS/NVML one lives in
:mod:`dra_driver.observe.usage`; :class:`NoUsage` reports request/limit only (simulated nodes).
The existing ``dra_gpu_fraction_*`` counters and histogram in :mod:`dra_driver.infra.metrics` are
unchanged; :func:`register_accounting` adds this collector to ``Metrics.registry``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dra_driver.model.plans import ClaimPlan

log = structlog.get_logger(__name__)

LABELS = ("claim_namespace", "claim_name", "claim_uid", "gpu_uuid", "compute_mode")
"""Labels of every per-fraction sample."""


@dataclass(frozen=True)
class FractionUsage:
    """Observed use of one claim on one GPU; None = unknown.

    Attributes:
        used_bytes: GPU memory in use, bytes.
        clients: client processes attached.
    """

    used_bytes: int | None = None
    clients: int | None = None


class UsageSource(Protocol):
    """Where used memory and client counts come from."""

    def snapshot(self, plans: Sequence[ClaimPlan]) -> Mapping[tuple[str, str], FractionUsage]:
        """Usage keyed by ``(claim UID, GPU UUID)`` for the given plans (missing = unknown).

        May raise any exception; the collector then reports ``accounting_up 0``.
        """
        ...


class NoUsage:
    """A :class:`UsageSource` that knows nothing (request and limit are still reported)."""

    def snapshot(self, plans: Sequence[ClaimPlan]) -> Mapping[tuple[str, str], FractionUsage]:
        """Return no usage."""
        return {}


@dataclass(frozen=True)
class FractionRow:
    """One claim on one GPU: identity, mode and summed request/limit (bytes)."""

    claim_namespace: str
    claim_name: str
    claim_uid: str
    gpu_uuid: str
    compute_mode: str
    request_bytes: int
    limit_bytes: int

    @property
    def labels(self) -> list[str]:
        """Label values in :data:`LABELS` order."""
        return [
            self.claim_namespace,
            self.claim_name,
            self.claim_uid,
            self.gpu_uuid,
            self.compute_mode,
        ]


def fraction_rows(plans: Iterable[ClaimPlan]) -> list[FractionRow]:
    """Pure: one row per (claim, GPU), devices on the same GPU summed (limit capped at the card)."""
    rows = []
    for plan in plans:
        per_gpu: dict[str, list[int]] = {}
        for i, d in enumerate(plan.devices):
            per_gpu.setdefault(d.gpu.uuid, []).append(i)
        for uuid, indexes in per_gpu.items():
            devs = [plan.devices[i] for i in indexes]
            limit = min(sum(d.memory_limit_bytes for d in devs), devs[0].gpu.memory_bytes)
            rows.append(
                FractionRow(
                    claim_namespace=plan.claim.namespace,
                    claim_name=plan.claim.name,
                    claim_uid=plan.claim.uid,
                    gpu_uuid=uuid,
                    compute_mode=devs[0].compute_mode,
                    request_bytes=min(sum(d.memory_request_bytes for d in devs), limit),
                    limit_bytes=limit,
                )
            )
    return rows


class FractionAccounting(Collector):
    """The custom collector (see the module docstring for the metrics).

    Args:
        plans: returns the prepared claims' plans (e.g. ``ClaimPreparation.prepared_plans``).
        source: usage source.
    """

    def __init__(
        self, plans: Callable[[], Sequence[ClaimPlan]], source: UsageSource | None = None
    ) -> None:
        self.plans = plans
        self.source: UsageSource = source or NoUsage()

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        return {
            "request": GaugeMetricFamily(
                "dra_gpu_fraction_claim_memory_request_bytes",
                "Guaranteed GPU memory of a claim on a GPU (soft limit), bytes",
                labels=LABELS,
            ),
            "limit": GaugeMetricFamily(
                "dra_gpu_fraction_claim_memory_limit_bytes",
                "GPU memory ceiling of a claim on a GPU (hard limit), bytes",
                labels=LABELS,
            ),
            "used": GaugeMetricFamily(
                "dra_gpu_fraction_claim_memory_used_bytes",
                "GPU memory in use by a claim on a GPU, bytes",
                labels=LABELS,
            ),
            "clients": GaugeMetricFamily(
                "dra_gpu_fraction_claim_clients",
                "Client processes of a claim on a GPU (MPS clients of its namespace)",
                labels=LABELS,
            ),
            "up": GaugeMetricFamily(
                "dra_gpu_fraction_accounting_up",
                "1 if the usage source answered this scrape, else 0",
            ),
        }

    def describe(self) -> Iterable[Metric]:
        """The metric families (without samples), for registry name checks."""
        return list(self._families().values())

    def collect(self) -> Iterable[Metric]:
        """Build the samples for this scrape."""
        fam = self._families()
        try:
            plans = list(self.plans())
        except Exception as exc:  # a scrape must not crash the exporter
            log.warning("accounting: cannot list prepared claims", error=str(exc))
            fam["up"].add_metric([], 0)
            return list(fam.values())
        up = 1
        try:
            usage = dict(self.source.snapshot(plans))
        except Exception as exc:
            log.warning("accounting: usage source failed", error=str(exc))
            usage, up = {}, 0
        for row in fraction_rows(plans):
            fam["request"].add_metric(row.labels, row.request_bytes)
            fam["limit"].add_metric(row.labels, row.limit_bytes)
            seen = usage.get((row.claim_uid, row.gpu_uuid))
            if seen is not None and seen.used_bytes is not None:
                fam["used"].add_metric(row.labels, seen.used_bytes)
            if seen is not None and seen.clients is not None:
                fam["clients"].add_metric(row.labels, seen.clients)
        fam["up"].add_metric([], up)
        return list(fam.values())


def register_accounting(
    registry: CollectorRegistry,
    plans: Callable[[], Sequence[ClaimPlan]],
    source: UsageSource | None = None,
) -> FractionAccounting:
    """Create the collector and register it in ``registry`` (e.g. ``Metrics.registry``)."""
    collector = FractionAccounting(plans, source)
    registry.register(collector)
    return collector
