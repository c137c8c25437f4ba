"""What ``nvidia-cuda-mps-control`` lists (pure): server, namespace and client rows and the
parsers of their ``--format=csv,noheader`` output (NVIDIA MPS docs, "MPS v3 Interface")."""

from __future__ import annotations

import csv
from dataclasses import dataclass

from dra_driver.enforce.rules.base import MpsError
from dra_driver.enforce.rules.names import parse_memory


@dataclass(frozen=True)
class ServerRow:
    """One row of ``server list``: name, uid, pid, status, pipe-directory, allowed-devices,
    context-ids (MPS v3 Interface, ``server list``)."""

    name: str
    uid: str
    pid: str
    status: str
    pipe_directory: str
    allowed_devices: tuple[str, ...]
    context_ids: str


@dataclass(frozen=True)
class NamespaceRow:
    """One row of ``namespace list``: name, server, server-status, pinned-memory-limit,
    active-thread-percentage, client-priority, pipe-directory (MPS v3 Interface,
    ``namespace list``)."""

    name: str
    server: str
    server_status: str
    pinned_memory_limit: str
    active_thread_percentage: str
    client_priority: str
    pipe_directory: str

    @property
    def has_memory_limit(self) -> bool:
        """Whether a pinned memory limit is shown (a namespace just created shows none,
        ``unlimited``; an unreadable value counts as none)."""
        try:
            return parse_memory(self.pinned_memory_limit) is not None
        except MpsError:
            return False


@dataclass(frozen=True)
class ClientRow:
    """One row of ``client list``: pid (host PID namespace), server, device, namespace, cmd."""

    pid: int
    server: str
    device: str
    namespace: str
    cmd: str


def _rows(text: str, header_first: str) -> list[list[str]]:
    out = []
    for row in csv.reader(line for line in text.splitlines() if line.strip()):
        cells = [c.strip() for c in row]
        if cells and cells[0].lower() == header_first:
            continue
        out.append(cells)
    return out


def parse_servers(text: str) -> list[ServerRow]:
    """Parse ``server list --format=csv,noheader`` output (unquoted device lists tolerated)."""
    servers = []
    for cells in _rows(text, "name"):
        if len(cells) < 7:
            continue
        devices = ",".join(cells[5:-1])
        servers.append(
            ServerRow(
                name=cells[0],
                uid=cells[1],
                pid=cells[2],
                status=cells[3],
                pipe_directory=cells[4],
                allowed_devices=tuple(d.strip() for d in devices.split(",") if d.strip()),
                context_ids=cells[-1],
            )
        )
    return servers


def parse_namespaces(text: str) -> list[NamespaceRow]:
    """Parse ``namespace list --format=csv,noheader`` output."""
    return [
        NamespaceRow(
            name=c[0],
            server=c[1],
            server_status=c[2],
            pinned_memory_limit=c[3],
            active_thread_percentage=c[4],
            client_priority=c[5],
            pipe_directory=",".join(c[6:]),
        )
        for c in _rows(text, "name")
        if len(c) >= 7
    ]


def parse_clients(text: str) -> list[ClientRow]:
    """Parse ``client list --format=csv,noheader`` output (the command may contain commas)."""
    clients = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", 4)]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        clients.append(
            ClientRow(
                int(parts[0]), parts[1], parts[2], parts[3], parts[4] if len(parts) > 4 else ""
            )
        )
    return clients
