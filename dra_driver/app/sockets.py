"""Unix socket paths must fit the kernel's limit; checked once at plugin start-up.

``sockaddr_un.sun_path`` holds 108 bytes on Linux including the terminating NUL, so a path of
at most :data:`SUN_PATH_MAX` = 107 bytes can be bound (unix(7)). The plugin binds its two
kubelet sockets (:class:`~dra_driver.kubelet.server.SocketPaths`), and every MPS control daemon,
server and namespace binds ``<its pipe directory>/control`` (NVIDIA MPS docs, "MPS v3
Namespaces"): the daemon's ``<root>/mps/<mode>/pipe``, a shared server's ``gpu_<index>``
below it, a claim's namespace ``c_<uid>`` below that, a multi-GPU claim's own server
``m_<uid>`` with its namespace ``claim`` (:mod:`dra_driver.enforce.rules.targets`). A path
that is too long would fail only when the first claim arrives; :func:`check_socket_paths`
refuses it at start-up instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from dra_driver.enforce import (
    DEDICATED_NAMESPACE,
    MpsOptions,
    daemon_pipe_dir,
    dedicated_server_name,
    namespace_name,
    server_name,
)
from dra_driver.kubelet import SocketPaths
from dra_driver.model.errors import UsageError
from dra_driver.model.vocabulary import COMPUTE_MODES

SUN_PATH_MAX = 107
"""Longest bindable unix socket path in bytes (108-byte ``sun_path`` minus the NUL)."""
MPS_SOCKET = "control"
"""The socket every MPS daemon, server and namespace listens on in its pipe directory."""
_LONGEST_UID = "ffffffff-ffff-ffff-ffff-ffffffffffff"
"""A claim UID of the longest form (all UIDs have 36 characters)."""


def socket_paths(
    plugin: SocketPaths, mps: MpsOptions, gpu_indexes: Iterable[int]
) -> list[tuple[str, str]]:
    """Pure: ``(path, flag that sets it)`` of every kind of socket the node will bind, with the
    longest claim UID and the node's largest GPU index (0 when it has none)."""
    out = [
        (str(plugin.registration), "--registry-dir"),
        (str(plugin.dra), "--plugin-dir"),
    ]
    gpu = server_name(max(gpu_indexes, default=0))
    claim_server = dedicated_server_name(_LONGEST_UID)
    for mode in COMPUTE_MODES:
        pipe = daemon_pipe_dir(mps.mps_root, mode)
        for below in (
            Path(),
            Path(gpu),
            Path(gpu, namespace_name(_LONGEST_UID)),
            Path(claim_server),
            Path(claim_server, DEDICATED_NAMESPACE),
        ):
            out.append((str(pipe / below / MPS_SOCKET), "--mps-root"))
    return out


def check_socket_paths(plugin: SocketPaths, mps: MpsOptions, gpu_indexes: Iterable[int]) -> None:
    """Refuse a configuration in which some socket path would exceed :data:`SUN_PATH_MAX`.

    Raises:
        UsageError: one line naming the longest such path, its length, the limit and the
            flag to shorten.
    """
    path, flag = max(socket_paths(plugin, mps, gpu_indexes), key=lambda p: len(p[0].encode()))
    size = len(path.encode())
    if size > SUN_PATH_MAX:
        raise UsageError(
            f"unix socket path {path} would be {size} bytes; the kernel allows {SUN_PATH_MAX} "
            f"(sun_path is 108 bytes with the NUL): shorten {flag}"
        )
