"""Pure: the prepared claims' servers and namespaces as a part of a control daemon's ``-a`` file.

A restarted control daemon (SIGKILL, a crash, the MPS node service replacing a hung one) comes
back with no server and no namespace. Until the plugin's health check re-creates them (up to
10 s later), a tenant that retries finds no namespace; and a namespace created by a command
has no limits until the next command sets them. The "MPS v3 Configuration File" page (Release
615) lets the ``-a`` file declare servers (``[servers.<name>]``) and their namespaces
(``[servers.<name>.namespaces.<ns>]``) with their limits, applied when the daemon starts. So
the enforcer writes, after every change of its claims, the servers and namespaces they need
into ``<root>/mps/<mode>/claims.toml`` (:data:`CLAIMS_FILE`), and every daemon start (the MPS
node service's, or the plugin's own with ``mps.service: in-plugin``) appends it to the
daemon's ``mps.toml`` (:func:`merged_config`): the namespaces exist with their limits from the
daemon's first answer. KAI's MPS supervisor (third party) likewise declares its shared server in
the ``-a`` file it writes before each daemon start.

Only keys of the Release 615 page: per server ``allowed_devices`` (the GPU UUIDs, as ``server
create --allowed-devices``) and ``uid = 0`` (multi-user mode); per namespace
``pinned_memory_limit`` (whole MiB, ``"4096M"``) and ``active_thread_percentage`` (``"50"``),
the values the enforcer's ``namespace set`` gives (:mod:`dra_driver.enforce.rules.names`).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable

from dra_driver.enforce.rules.names import (
    DEFAULT_NAMESPACE_LIMIT,
    DEFAULT_NAMESPACE_THREADS,
    memory_arg,
)
from dra_driver.enforce.rules.targets import FractionTarget
from dra_driver.model.errors import DriverError

CLAIMS_FILE = "claims.toml"
"""Name of the claims' part of a daemon's ``-a`` file, in ``<root>/mps/<mode>/``."""


class DeclaredError(DriverError, ValueError):
    """A claims file that is not the servers part of an ``-a`` file; the message says why."""


def claims_toml(targets: Iterable[FractionTarget]) -> str:
    """The ``[servers...]`` tables of ``targets`` (one daemon's MPS targets), sorted by server
    and namespace; ``""`` without targets.

    Example (a quarter of GPU 0 and a multi-GPU claim)::

        [servers.gpu_0]
        allowed_devices = "GPU-0..."
        uid = 0
        pinned_memory_limit = "1M"          # the default namespace, which no claim uses
        active_thread_percentage = "1"

        [servers.gpu_0.namespaces.c_0a00...]
        pinned_memory_limit = "36198M"
        active_thread_percentage = "100"

        [servers.m_0b00...]
        allowed_devices = "GPU-0...,GPU-1..."
        uid = 0

        [servers.m_0b00....namespaces.claim]
        ...

    Raises:
        MpsError: a limit below 1 MiB (as :func:`~dra_driver.enforce.rules.names.memory_arg`).
    """
    servers: dict[str, tuple[str, dict[str, FractionTarget]]] = {}
    for t in targets:
        if not t.uses_mps:
            continue
        devices = ",".join(g.uuid for g in t.server_gpus)
        servers.setdefault(t.server, (devices, {}))[1].setdefault(t.namespace, t)
    blocks = []
    for server in sorted(servers):
        devices, spaces = servers[server]
        blocks.append(
            f"[servers.{server}]\nallowed_devices = {json.dumps(devices)}\nuid = 0\n"
            f"pinned_memory_limit = {json.dumps(DEFAULT_NAMESPACE_LIMIT)}\n"
            f'active_thread_percentage = "{DEFAULT_NAMESPACE_THREADS}"\n'
        )
        for ns in sorted(spaces):
            t = spaces[ns]
            blocks.append(
                f"[servers.{server}.namespaces.{ns}]\n"
                f"pinned_memory_limit = {json.dumps(memory_arg(t.limit_bytes))}\n"
                f'active_thread_percentage = "{t.threads}"\n'
            )
    return "\n".join(blocks)


def merged_config(base: str, claims: str) -> str:
    """The daemon's ``-a`` file: ``base`` (:func:`~dra_driver.enforce.mps.daemon.config_toml`) with
    the claims' part (:func:`claims_toml`, as read from :data:`CLAIMS_FILE`) appended.

    Raises:
        DeclaredError: ``claims`` is not TOML, or has anything besides ``servers`` tables (the
            caller then starts the daemon with ``base`` alone).
    """
    if not claims.strip():
        return base
    try:
        parsed = tomllib.loads(claims)
    except tomllib.TOMLDecodeError as exc:
        raise DeclaredError(f"not TOML: {exc}") from exc
    extra = sorted(set(parsed) - {"servers"})
    if extra:
        raise DeclaredError(f"has {', '.join(extra)} besides servers")
    return f"{base.rstrip()}\n\n{claims.strip()}\n"
