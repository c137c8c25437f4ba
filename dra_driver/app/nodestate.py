"""The running plugin's view of its node: the current inventory and devices, their health and
taints, the MPS health check that feeds them, and the check of the claims' MPS clients."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import structlog

from dra_driver.config import NodeConfig
from dra_driver.enforce import FractionEnforcer
from dra_driver.gpus import GpuSource
from dra_driver.infra import (
    CLIENT_CHECK_BUDGET_S,
    HEALTH_CHECK_BUDGET_S,
    Budget,
    Metrics,
    budget,
    record_state,
)
from dra_driver.model.devices import DeviceStatus, PublishedDevice
from dra_driver.model.gpu import GpuSourceError, Inventory, driver_change
from dra_driver.model.plans import ClaimPlan
from dra_driver.publish import DeviceTaint, TaintMemory, device_health, offered_devices

log = structlog.get_logger(__name__)

CLIENT_CHECK_INTERVAL_S = 2.0
"""Seconds between two checks of the claims' MPS clients against their caps: a flood holds the
server's client table for at most about this long (``docs/enforcement.md``, "Client cap")."""


class NodeState:
    """The node's current inventory and published devices, refreshed by :meth:`refresh`."""

    def __init__(
        self,
        source: GpuSource,
        config: NodeConfig,
        on_driver: Callable[[str | None], None] = lambda problem: None,
    ) -> None:
        self.source = source
        self.config = config
        self.on_driver = on_driver
        """Called with :attr:`driver_problem` after the first discovery and whenever it
        changes (the plugin records it for ``dra-driver status``)."""
        self._discovered = False
        self._lock = threading.Lock()
        self.inventory = Inventory(gpus=())
        self._devices: dict[str, PublishedDevice] = {}
        self._seen: dict[str, PublishedDevice] = {}
        self.unhealthy_gpus: dict[str, str] = {}
        """GPU UUID -> reason, from the enforcer's last health check."""
        self.wake = threading.Event()
        """Set when the set of unhealthy GPUs changes: the publisher republishes at once."""
        self._taints = TaintMemory()
        self.driver_problem: str | None = None
        """Why the last discovery failed as a whole (the NVIDIA driver not loaded: NVML
        cannot be initialised), or None; the node then offers no GPU."""
        self._first: Inventory | None = None
        self.driver_changed: str | None = None
        """How the NVIDIA driver changed since the first discovery that worked (a GPU with
        another device minor, another driver version: :func:`driver_change`), or None; the
        plugin then restarts (:func:`wait_for_driver`)."""

    def refresh(self) -> None:
        """Re-discover GPUs and recompute the published devices. A discovery that fails as a
        whole (:class:`~dra_driver.model.gpu.GpuSourceError`: no NVIDIA driver) leaves the node
        with no GPU and :attr:`driver_problem` set (logged once per change), so the plugin
        keeps serving Unprepare and publishes no device until the driver is back."""
        before = self.driver_problem
        try:
            inventory = self.source.discover()
        except GpuSourceError as exc:
            if str(exc) != before:
                log.error(
                    "no GPU can be discovered: publishing no devices and refusing Prepare until "
                    "the NVIDIA driver answers; Unprepare still works",
                    error=str(exc),
                )
            inventory, self.driver_problem = Inventory(gpus=()), str(exc)
        else:
            if before is not None:
                log.info("the NVIDIA driver answers again", gpus=len(inventory.gpus))
            self.driver_problem = None
            if self._first is None:
                self._first = inventory
            elif self.driver_changed is None:
                self.driver_changed = driver_change(self._first, inventory)
                if self.driver_changed is not None:
                    log.error(
                        "the NVIDIA driver changed under the plugin", change=self.driver_changed
                    )
        if self.driver_problem != before or not self._discovered:
            self._discovered = True
            self.on_driver(self.driver_problem)
        devices = {d.name: d for d in offered_devices(inventory, self.config)}
        with self._lock:
            self.inventory, self._devices = inventory, devices
            self._seen.update(devices)

    def present_uuids(self) -> list[str]:
        """UUIDs of the GPUs the last discovery found."""
        with self._lock:
            return [g.uuid for g in self.inventory.gpus]

    def devices(self) -> Mapping[str, PublishedDevice]:
        """The current published devices by name."""
        with self._lock:
            return self._devices

    def health(self) -> Mapping[str, DeviceStatus]:
        """Health of every device published since start (see
        :mod:`dra_driver.publish.devicehealth`)."""
        with self._lock:
            return device_health(self._devices, self._seen, self.unhealthy_gpus)

    def published(self, driver: str) -> tuple[Inventory, Mapping[str, DeviceTaint]]:
        """The inventory to publish (lost GPUs kept) and its unhealthy GPUs' taints; logs each
        GPU whose taint appears or goes (``GPU tainted`` / ``GPU taint removed``)."""
        with self._lock:
            seen = (d.gpu for d in self._seen.values())
            before = dict(self._taints.taints)
            inventory, taints = self._taints.update(
                driver, self.inventory, seen, self.unhealthy_gpus
            )
        for uuid in taints.keys() - before.keys():
            detail = self.unhealthy_gpus.get(uuid, "not found by the last discovery")
            log.warning("GPU tainted", gpu=uuid, taint=taints[uuid].value, reason=detail)
        for uuid in before.keys() - taints.keys():
            log.info("GPU taint removed", gpu=uuid, taint=before[uuid].value)
        return inventory, taints


DRIVER_STATE_FILE = "gpu-driver.json"
"""Under the state directory: whether the last discovery reached the NVIDIA driver
(``{"available": bool, "problem": str | null, "since": RFC 3339}``), for ``dra-driver
status``."""


def write_driver_state(state_dir: str, problem: str | None) -> None:
    """Record the driver's state in :data:`DRIVER_STATE_FILE` (owner-only); a write that
    fails is logged, never raised (discovery goes on)."""
    record_state(
        Path(state_dir) / DRIVER_STATE_FILE,
        {"available": problem is None, "problem": problem},
        "GPU driver state",
    )


DRIVER_CHECK_INTERVAL_S = 10.0
"""Seconds between two discoveries while the NVIDIA driver does not answer."""


def wait_for_driver(
    state: NodeState,
    started_without: bool,
    restart: Callable[[str], None],
    stop: threading.Event,
    interval: float = DRIVER_CHECK_INTERVAL_S,
) -> None:
    """While the node has no NVIDIA driver (:attr:`NodeState.driver_problem`), discover again
    every ``interval`` seconds; once discovery works after it failed (at start, when
    ``started_without``, or later), call ``restart`` with the reason and return: a plugin that
    started without GPUs computed its enforcement tiers, MPS checks and socket paths for none,
    and a reloaded driver may have renumbered its device nodes, so a fresh start is what makes
    every later Prepare use the new state (and rewrites the CDI specs of prepared claims for
    the new device nodes). Likewise when a discovery finds the driver changed without a failed
    one between (:attr:`NodeState.driver_changed`: reloaded between two discoveries)."""
    failed = started_without
    while not stop.wait(interval):
        if state.driver_changed is not None:
            restart(f"the NVIDIA driver changed ({state.driver_changed})")
            return
        if state.driver_problem is None and not failed:
            continue  # the publisher's own discoveries set it when the driver goes
        if state.driver_problem is not None:
            failed = True
            state.refresh()
        if failed and state.driver_problem is None:
            restart("the NVIDIA driver answers again after discovery failed")
            return


def repeat(step: Callable[[], bool], stop: threading.Event, interval: float) -> None:
    """Call ``step`` every ``interval`` seconds until ``stop`` is set or it returns False (it
    has nothing to do on this node)."""
    while not stop.wait(interval):
        if not step():
            return


def supervise(
    enforcer: FractionEnforcer, state: NodeState, stop: threading.Event, interval: float = 10.0
) -> None:
    """Check (and repair) MPS every ``interval`` seconds until ``stop`` is set; GPUs failing
    the check are reported unhealthy. Returns early when the enforcer has nothing to supervise
    (simulated GPUs)."""
    repeat(lambda: check_mps(enforcer, state), stop, interval)


def check_mps(
    enforcer: FractionEnforcer, state: NodeState, seconds: float = HEALTH_CHECK_BUDGET_S
) -> bool:
    """One MPS health check (repairs and retries of pending claims included) within
    ``seconds``: it holds the enforcer, which Prepare needs. Updates ``state.unhealthy_gpus``
    (and sets ``state.wake`` when the set changed, so the GPUs' taints are published at once);
    a check that fails as a whole is logged and leaves them as they were. Returns False when
    the enforcer has nothing to supervise (``check_health`` gave None), else True."""
    try:
        with budget.within(Budget.of(seconds)):
            results = enforcer.check_health()
    except Exception as exc:  # keep supervising whatever happens
        log.error("MPS health check failed", error=str(exc))
        return True
    if results is None:
        return False
    unhealthy = {u: r.detail or "MPS unhealthy" for u, r in results.items() if not r.healthy}
    if unhealthy.keys() != state.unhealthy_gpus.keys():
        state.wake.set()  # taints change: republish now
    state.unhealthy_gpus = unhealthy
    return True


def police_clients(
    enforcer: FractionEnforcer,
    metrics: Metrics,
    stop: threading.Event,
    interval: float = CLIENT_CHECK_INTERVAL_S,
) -> None:
    """Hold each claim's MPS clients within its cap every ``interval`` seconds until ``stop``
    is set (:func:`check_clients`). Returns early when the enforcer runs no MPS clients
    (simulated GPUs with the recording enforcer)."""
    repeat(lambda: check_clients(enforcer, metrics), stop, interval)


def check_clients(
    enforcer: FractionEnforcer, metrics: Metrics, seconds: float = CLIENT_CHECK_BUDGET_S
) -> bool:
    """One check of the claims' MPS clients within ``seconds`` (it holds no lock Prepare
    needs); each terminated client counts in ``dra_gpu_fraction_mps_clients_terminated_total``
    under its reason. A check that fails as a whole is logged. Returns False when the
    enforcer runs no MPS clients (``check_clients`` gave None), else True."""
    try:
        with budget.within(Budget.of(seconds)):
            done = enforcer.check_clients()
    except Exception as exc:  # keep checking whatever happens
        log.error("MPS client check failed", error=str(exc))
        return True
    if done is None:
        return False
    for t in done:
        metrics.mps_clients_terminated.labels(reason=t.reason).inc(len(t.pids))
    return True


PlanCheck = Callable[[list[ClaimPlan]], object]
"""One check of the prepared claims' plans (its result is not used)."""


def watch_prepared(
    checks: Mapping[str, PlanCheck],
    prepared: Callable[[], list[ClaimPlan]],
    stop: threading.Event,
    interval: float = 5.0,
) -> None:
    """Every ``interval`` seconds until ``stop`` is set, run each of ``checks`` (by name) on the
    plans of the prepared claims (``prepared``): the consumer watch
    (:mod:`dra_driver.observe.consumers`) and, with MPS, the outage conditions
    (:mod:`dra_driver.observe.mpsoutages`). A check that fails is logged and the others still
    run."""
    while not stop.wait(interval):
        plans = list(prepared())
        for name, check in checks.items():
            try:
                check(plans)
            except Exception:  # keep watching whatever happens
                log.exception("check of the prepared claims failed", check=name)
