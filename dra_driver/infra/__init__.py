"""infra: small effect helpers with no GPU or claim knowledge (atomic files, commands,
locks, time budgets, logs, metrics registry, API clients).
May import: model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dra_driver.faces import lazy_face

if TYPE_CHECKING:
    from dra_driver.infra import budget, logs
    from dra_driver.infra.atomicfile import private_dir, record_state, write_atomic
    from dra_driver.infra.budget import (
        CLIENT_CHECK_BUDGET_S,
        DEFAULT_CALL_BUDGET_S,
        HEALTH_CHECK_BUDGET_S,
        KUBELET_CALL_TIMEOUT_S,
        Budget,
    )
    from dra_driver.infra.kubeconfig import api_client
    from dra_driver.infra.locking import PrepareLock
    from dra_driver.infra.logs import configure
    from dra_driver.infra.metrics import Metrics
    from dra_driver.infra.rawapi import ApiClient
    from dra_driver.infra.runner import SubprocessRunner

__all__ = [
    "logs",
    "budget",
    "ApiClient",
    "Budget",
    "CLIENT_CHECK_BUDGET_S",
    "DEFAULT_CALL_BUDGET_S",
    "HEALTH_CHECK_BUDGET_S",
    "KUBELET_CALL_TIMEOUT_S",
    "Metrics",
    "PrepareLock",
    "SubprocessRunner",
    "api_client",
    "configure",
    "private_dir",
    "record_state",
    "write_atomic",
]

__getattr__ = lazy_face(__name__, __file__)
