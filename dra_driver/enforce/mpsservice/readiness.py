"""The MPS node service's readiness file: which control daemons it runs, since when, with which
protocol, and a generation that grows with every daemon (re)start.

The service (:mod:`dra_driver.enforce.mpsservice.service`) writes ``<root>/mps/service.json``
atomically whenever a daemon starts, restarts or stops; the kubelet plugin, its client, reads it
before it sends a daemon any command and in every health check. A daemon counts as ready only while
the file says so **and** its process is alive (the file stays behind when the service's pod is
killed): ``/proc/<pid>/stat``'s start time must still be the one recorded, so a reused PID is not
mistaken for the daemon. Both run with the host's PID namespace (``hostPID``), so the PIDs are the
same for both.

Format (JSON, version 1)::

    {"version": 1, "generation": 3, "node": "gpu-node-1", "protocol": "v3",
     "service": {"pid": 41, "startTime": 1234567, "startedAt": "2026-12-02T05:00:00Z"},
     "daemons": {"<mode>": {"pid": 52, "startTime": 1234599, "generation": 1,
                             "restarts": 0, "startedAt": "...", "pipeDir": "...",
                             "logDir": "..."}, ...},
     "stopping": false}

``protocol`` is what the node's ``nvidia-cuda-mps-control`` offers (``v3``, ``v2`` or
``absent``, :func:`dra_driver.enforce.mps.control.probe_mps`); ``daemons`` lists only running
daemons.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.infra.atomicfile import write_atomic
from dra_driver.model.errors import DriverError

VERSION = 1
FILE_NAME = "service.json"


def state_path(mps_root: Path) -> Path:
    """``<root>/mps/service.json`` for the enforcer's ``mps_root`` (``<root>/mps``)."""
    return mps_root / FILE_NAME


def process_start_time(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field
    22), or None when there is no such process (or it is a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return int(fields[19])


@dataclass(frozen=True)
class DaemonState:
    """One running control daemon of the service.

    Attributes:
        pid: its process (host PID namespace).
        start_time: its ``/proc/<pid>/stat`` start time (clock ticks since boot).
        generation: the service's generation when it started.
        restarts: how often the service restarted this mode's daemon.
        started_at: when, RFC 3339.
        pipe_dir: its ``CUDA_MPS_PIPE_DIRECTORY``.
        log_dir: its ``CUDA_MPS_LOG_DIRECTORY``.
    """

    pid: int
    start_time: int
    generation: int
    restarts: int
    started_at: str
    pipe_dir: str
    log_dir: str

    def alive(self) -> bool:
        """Whether the recorded process still runs (same PID, same start time)."""
        return process_start_time(self.pid) == self.start_time


@dataclass(frozen=True)
class ServiceState:
    """What the service says about itself (see the module).

    Attributes:
        generation: grows with every daemon start (first starts and restarts).
        node: the node's name.
        protocol: ``v3``, ``v2`` or ``absent``: what the node's MPS control program offers.
        pid, start_time, started_at: the service process.
        daemons: compute mode -> its running daemon.
        stopping: the service is shutting its daemons down (SIGTERM).
    """

    generation: int
    node: str
    protocol: str
    pid: int
    start_time: int
    started_at: str
    daemons: dict[str, DaemonState] = field(default_factory=dict)
    stopping: bool = False

    def service_alive(self) -> bool:
        """Whether the service process that wrote this still runs."""
        return process_start_time(self.pid) == self.start_time

    def problem(self, mode: str) -> str | None:
        """Why the daemon of ``mode`` cannot be used now, or None when it is ready."""
        if self.stopping:
            return "the MPS service is stopping"
        if self.protocol != "v3":
            return f"the node's MPS offers protocol {self.protocol}, not v3"
        daemon = self.daemons.get(mode)
        if daemon is None:
            return (
                f"the MPS service runs no {mode} control daemon (it is starting or restarting it)"
            )
        if not daemon.alive():
            return f"the {mode} control daemon (pid {daemon.pid}) is gone"
        return None

    def to_json(self) -> dict[str, Any]:
        """The file's JSON object (camelCase keys, :data:`VERSION`)."""
        daemons = {
            mode: {
                "pid": d.pid,
                "startTime": d.start_time,
                "generation": d.generation,
                "restarts": d.restarts,
                "startedAt": d.started_at,
                "pipeDir": d.pipe_dir,
                "logDir": d.log_dir,
            }
            for mode, d in sorted(self.daemons.items())
        }
        return {
            "version": VERSION,
            "generation": self.generation,
            "node": self.node,
            "protocol": self.protocol,
            "service": {
                "pid": self.pid,
                "startTime": self.start_time,
                "startedAt": self.started_at,
            },
            "daemons": daemons,
            "stopping": self.stopping,
        }


class ReadinessError(DriverError, ValueError):
    """The readiness file is missing, unreadable or not of this format; the message says which."""


def _daemon(doc: Any, where: str) -> DaemonState:
    try:
        return DaemonState(
            pid=int(doc["pid"]),
            start_time=int(doc["startTime"]),
            generation=int(doc["generation"]),
            restarts=int(doc.get("restarts", 0)),
            started_at=str(doc.get("startedAt", "")),
            pipe_dir=str(doc["pipeDir"]),
            log_dir=str(doc["logDir"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ReadinessError(f"{where}: malformed daemon entry ({exc!r})") from None


def read_state(path: Path) -> ServiceState:
    """The service's state from its readiness file.

    Raises:
        ReadinessError: no file (the service is not running on this node, or has not started
            yet), unreadable, not JSON, another version, or malformed.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ReadinessError(f"{path} does not exist") from None
    except OSError as exc:
        raise ReadinessError(f"{path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise ReadinessError(f"{path} is not JSON") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise ReadinessError(f"{path}: not a version {VERSION} readiness file")
    try:
        service = doc["service"]
        daemons = doc.get("daemons") or {}
        return ServiceState(
            generation=int(doc["generation"]),
            node=str(doc.get("node", "")),
            protocol=str(doc["protocol"]),
            pid=int(service["pid"]),
            start_time=int(service["startTime"]),
            started_at=str(service.get("startedAt", "")),
            daemons={str(m): _daemon(d, f"{path}: daemons.{m}") for m, d in daemons.items()},
            stopping=bool(doc.get("stopping", False)),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ReadinessError(f"{path}: malformed ({exc!r})") from None


def write_state(path: Path, state: ServiceState) -> None:
    """Write ``state`` atomically (readable by every user: it holds no secret)."""
    body = json.dumps(state.to_json(), indent=1, sort_keys=True).encode()
    write_atomic(path, body, 0o600, durable=False)


__all__ = [
    "DaemonState",
    "ReadinessError",
    "ServiceState",
    "process_start_time",
    "read_state",
    "state_path",
    "write_state",
]
