"""The MPS emulator's records (pure): its state machine's objects and the interface to the
world it changes.

The state machine (:mod:`dra_driver.mpsemu.state`) keeps daemons, servers, namespaces and
clients as these records; everything it does outside them (directories, sockets, server
processes) goes through a :class:`World`. Two worlds exist: plain files in memory for the
in-process test fake (``tests/support/fakes/mps_control.py``) and real processes and sockets
(:class:`dra_driver.mpsemu.processes.ProcessWorld`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from dra_driver.model.errors import DriverError

PID_FILE = "nvidia-cuda-mps-control.pid"
"""Name of the daemon's PID file in its pipe directory."""
DEFAULT_NAMESPACE = "default"
"""The namespace a client joins through the server's own ``control`` socket."""


class WorldError(DriverError, RuntimeError):
    """A world could not carry out a change (a server process did not answer, a socket could
    not be bound); the message says what, and the command that caused it fails with it."""


@dataclass
class Namespace:
    """One namespace of a server.

    Attributes:
        name: MPS name (``[a-z0-9_]{1,64}``, or ``default``).
        pinned: pinned device memory limit in bytes; None = unlimited.
        threads: active thread percentage 1-100; None = not set (``-``).
        priority: client priority (always 0 here).
    """

    name: str
    pinned: int | None = None
    threads: int | None = None
    priority: int = 0


@dataclass
class Server:
    """One MPS server of a daemon.

    Attributes:
        name: MPS name.
        uid: the user it serves.
        pid: its process ID (invented in memory, real for server processes).
        allowed: GPU UUIDs it may open; empty = all.
        status: as ``server list`` prints it (``Ready``, ``Initializing``).
        namespaces: named namespaces, plus ``default`` once ``server set`` gave it limits.
        vanish_in: ``server list`` calls left before it disappears (a UUID it cannot open);
            None = it stays until its world reports it gone.
    """

    name: str
    uid: int
    pid: int
    allowed: tuple[str, ...]
    status: str = "Ready"
    namespaces: dict[str, Namespace] = field(default_factory=dict)
    vanish_in: int | None = None


@dataclass
class Client:
    """A client process attached to ``server``/``namespace`` (``pid`` as the host sees it)."""

    pid: int
    server: str
    namespace: str
    cmd: str = "python app.py"


@dataclass
class Daemon:
    """One control daemon, keyed by its pipe directory.

    Attributes:
        pipe: ``CUDA_MPS_PIPE_DIRECTORY``.
        log: ``CUDA_MPS_LOG_DIRECTORY``.
        protocol: 2 or 3.
        multiuser: started with ``-m``.
        config: the parsed ``-a`` TOML ({} without one).
        servers: by name.
        clients: attached clients, in attach order.
    """

    pipe: Path
    log: Path
    protocol: int
    multiuser: bool
    config: dict[str, object]
    servers: dict[str, Server] = field(default_factory=dict)
    clients: list[Client] = field(default_factory=list)


@dataclass(frozen=True)
class Observation:
    """What a world saw change on its own since the last command.

    Attributes:
        exited: names of servers whose process ended.
        clients: the clients attached now (replaces the daemon's list); None = unknown, keep it.
    """

    exited: tuple[str, ...] = ()
    clients: tuple[Client, ...] | None = None


class World(Protocol):
    """The side effects of the state machine. Methods raise :class:`WorldError` (or
    ``OSError``) when a change cannot be made; the state machine then leaves its records as they
    were and fails the command with that message."""

    def daemon_started(self, daemon: Daemon) -> None:
        """Create the pipe and log directories, the ``control`` socket and the PID file."""
        ...

    def daemon_stopped(self, daemon: Daemon) -> None:
        """The daemon quits: end its servers; remove the ``control`` socket and PID file."""
        ...

    def server_started(self, daemon: Daemon, server: Server, device_visible: bool) -> int:
        """Start ``server`` (``<pipe>/<name>/control``); return its PID. A server whose
        devices are not visible may start and end on its own (then :meth:`observe` says so)."""
        ...

    def server_stopped(self, daemon: Daemon, server: Server) -> None:
        """End ``server`` and its clients; remove its directory tree."""
        ...

    def namespace_created(self, daemon: Daemon, server: Server, namespace: Namespace) -> None:
        """Create a named namespace: its directory and ``control`` socket."""
        ...

    def namespace_set(self, daemon: Daemon, server: Server, namespace: Namespace) -> None:
        """Apply the namespace's new limits (``default`` too): clients that connect later get
        them."""
        ...

    def namespace_removed(self, daemon: Daemon, server: Server, namespace: Namespace) -> None:
        """End the namespace's clients; remove its socket and directory."""
        ...

    def client_terminated(self, daemon: Daemon, client: Client) -> None:
        """End ``client``'s connection, telling it that it was terminated."""
        ...

    def observe(self, daemon: Daemon) -> Observation:
        """What changed on its own (servers ended, clients came or went) since last asked."""
        ...


def mem_text(value: int | None) -> str:
    """An MPS memory value as ``list`` prints it: ``4G``, ``512M``, ``1K``, bytes, or
    ``unlimited`` for None."""
    if value is None:
        return "unlimited"
    for suffix, unit in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)
