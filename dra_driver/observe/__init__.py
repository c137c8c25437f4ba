"""observe: what the plugin reports (claim device status, accounting metrics, MPS outages,
pod events, root MPS clients).
May import: model, infra, prepare, enforce, enforce.rules, enforce.mps, _proto."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dra_driver.faces import lazy_face

if TYPE_CHECKING:
    from dra_driver.observe.accounting import NoUsage, UsageSource, register_accounting
    from dra_driver.observe.claimstatuswriter import ClaimStatusWriter
    from dra_driver.observe.consumers import ConsumerWatch
    from dra_driver.observe.mpsoutages import MpsOutageReport, event_on_terminations
    from dra_driver.observe.podevents import PodEvents
    from dra_driver.observe.usage import MpsUsageSource
    from dra_driver.observe.usagesampler import UsageSampler

__all__ = [
    "ClaimStatusWriter",
    "ConsumerWatch",
    "MpsOutageReport",
    "MpsUsageSource",
    "NoUsage",
    "PodEvents",
    "UsageSampler",
    "UsageSource",
    "event_on_terminations",
    "register_accounting",
]

__getattr__ = lazy_face(__name__, __file__)
