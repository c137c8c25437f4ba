"""Waiting for a condition: one poll loop for the tools and the tests (tests/support/waiting.py
turns its timeout into a test failure)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """The condition did not hold in time; the message says what was awaited and the last
    error the condition raised, if any."""


def wait_for(
    what: str,
    fn: Callable[[], T | None],
    timeout: float = 30.0,
    every: float = 0.2,
    retry_on: tuple[type[Exception], ...] = (),
) -> T:
    """Call ``fn`` every ``every`` seconds until it returns something truthy, and return that.

    Args:
        what: what is awaited, for the timeout's message.
        fn: the condition.
        timeout: seconds before giving up.
        every: seconds between two calls.
        retry_on: exceptions of ``fn`` that count as "not yet" (e.g. an API error while a
            server starts); the last one is named in the timeout's message.

    Raises:
        WaitTimeout: ``fn`` did not return something truthy within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            value = fn()
        except retry_on as exc:
            value, last = None, f" (last error: {' '.join(str(exc).split())[:300]})"
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}{last}")
        time.sleep(every)
