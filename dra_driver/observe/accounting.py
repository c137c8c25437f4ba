"""Per-fraction accounting: a Prometheus custom collector over the prepared claims.

For every prepared claim and every GPU it uses (devices of one claim on one GPU are summed,
as the enforcer does), at scrape time:

- ``dra_gpu_fraction_claim_memory_request_bytes``: guaranteed memory (soft limit), bytes;
- ``dra_gpu_fraction_claim_memory_limit_bytes``: ceiling (hard limit), bytes;
- ``dra_gpu_fraction_claim_memory_used_bytes``: GPU memory in use, bytes (only when the
  usage source knows it; never a made-up zero);
- ``dra_gpu_fraction_claim_memory_used_ratio``: used memory over the ceiling (0..1; 1 is
  where the claim's next allocation fails);
- ``dra_gpu_fraction_claim_sm_utilization_percent``: SM utilization of the claim's processes,
  percent of the whole GPU (raw);
- ``dra_gpu_fraction_claim_sm_utilization_normalized_percent``: the same over the claim's
  portion (:func:`portion`), capped at 100: a quarter running flat out shows 100;
- ``dra_gpu_fraction_claim_near_ceiling``: 1 while used memory is at least
  :data:`NEAR_CEILING_RATIO` of the ceiling, else 0;
- ``dra_gpu_fraction_claim_idle_seconds``: seconds since the claim last used SMs on the GPU (or
  had a client), 0 while it does;
- ``dra_gpu_fraction_claim_clients``: client processes (MPS clients of the claim's namespace);
- ``dra_gpu_fraction_accounting_up``: 1 when the last usage sample is fresh and its source
  answered, else 0.

Labels: ``claim_namespace``, ``claim_name``, ``claim_uid``, ``gpu_uuid``, ``compute_mode``.
Usage is never read at scrape time: :class:`~dra_driver.observe.usagesampler.UsageSampler`
reads the usage source (:class:`UsageSource`; the MPS/NVML one is
:mod:`dra_driver.observe.usage`, :class:`NoUsage` knows nothing) at a bounded rate in its own
thread, and a scrape reports its last sample; a slow or failing NVML delays neither a scrape
nor a Prepare.

Normalization (:func:`portion`): an sm-sharing claim's SM utilization is divided by its active
thread percentage (the SM ceiling MPS holds it to), a time-slicing claim's by its guaranteed
memory over the card's memory (the portion it bought: 1/4 for a quarter), since time slicing
caps no SMs; capped at 100 as KAI's gpu-fractioning ``..._normalized`` metric is, so that
dashboards built for it read the same. A time-slicing claim can exceed its portion while its
neighbours are idle: the raw metric shows by how much.
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
        sm_percent: SM utilization of its processes, percent of the whole GPU.
    """

    used_bytes: int | None = None
    clients: int | None = None
    sm_percent: float | None = None


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
    """One claim on one GPU: identity, mode, summed request/limit (bytes), the card's memory
    (bytes) and the active thread percentage (sm-sharing; None otherwise)."""

    claim_namespace: str
    claim_name: str
    claim_uid: str
    gpu_uuid: str
    compute_mode: str
    request_bytes: int
    limit_bytes: int
    gpu_memory_bytes: int = 0
    threads: int | None = None

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
                    gpu_memory_bytes=devs[0].gpu.memory_bytes,
                    threads=_threads(d.active_thread_percentage for d in devs),
                )
            )
    return rows


def _threads(values: Iterable[int | None]) -> int | None:
    """Active thread percentage of several devices on one GPU (one namespace: their sum, at
    most 100), None when none has one."""
    known = [v for v in values if v is not None]
    return min(sum(known), 100) if known else None


NEAR_CEILING_RATIO = 0.9
"""Used memory at or above this share of the ceiling makes a fraction "near its ceiling": its
next allocations are about to fail."""


def portion(row: FractionRow) -> float | None:
    """Pure: the part of the GPU a claim bought, 0..1, for normalizing SM utilization: the
    active thread percentage / 100 in sm-sharing, else guaranteed memory / card memory; None
    when it bought nothing (admin access, or a card of unknown size)."""
    if row.threads is not None:
        return row.threads / 100
    if row.request_bytes <= 0 or row.gpu_memory_bytes <= 0:
        return None
    return min(row.request_bytes / row.gpu_memory_bytes, 1.0)


def normalized_sm(raw_percent: float, row: FractionRow) -> float | None:
    """Pure: ``raw_percent`` (of the whole GPU) over the claim's :func:`portion`, capped at
    100; None when the claim has no portion."""
    share = portion(row)
    if share is None:
        return None
    return min(raw_percent / share, 100.0)


def near_ceiling(used_bytes: int, row: FractionRow) -> bool:
    """Pure: whether ``used_bytes`` is at least :data:`NEAR_CEILING_RATIO` of the ceiling."""
    return row.limit_bytes > 0 and used_bytes >= NEAR_CEILING_RATIO * row.limit_bytes


class UsageView(Protocol):
    """What the collector reads: the last usage sample and the idle clocks
    (:class:`~dra_driver.observe.usagesampler.UsageSampler`)."""

    def usage(self) -> Mapping[tuple[str, str], FractionUsage]:
        """Usage of the last sample by (claim UID, GPU UUID) ({} before the first)."""
        ...

    def fresh(self) -> bool:
        """Whether the last sample answered and is recent."""
        ...

    def idle_seconds(self, key: tuple[str, str]) -> float | None:
        """Seconds the fraction has been idle (0 when active; None when unknown)."""
        ...


def _gauge(name: str, text: str, labels: Sequence[str] = LABELS) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, labels=list(labels))


class FractionAccounting(Collector):
    """The custom collector (see the module docstring for the metrics).

    Args:
        plans: returns the prepared claims' plans (e.g. ``ClaimPreparation.prepared_plans``).
        view: the usage sampler whose last sample each scrape reports.
    """

    def __init__(self, plans: Callable[[], Sequence[ClaimPlan]], view: UsageView) -> None:
        self.plans = plans
        self.view = view

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        p = "dra_gpu_fraction_claim_"
        return {
            "request": _gauge(
                p + "memory_request_bytes",
                "Guaranteed GPU memory of a claim on a GPU (soft limit), bytes",
            ),
            "limit": _gauge(
                p + "memory_limit_bytes",
                "GPU memory ceiling of a claim on a GPU (hard limit), bytes",
            ),
            "used": _gauge(p + "memory_used_bytes", "GPU memory in use by a claim on a GPU, bytes"),
            "ratio": _gauge(
                p + "memory_used_ratio", "GPU memory in use by a claim over its ceiling, 0..1"
            ),
            "near": _gauge(
                p + "near_ceiling",
                f"1 while a claim uses at least {NEAR_CEILING_RATIO:g} of its memory ceiling",
            ),
            "sm": _gauge(
                p + "sm_utilization_percent",
                "SM utilization of a claim's processes, percent of the whole GPU",
            ),
            "sm_norm": _gauge(
                p + "sm_utilization_normalized_percent",
                "SM utilization of a claim over the portion it bought, percent (max 100)",
            ),
            "idle": _gauge(
                p + "idle_seconds", "Seconds since a claim last used SMs on a GPU (0 while busy)"
            ),
            "clients": _gauge(
                p + "clients", "Client processes of a claim on a GPU (MPS clients of its namespace)"
            ),
            "up": _gauge(
                "dra_gpu_fraction_accounting_up",
                "1 if the last usage sample is recent and its source answered, else 0",
                (),
            ),
        }

    def describe(self) -> Iterable[Metric]:
        """The metric families (without samples), for registry name checks."""
        return list(self._families().values())

    def collect(self) -> Iterable[Metric]:
        """Build the samples for this scrape from the last usage sample."""
        fam = self._families()
        try:
            plans = list(self.plans())
        except Exception as exc:  # a scrape must not crash the exporter
            log.warning("accounting: cannot list prepared claims", error=str(exc))
            fam["up"].add_metric([], 0)
            return list(fam.values())
        usage = self.view.usage()
        for row in fraction_rows(plans):
            key = (row.claim_uid, row.gpu_uuid)
            fam["request"].add_metric(row.labels, row.request_bytes)
            fam["limit"].add_metric(row.labels, row.limit_bytes)
            seen = usage.get(key)
            if seen is None:
                continue
            if seen.used_bytes is not None:
                fam["used"].add_metric(row.labels, seen.used_bytes)
                if row.limit_bytes > 0:
                    fam["ratio"].add_metric(row.labels, seen.used_bytes / row.limit_bytes)
                fam["near"].add_metric(row.labels, int(near_ceiling(seen.used_bytes, row)))
            if seen.sm_percent is not None:
                fam["sm"].add_metric(row.labels, seen.sm_percent)
                norm = normalized_sm(seen.sm_percent, row)
                if norm is not None:
                    fam["sm_norm"].add_metric(row.labels, norm)
            idle = self.view.idle_seconds(key)
            if idle is not None:
                fam["idle"].add_metric(row.labels, idle)
            if seen.clients is not None:
                fam["clients"].add_metric(row.labels, seen.clients)
        fam["up"].add_metric([], int(self.view.fresh()))
        return list(fam.values())


def register_accounting(
    registry: CollectorRegistry, plans: Callable[[], Sequence[ClaimPlan]], view: UsageView
) -> FractionAccounting:
    """Create the collector and register it in ``registry`` (e.g. ``Metrics.registry``)."""
    collector = FractionAccounting(plans, view)
    registry.register(collector)
    return collector
