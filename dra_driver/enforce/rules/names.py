"""Pure helpers for MPS v3 object names and memory values.

Sources: server and namespace names are lower-case letters, digits and underscore, at most 64
characters, and memory values take the suffixes ``G``, ``M``, ``K`` (NVIDIA MPS docs, "MPS v3
Interface"); the suffixes are binary (``10G`` = 10,737,418,240 bytes, NVIDIA Dynamo docs,
"Per-GPU Compute and Memory Limits with MPS").
"""

from __future__ import annotations

import re
from pathlib import Path

from dra_driver.enforce.rules.base import MpsError
from dra_driver.model.errors import PrepareError
from dra_driver.model.gpu import MIB
from dra_driver.model.ids import validate_uid

CONTROL_BINARY = "nvidia-cuda-mps-control"
"""Default MPS control program (looked up in ``PATH``)."""

SERVER_PREFIX = "gpu_"
"""Prefix of the per-GPU MPS server name: ``gpu_<NVML index>``."""
NAMESPACE_PREFIX = "c_"
"""Prefix of a claim's namespace name: ``c_`` + the claim UID with ``-`` as ``_`` (38 chars)."""
DEDICATED_PREFIX = "m_"
"""Prefix of a multi-GPU claim's own MPS server: ``m_`` + the claim UID with ``-`` as ``_``."""
DEDICATED_NAMESPACE = "claim"
"""The namespace of a multi-GPU claim on its own server: the server's name already names the
claim, and ``c_<uid>`` below ``m_<uid>`` would make the namespace's socket path 125 bytes
under the default root, beyond the kernel's 107 (:mod:`dra_driver.app.sockets`)."""

_NAME = re.compile(r"^[a-z0-9_]{1,64}$")
_UID_PART = r"([0-9a-f]{8})_([0-9a-f]{4})_([0-9a-f]{4})_([0-9a-f]{4})_([0-9a-f]{12})$"
_NAMESPACE = re.compile(r"^" + NAMESPACE_PREFIX + _UID_PART)
_DEDICATED = re.compile(r"^" + DEDICATED_PREFIX + _UID_PART)
_MEMORY = re.compile(r"^([0-9]+)\s*([KMGT]?)(i?B)?$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_UNLIMITED = {"", "-", "unlimited", "none", "max", "n/a"}


def check_name(name: str) -> str:
    """Return ``name`` if it is a valid MPS server/namespace name.

    Raises:
        MpsError: when it has characters outside ``[a-z0-9_]`` or is longer than 64.
    """
    if not _NAME.fullmatch(name):
        raise MpsError(f"MPS name {name!r} must be 1-64 characters of [a-z0-9_]")
    return name


def server_name(gpu_index: int) -> str:
    """Name of the MPS server that serves the GPU with NVML index ``gpu_index``."""
    if gpu_index < 0:
        raise MpsError(f"GPU index {gpu_index} is negative")
    return check_name(f"{SERVER_PREFIX}{gpu_index}")


def _claim_name(prefix: str, claim_uid: str) -> str:
    try:
        validate_uid(claim_uid)
    except PrepareError as exc:
        raise MpsError(str(exc)) from exc
    return check_name(prefix + claim_uid.replace("-", "_"))


def namespace_name(claim_uid: str) -> str:
    """Namespace name of a claim: ``c_<uid with '-' replaced by '_'>``.

    Raises:
        MpsError: when ``claim_uid`` is not a Kubernetes UID.
    """
    return _claim_name(NAMESPACE_PREFIX, claim_uid)


def dedicated_server_name(claim_uid: str) -> str:
    """Name of the MPS server a multi-GPU claim gets for itself: ``m_<uid, '-' as '_'>``.

    Raises:
        MpsError: when ``claim_uid`` is not a Kubernetes UID.
    """
    return _claim_name(DEDICATED_PREFIX, claim_uid)


def claim_uid_of(namespace: str) -> str | None:
    """Inverse of :func:`namespace_name`; None for a namespace that is not a claim's."""
    m = _NAMESPACE.match(namespace)
    return "-".join(m.groups()) if m else None


def claim_uid_of_server(server: str) -> str | None:
    """Inverse of :func:`dedicated_server_name`; None for any other server (e.g. ``gpu_0``)."""
    m = _DEDICATED.match(server)
    return "-".join(m.groups()) if m else None


def mib(value_bytes: int) -> int:
    """Whole MiB in ``value_bytes``, rounded down (a ceiling never grows by rounding)."""
    return value_bytes // MIB


def memory_arg(value_bytes: int) -> str:
    """An MPS memory value in whole MiB with the ``M`` suffix, e.g. ``40960M``.

    Raises:
        MpsError: when the value is below 1 MiB (MPS has no way to say "zero").
    """
    whole = mib(value_bytes)
    if whole < 1:
        raise MpsError(f"memory value {value_bytes} bytes is below 1 MiB")
    return f"{whole}M"


def parse_memory(text: str) -> int | None:
    """Parse an MPS memory value (``4G``, ``512M``, ``1024K``, ``123``) into bytes.

    Returns None for "no limit" spellings (empty, ``-``, ``unlimited``). A bare number is
    taken as bytes.

    Raises:
        MpsError: for text that is neither.
    """
    t = text.strip()
    if t.lower() in _UNLIMITED:
        return None
    m = _MEMORY.match(t)
    if not m:
        raise MpsError(f"cannot parse MPS memory value {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def daemon_pipe_dir(root: Path, mode: str) -> Path:
    """``CUDA_MPS_PIPE_DIRECTORY`` of the daemon serving ``mode`` under the enforcer's MPS root."""
    return root / mode / "pipe"


CONTROL_SOCKET = "control"
"""The socket every MPS daemon, server and namespace listens on in its directory (NVIDIA MPS
docs, "MPS v3 Namespaces")."""

PIPE_DIR_MODE = 0o711
"""A daemon's pipe directory and its servers' directories: traversable by every UID (a tenant
reaches its namespace's socket by its path) but not listable (other claims' namespaces stay
hidden)."""

DEFAULT_NAMESPACE = "default"
"""Every MPS server's implicit namespace, reached through ``<server>/control``."""
DEFAULT_NAMESPACE_LIMIT = "1M"
"""The pinned memory limit of every server's ``default`` namespace: no claim uses it, so a
process that reaches it gets too little for a CUDA context (a client's own context takes a few
hundred MiB of its limit, measured in NVIDIA's Dynamo MPS guide). [UNKNOWN] whether a real MPS
server takes a limit this small: ``hack/gpu-check`` reads it back."""
DEFAULT_NAMESPACE_THREADS = 1
"""The active thread percentage of every server's ``default`` namespace (the smallest)."""
