"""What every Prepare and Unprepare call does around its claims, in one place.

A call's claims are de-duplicated, share one time budget (``--call-budget``) and fail alone:
the work returns, per claim UID, its result or the exception that failed it, and this shell
turns each exception into the claim's message for the kubelet (logged and counted): a
:data:`~dra_driver.model.errors.CLAIM_ERRORS` error says what to change, anything else is a
bug reported as an internal error with its traceback in the log. A prepare lock not obtained
in time fails every claim of the call with one message.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import structlog

from dra_driver.infra.budget import Budget, lock_timeout_message
from dra_driver.infra.locking import LockTimeout
from dra_driver.infra.metrics import Metrics
from dra_driver.model.errors import CLAIM_ERRORS, ClaimError
from dra_driver.model.plans import ClaimRef

log = structlog.get_logger(__name__)

T = TypeVar("T")


class LockWaitTimeout(ClaimError, TimeoutError):
    """The prepare lock was not obtained within the call's budget (the message says so)."""


def run_call(
    operation: str,
    refs: Iterable[ClaimRef],
    seconds: float,
    metrics: Metrics,
    work: Callable[[list[ClaimRef], Budget], Mapping[str, T | Exception]],
) -> dict[str, T | str]:
    """Run ``work`` for the call's claims within ``seconds``.

    Args:
        operation: ``prepare`` or ``unprepare`` (logs and metrics).
        refs: the claims the kubelet sent (a claim listed twice is handled once).
        seconds: the call's budget.
        metrics: counts failed claims and observes the call's duration.
        work: does the call: its claims (de-duplicated) and budget -> per claim UID a result or
            the exception that failed the claim; it raises only :class:`LockTimeout` (the
            prepare lock, for the whole call).

    Returns:
        Per claim UID the work's result, or the claim's error message (str).
    """
    claims = list({r.uid: r for r in refs}.values())
    started = time.perf_counter()
    call = Budget.of(seconds)
    results: Mapping[str, T | Exception]
    try:
        results = work(claims, call)
    except LockTimeout as exc:
        failed = LockWaitTimeout(lock_timeout_message(call, exc))
        results = dict.fromkeys((r.uid for r in claims), failed)
    out: dict[str, T | str] = {}
    for ref in claims:
        result = results[ref.uid]
        out[ref.uid] = (
            failure(operation, ref, result, metrics) if isinstance(result, Exception) else result
        )
    metrics.observe(operation, len(claims), time.perf_counter() - started)
    return out


def failure(operation: str, ref: ClaimRef, exc: Exception, metrics: Metrics) -> str:
    """The claim's message for ``exc``; logged (with the traceback of a bug) and counted."""
    metrics.errors.labels(operation=operation).inc()
    bound = log.bind(claim_uid=ref.uid, namespace=ref.namespace, name=ref.name)
    if isinstance(exc, CLAIM_ERRORS):
        bound.warning(f"claim {operation} failed", error=str(exc))
        return str(exc)
    bound.error(f"claim {operation} failed unexpectedly", exc_info=exc)
    return f"internal error: {exc!r}"
