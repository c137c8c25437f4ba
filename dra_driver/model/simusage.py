"""What the MPS emulator's clients use, as the simulated NVML reads it (pure).

On a simulated node a tenant produces usage (``tenant-probe --use-memory 2Gi --use-sm 40``):
it tells its emulated MPS server ``USE <bytes> <percent>``, the server holds it to its
namespace's limits as MPS would (:func:`grant`) and writes what every client of it uses to
``<server dir>/usage.json`` (:data:`USAGE_FILE`, :func:`render`); the simulated NVML
(:mod:`dra_driver.enforce.mps.simnvml`) reads those files (:func:`parse`) and answers
``nvmlDeviceGetMPSComputeRunningProcesses_v3``, ``nvmlDeviceGetProcessUtilization`` and the
per-cgroup ``currentUsed`` from them. Nothing here exists on a GPU node.

The rules :func:`grant` applies are MPS's: a client cannot allocate past its namespace's
pinned memory limit (its allocation fails with out-of-memory; NVIDIA MPS docs, "MPS v3
Interface", pinned memory limit, one value per GPU the client opens) and cannot use more SMs
than its namespace's active thread percentage (a ceiling, not a reservation).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

USAGE_FILE = "usage.json"
"""Name of a server's usage file in its directory (``<pipe>/<server>/``)."""
OUT_OF_MEMORY = "CUDA_ERROR_OUT_OF_MEMORY"
"""What an emulated client is told when its allocation passes the pinned memory limit (CUDA
driver API error 2)."""


@dataclass(frozen=True)
class ClientUse:
    """One client's use: host PID, namespace, GPU memory (bytes) and SM utilization (percent
    of the whole GPU)."""

    pid: int
    namespace: str
    used_bytes: int
    sm_percent: float


@dataclass(frozen=True)
class ServerUse:
    """A server's clients' use on each GPU it serves (``gpus``: UUIDs; one value per GPU, as
    MPS applies one limit to every GPU a client opens)."""

    gpus: tuple[str, ...]
    clients: tuple[ClientUse, ...]


def grant(
    want_bytes: int, want_sm: float, pinned_bytes: int | None, threads: int | None
) -> tuple[int, float] | str:
    """Pure: what a client asking ``want_bytes`` and ``want_sm`` gets in a namespace with
    ``pinned_bytes`` (None: unlimited) and ``threads`` (None: 100): ``(bytes, percent)``, or
    the error text when the memory passes the limit (it then keeps what it had)."""
    if want_bytes < 0 or not 0 <= want_sm <= 100:
        return f"invalid use: {want_bytes} bytes, {want_sm}% SMs"
    if pinned_bytes is not None and want_bytes > pinned_bytes:
        return (
            f"{OUT_OF_MEMORY}: {want_bytes} bytes is more than the namespace's pinned memory "
            f"limit of {pinned_bytes} bytes"
        )
    return want_bytes, min(want_sm, 100 if threads is None else threads)


def render(use: ServerUse) -> bytes:
    """The usage file's content (JSON)."""
    body = {
        "gpus": list(use.gpus),
        "clients": [
            {"pid": c.pid, "namespace": c.namespace, "bytes": c.used_bytes, "sm": c.sm_percent}
            for c in use.clients
        ],
    }
    return (json.dumps(body, sort_keys=True) + "\n").encode()


def parse(data: bytes) -> ServerUse:
    """Read a usage file's content.

    Raises:
        ValueError: not a usage file (malformed JSON or fields of the wrong type).
    """
    try:
        body = json.loads(data)
        clients = tuple(
            ClientUse(int(c["pid"]), str(c["namespace"]), int(c["bytes"]), float(c["sm"]))
            for c in body["clients"]
        )
        return ServerUse(tuple(str(g) for g in body["gpus"]), clients)
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not an emulated MPS usage file: {exc}") from exc
