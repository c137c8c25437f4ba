"""Time budgets: every kubelet call, start-up and health check ends in bounded time.

The kubelet gives each NodePrepareResources/NodeUnprepareResources call 45 s
(k8s.io/kubernetes ``pkg/kubelet/cm/dra/plugin``, ``defaultClientCallTimeout``) and then
gives up, while the plugin would keep working. So each call gets a :class:`Budget` well under
that: claim reads, the wait for the prepare lock and every MPS control command take their
timeouts from what is left of it. The budget of the running call is kept in a context
variable (:func:`within`, :func:`current`), so that the MPS control commands deep in the
enforcer honour it without every layer passing it on; it is per thread, and threads started
for a call get their part explicitly (as the claim readers do).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from dra_driver.model.errors import PrepareError

KUBELET_CALL_TIMEOUT_S = 45.0
"""How long the kubelet waits for one DRA call (``defaultClientCallTimeout``)."""
DEFAULT_CALL_BUDGET_S = 30.0
"""Default budget of one Prepare/Unprepare call, seconds (``--call-budget``)."""
STARTUP_BUDGET_S = 5.0
"""Budget of re-applying prepared claims at start-up; what is left is retried by health checks."""
HEALTH_CHECK_BUDGET_S = 10.0
"""Budget of one MPS health check (it holds the enforcer, so Prepare would wait for it)."""
SCRAPE_BUDGET_S = 5.0
"""Budget of the MPS reads behind one metrics scrape."""
CLIENT_CHECK_BUDGET_S = 5.0
"""Budget of one check of the claims' MPS clients against their caps (holds no lock)."""


@dataclass
class Budget:
    """What is left of ``seconds`` from the moment the budget was made.

    Attributes:
        seconds: the whole budget, seconds (named in error messages).
        ends: when it ends, on ``clock``'s scale (``time.monotonic`` seconds).
        unresponsive: names of things (e.g. an MPS daemon's pipe directory) that already ran
            out of time within this budget; later commands to them fail at once instead of
            spending the rest of the budget on the same hang.
    """

    seconds: float
    ends: float
    unresponsive: set[str] = field(default_factory=set)
    clock: Callable[[], float] = time.monotonic

    @classmethod
    def of(cls, seconds: float, clock: Callable[[], float] = time.monotonic) -> Budget:
        """A budget of ``seconds`` starting now."""
        return cls(seconds=seconds, ends=clock() + seconds, clock=clock)

    def remaining(self) -> float:
        """Seconds left (0 when spent, never negative)."""
        return max(0.0, self.ends - self.clock())

    def spent(self) -> bool:
        """Whether no time is left."""
        return self.remaining() <= 0.0

    def limit(self, timeout: float) -> float:
        """``timeout`` cut to what is left (seconds; 0 when spent)."""
        return min(timeout, self.remaining())

    def text(self) -> str:
        """The whole budget for messages, e.g. ``"30 s"``."""
        return f"{self.seconds:g} s"


_current: ContextVar[Budget | None] = ContextVar("dra_driver_budget", default=None)


def current() -> Budget | None:
    """The budget of the work running in this thread, or None (no budget: own timeouts)."""
    return _current.get()


@contextmanager
def within(budget: Budget) -> Iterator[Budget]:
    """Run the ``with`` block under ``budget`` (in this thread); restores the previous one."""
    token = _current.set(budget)
    try:
        yield budget
    finally:
        _current.reset(token)


def lock_timeout_message(call: Budget, exc: Exception) -> str:
    """A call's claims' error when the prepare lock was not obtained within its budget."""
    return (
        f"waiting for the prepare lock did not finish within {call.text()} (the call's "
        f"budget, --call-budget): {exc}; the kubelet retries"
    )


def check_started(call: Budget, doing: str, claim: str) -> None:
    """Raise when the call's budget is spent before the node-side work on ``claim``
    (``namespace/name``) starts.

    Raises:
        PrepareError: naming the claim and the budget (the kubelet retries).
    """
    if call.spent():
        raise PrepareError(
            f"{doing} claim {claim} did not start within {call.text()} (the "
            "call's budget, --call-budget, was spent on the claims before it); the kubelet "
            "retries"
        )
