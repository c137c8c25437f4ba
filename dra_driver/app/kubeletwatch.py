"""Whether the kubelet found the plugin: a kubelet whose ``--root-dir`` is not the chart's
``kubeletDir`` never sees the registration socket, never calls the plugin, and nothing else
says why its pods wait (kubernetes-sigs/dranet#250, dra-driver-nvidia-gpu#464).

The kubelet's plugin watcher (k8s.io/kubernetes ``pkg/kubelet/pluginmanager``) watches
``<root-dir>/plugins_registry`` and calls ``GetInfo`` on a new socket within about a second.
No call within :data:`REGISTRATION_TIMEOUT_S` is reported: an error log naming the socket and
what to set, ``<stateDir>/kubelet-registration.json`` for ``dra-driver status`` and the gauge
``dra_gpu_fraction_kubelet_registered``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import structlog
from prometheus_client import Gauge

from dra_driver.infra import record_state
from dra_driver.model.defaults import REGISTRATION_TIMEOUT_S

log = structlog.get_logger(__name__)

REGISTRATION_STATE_FILE = "kubelet-registration.json"
"""Under the state directory: ``{"registered": bool, "socket": str, "problem": str | null,
"since": RFC 3339}``; not registered and no problem: the plugin started less than its
registration timeout ago."""
REPEAT_S = 600.0
"""Seconds between two repeats of the error while the kubelet still has not called."""


def unregistered_problem(socket: Path, waited_s: float) -> str:
    """What a plugin that the kubelet has not called for ``waited_s`` seconds tells its admin;
    ``socket`` is ``<kubeletDir>/plugins_registry/<driver>-reg.sock``."""
    kubelet_dir = socket.parent.parent
    return (
        f"the kubelet has not called this plugin's registration socket {socket} in "
        f"{waited_s:.0f} s: it looks for plugins in <its --root-dir>/plugins_registry, so either "
        f"no kubelet runs on this node or its --root-dir is not {kubelet_dir}; set the chart "
        "value kubeletDir (plugin flags --plugin-dir and --registry-dir) to the kubelet's "
        "--root-dir; until then no pod on this node can use this driver's claims"
    )


def write_registration_state(
    state_dir: str, socket: Path, registered: bool, problem: str | None = None
) -> None:
    """Record :data:`REGISTRATION_STATE_FILE` (owner-only); a failed write is logged only."""
    record_state(
        Path(state_dir) / REGISTRATION_STATE_FILE,
        {"registered": registered, "socket": str(socket), "problem": problem},
        "kubelet registration state",
    )


def watch_registration(
    called: threading.Event,
    socket: Path,
    state_dir: str,
    gauge: Gauge,
    stop: threading.Event,
    timeout: float = REGISTRATION_TIMEOUT_S,
    repeat: float = REPEAT_S,
) -> None:
    """Until ``stop``: wait for the kubelet's first call (``called``); report its absence after
    ``timeout`` seconds and again every ``repeat`` seconds; once it comes, record that and
    return. ``gauge`` (``dra_gpu_fraction_kubelet_registered``) follows."""
    gauge.set(0)
    write_registration_state(state_dir, socket, False)
    started = time.monotonic()
    next_report = started + timeout
    while not stop.is_set():
        if called.wait(min(1.0, max(next_report - time.monotonic(), 0.0))):
            gauge.set(1)
            write_registration_state(state_dir, socket, True)
            log.info("the kubelet called the registration socket", socket=str(socket))
            return
        now = time.monotonic()
        if now >= next_report:
            problem = unregistered_problem(socket, now - started)
            log.error("kubelet never called the plugin", problem=problem)
            write_registration_state(state_dir, socket, False, problem)
            next_report = now + repeat
