"""The tests' :func:`wait_for`: :func:`devtools.waiting.wait_for` with the Kubernetes client's
API errors counted as "not yet", and a timeout that fails the test."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest
from kubernetes.client.exceptions import ApiException

from devtools import waiting

T = TypeVar("T")


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 30.0, every: float = 0.2) -> T:
    """Poll ``fn`` until it returns a truthy value and return it; fail the test with ``what``
    after ``timeout`` seconds (API errors meanwhile are retried and the last one named)."""
    try:
        return waiting.wait_for(what, fn, timeout, every, retry_on=(ApiException,))
    except waiting.WaitTimeout as exc:
        pytest.fail(str(exc))
