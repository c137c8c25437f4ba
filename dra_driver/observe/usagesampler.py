"""Reads the fractions' usage at a bounded rate, in its own thread, for the metrics.

A scrape never asks MPS or NVML: it reports the last :class:`UsageSample`, taken every
``interval_s`` seconds (``--usage-interval``) by :meth:`UsageSampler.run`. The sampler also
keeps, per claim and GPU, since when the fraction is idle (:func:`is_idle`), and logs a warning
once per episode when a fraction comes near its memory ceiling
(:func:`~dra_driver.observe.accounting.near_ceiling`: its next allocations are about to fail)
or has been idle for ``idle_warn_s`` (it holds a share of the card for nothing).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from dra_driver.model.defaults import USAGE_INTERVAL_S
from dra_driver.model.plans import ClaimPlan
from dra_driver.observe.accounting import (
    FractionRow,
    FractionUsage,
    UsageSource,
    fraction_rows,
    near_ceiling,
)

log = structlog.get_logger(__name__)

IDLE_WARN_S = 1800.0
"""Default seconds a fraction may stay idle before the plugin warns about it."""
STALE_INTERVALS = 3
"""A sample older than this many intervals no longer counts as fresh (accounting_up 0)."""

Key = tuple[str, str]
"""(claim UID, GPU UUID)."""


@dataclass(frozen=True)
class UsageSample:
    """One reading of every prepared fraction's usage.

    Attributes:
        taken_at: monotonic seconds when it was taken.
        usage: usage by (claim UID, GPU UUID); a missing key is unknown.
        answered: whether the usage source answered (else ``usage`` is empty).
    """

    taken_at: float
    usage: Mapping[Key, FractionUsage]
    answered: bool


def is_idle(usage: FractionUsage) -> bool | None:
    """Pure: a fraction is idle when no client is attached, or when its SM utilization is
    known and zero; None when neither is known."""
    if usage.clients == 0:
        return True
    if usage.sm_percent is not None:
        return usage.sm_percent <= 0
    return None if usage.clients is None else False


class UsageSampler:
    """See the module docstring.

    Args:
        plans: returns the prepared claims' plans.
        source: where usage comes from.
        interval_s: seconds between samples.
        idle_warn_s: idle seconds before the warning.
        clock: monotonic clock (injectable).
    """

    def __init__(
        self,
        plans: Callable[[], Sequence[ClaimPlan]],
        source: UsageSource,
        interval_s: float = USAGE_INTERVAL_S,
        idle_warn_s: float = IDLE_WARN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plans = plans
        self.source = source
        self.interval_s = interval_s
        self.idle_warn_s = idle_warn_s
        self.clock = clock
        self._lock = threading.Lock()
        self._last: UsageSample | None = None
        self._idle_since: dict[Key, float] = {}
        self._warned: set[tuple[str, Key]] = set()

    def latest(self) -> UsageSample | None:
        """The last sample (None before the first)."""
        with self._lock:
            return self._last

    def usage(self) -> Mapping[Key, FractionUsage]:
        """Usage of the last sample ({} before the first)."""
        last = self.latest()
        return {} if last is None else last.usage

    def fresh(self) -> bool:
        """Whether the last sample answered and is at most :data:`STALE_INTERVALS` old."""
        last = self.latest()
        if last is None or not last.answered:
            return False
        return self.clock() - last.taken_at <= STALE_INTERVALS * self.interval_s

    def idle_seconds(self, key: Key) -> float | None:
        """Seconds the fraction ``key`` has been idle (0 when active; None when unknown)."""
        with self._lock:
            if self._last is None or key not in self._last.usage:
                return None
            since = self._idle_since.get(key)
            return 0.0 if since is None else max(self._last.taken_at - since, 0.0)

    def sample_once(self) -> UsageSample:
        """Take a sample now (any error of the source is logged; the sample then knows
        nothing and is not ``answered``)."""
        plans = list(self.plans())
        try:
            usage, answered = dict(self.source.snapshot(plans)), True
        except Exception as exc:  # the sampler thread must outlive any source failure
            log.warning("accounting: usage source failed", error=str(exc)[:300])
            usage, answered = {}, False
        now = self.clock()
        rows = {(r.claim_uid, r.gpu_uuid): r for r in fraction_rows(plans)}
        with self._lock:
            self._last = UsageSample(now, usage, answered)
            for key in list(self._idle_since):
                if key not in rows:
                    del self._idle_since[key]
            self._warned = {w for w in self._warned if w[1] in rows}
            for key, row in rows.items():
                seen = usage.get(key)
                if seen is not None:
                    self._follow(key, row, seen, now)
        return self._last

    def _follow(self, key: Key, row: FractionRow, seen: FractionUsage, now: float) -> None:
        idle = is_idle(seen)
        if idle is False:
            self._idle_since.pop(key, None)
            self._warned.discard(("idle", key))
        elif idle:
            since = self._idle_since.setdefault(key, now)
            if now - since >= self.idle_warn_s and ("idle", key) not in self._warned:
                self._warned.add(("idle", key))
                log.warning(
                    "fraction idle: it holds a share of the GPU and has used no SMs",
                    **_labels(row),
                    idle_seconds=round(now - since),
                )
        full = seen.used_bytes is not None and near_ceiling(seen.used_bytes, row)
        if not full:
            self._warned.discard(("ceiling", key))
        elif ("ceiling", key) not in self._warned:
            self._warned.add(("ceiling", key))
            log.warning(
                "fraction near its memory ceiling: its next GPU allocations are about to fail",
                **_labels(row),
                used_bytes=seen.used_bytes,
                limit_bytes=row.limit_bytes,
            )

    def run(self, stop: threading.Event) -> None:
        """Sample every ``interval_s`` seconds until ``stop`` is set."""
        while not stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # e.g. the plans could not be listed
                log.warning("accounting: usage sample failed", error=str(exc)[:300])
            stop.wait(self.interval_s)


def _labels(row: FractionRow) -> dict[str, str]:
    return {
        "claim_uid": row.claim_uid,
        "namespace": row.claim_namespace,
        "name": row.claim_name,
        "gpu": row.gpu_uuid,
    }
