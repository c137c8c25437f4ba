"""MPS outages, made visible: an event on the claim's pods, a claim condition and a metric.

When the MPS health check finds a prepared claim cut off its server or namespace
(:mod:`dra_driver.enforce.rules.outages`: the server process was replaced, or the namespace
re-created), the driver has already re-created them with the claim's limits, but the claim's
running CUDA processes lost their connection and do not reconnect: their containers must be
restarted. :class:`MpsOutageReport` receives those outages (:meth:`MpsOutageReport.report`,
the enforcer's listener) and, per claim:

- posts a ``Warning`` event on each pod that uses the claim, reason ``MpsServerRestarted`` or
  ``MpsNamespaceRecreated`` (:class:`~dra_driver.observe.podevents.PodEvents`);
- counts ``dra_gpu_fraction_mps_server_restarts_total{gpu,mode}`` once per replaced server;
- has the claim's MPS devices carry ``MpsClientsConnected=False`` (same reason) while a
  container of the claim that was created before the outage still runs, and ``True`` (reason
  ``ClientsReconnected``) once none does (:meth:`MpsOutageReport.check`, every few seconds).

Which containers are still to restart is an injected predicate, :data:`StaleConsumers`; the
plugin passes :meth:`dra_driver.observe.consumers.ConsumerWatch.running_before`: the claim's
consumers that the consumer gate admitted before the outage and whose process still runs (a
container restarted under a new ID, or a finished init container, no longer counts).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

import structlog

from dra_driver.enforce.clientguard import ClientsTerminated
from dra_driver.enforce.rules.outages import SERVER_RESTARTED, MpsOutage
from dra_driver.infra.metrics import Metrics
from dra_driver.model.plans import ClaimPlan, ClaimRef
from dra_driver.model.textlimits import shorten
from dra_driver.observe.claimstatus import ClientsCondition

log = structlog.get_logger(__name__)

CLIENTS_OVER_CAP = "MpsClientsOverCap"
"""Reason of the event on a claim's pods when its MPS clients beyond its cap were ended."""

RECONNECTED = "ClientsReconnected"
"""Reason of ``MpsClientsConnected=True`` after an outage."""

StaleConsumers = Callable[[str, float], list[str]]
"""``(claim UID, since) -> container IDs``: the claim's containers created before ``since``
(seconds since the epoch) that still run, i.e. that lost their MPS connection; ``[]`` once
none is left."""


class ClaimEvents(Protocol):
    """Posts a Warning event on the pods of a claim (:class:`~.podevents.PodEvents`)."""

    def claim_event(self, claim: ClaimRef, reason: str, message: str) -> None:
        """Queue the event; returns at once."""
        ...


def over_cap_text(gpu_uuid: str, pids: Sequence[int], cap: int) -> str:
    """Pure: the event message when a claim's MPS clients beyond its cap were terminated."""
    listed = ", ".join(str(p) for p in pids)
    return shorten(
        f"{len(pids)} MPS client process(es) of this claim on GPU {gpu_uuid} were terminated (PIDs "
        f"{listed}): the claim may hold at most {cap} at once, its share of the MPS server's "
        'client table (docs/enforcement.md, "Client cap"); open fewer CUDA processes or '
        "contexts, or ask for a larger fraction"
    )


def event_on_terminations(events: ClaimEvents) -> ClientsTerminated:
    """The enforcer's ``report_terminations`` listener: a Warning event
    (:data:`CLIENTS_OVER_CAP`) on the claim's pods."""

    def listener(claim: ClaimRef, gpu_uuid: str, pids: list[int], cap: int) -> None:
        events.claim_event(claim, CLIENTS_OVER_CAP, over_cap_text(gpu_uuid, pids, cap))

    return listener


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def outage_text(outage: MpsOutage) -> str:
    """Pure: what happened and what to do, for the event on the claim's pods (one paragraph)."""
    gpus = ", ".join(f"GPU {i} ({uuid})" for i, uuid in outage.gpus)
    when = _stamp(outage.at)
    if outage.reason == SERVER_RESTARTED:
        what = (
            f"the MPS server {outage.server} of {gpus} ({outage.mode}) was restarted (PID "
            f"{outage.old_pid} -> {outage.new_pid}), seen at {when}: CUDA processes of this "
            "claim that were running lost their MPS connection and do not reconnect"
        )
    else:
        what = (
            f"the MPS namespace {outage.namespace} of this claim on server {outage.server} "
            f"({gpus}, {outage.mode}) was re-created, seen at {when}: containers started "
            "before then still see the old namespace directory and cannot reach MPS"
        )
    return (
        f"{what}. The namespace is back with the claim's limits; restart the containers that "
        "were running then (delete the pod, or let its controller replace it) to reconnect"
    )


def clients_condition(outage: MpsOutage, stale: Sequence[str], now: float) -> ClientsCondition:
    """Pure: ``MpsClientsConnected`` after ``outage``, with ``stale`` (container IDs) still to
    restart: ``False`` with the outage's reason since the outage while any is left, else
    ``True`` since ``now`` (seconds since the epoch)."""
    if stale:
        left = shorten(", ".join(c[:12] for c in stale), 300)
        return ClientsCondition(
            False,
            outage.reason,
            f"{outage_text(outage)}; containers still to restart: {left}",
            _stamp(outage.at),
        )
    return ClientsCondition(
        True,
        RECONNECTED,
        f"no container of this claim that ran before the MPS outage seen at "
        f"{_stamp(outage.at)} ({outage.reason}, server {outage.server}) is left: new "
        "containers connect to the new server under the claim's limits",
        _stamp(now),
    )


@dataclass
class _Open:
    outage: MpsOutage
    shown: ClientsCondition | None = None


def worst(open_: _Open | None, new: MpsOutage) -> MpsOutage:
    """Pure: the outage a claim's condition follows when ``new`` comes while an earlier one is
    open (its containers not all restarted yet): ``new``'s time (containers admitted before it
    are still cut off), and the earlier reason when that was a server restart, which a
    re-created namespace seen by a later check is part of (one daemon restart shows as both,
    in either order, depending on which check sees it first)."""
    if open_ is None or (open_.shown is not None and open_.shown.connected):
        return new
    if open_.outage.reason == SERVER_RESTARTED:
        return replace(new, reason=SERVER_RESTARTED)
    return new


class MpsOutageReport:
    """Reports MPS outages (see the module). Thread-safe: :meth:`report` runs in the MPS
    supervision, :meth:`check` in its own loop.

    Args:
        events: posts the pods' events.
        metrics: counts ``dra_gpu_fraction_mps_server_restarts_total``.
        stale: the claim's containers still to restart (:data:`StaleConsumers`).
        on_condition: receives a claim's plan and its new ``MpsClientsConnected`` condition
            (the claim status writer's ``flag_clients``); must return at once.
        clock: ``time.time``.
    """

    def __init__(
        self,
        events: ClaimEvents,
        metrics: Metrics,
        stale: StaleConsumers,
        on_condition: Callable[[ClaimPlan, ClientsCondition], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.events = events
        self.metrics = metrics
        self.stale = stale
        self.on_condition = on_condition or (lambda plan, condition: None)
        self.clock = clock
        self._lock = threading.Lock()
        self._claims: dict[str, _Open] = {}

    def report(self, outages: Sequence[MpsOutage]) -> None:
        """The outages of one health check (the enforcer's listener): one event per outage on
        its claim's pods, one count per replaced server and GPU, each claim's condition
        re-evaluated at the next :meth:`check`. Returns at once."""
        counted = set()
        for o in outages:
            if o.reason == SERVER_RESTARTED and (o.mode, o.server) not in counted:
                counted.add((o.mode, o.server))
                for _, uuid in o.gpus:
                    self.metrics.mps_server_restarts.labels(gpu=uuid, mode=o.mode).inc()
            self.events.claim_event(o.claim, o.reason, outage_text(o))
            with self._lock:
                self._claims[o.claim.uid] = _Open(worst(self._claims.get(o.claim.uid), o))

    def check(self, plans: Iterable[ClaimPlan]) -> None:
        """Re-evaluate the condition of each prepared claim that had an outage (``plans``: the
        prepared claims) and pass it on when it changed; forget claims no longer prepared."""
        prepared = {p.claim.uid: p for p in plans}
        with self._lock:
            for uid in [u for u in self._claims if u not in prepared]:
                del self._claims[uid]
            todo = list(self._claims.items())
        for uid, entry in todo:
            o = entry.outage
            condition = clients_condition(o, self.stale(uid, o.at), self.clock())
            if entry.shown is not None and entry.shown[:3] == condition[:3]:
                continue
            with self._lock:
                if self._claims.get(uid) is not entry:
                    continue  # a newer outage came meanwhile
                entry.shown = condition
            ref = o.claim
            if condition.connected:
                log.info(
                    "MPS clients of the claim reconnected: no container that ran before the "
                    "outage is left",
                    claim_uid=uid,
                    namespace=ref.namespace,
                    name=ref.name,
                    gpu=[u for _, u in o.gpus],
                    reason=o.reason,
                )
            self.on_condition(prepared[uid], condition)
