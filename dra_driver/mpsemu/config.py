"""The servers and namespaces of a control daemon's ``-a`` TOML file (pure).

NVIDIA MPS docs, "MPS v3 Configuration File" (Release 615): the file is applied once, when the
daemon starts; ``[servers.<name>]`` declares a server with the keys ``allowed_devices``,
``pinned_memory_limit``, ``active_thread_percentage``, ``client_priority``, ``uid`` and
``locality_domains`` (any other key is a configuration error; ``[[servers.<name>.devices]]``
holds static SM partitions), and ``[servers.<name>.namespaces.<ns>]`` a namespace of it with
``pinned_memory_limit``, ``active_thread_percentage`` and ``client_priority`` (a namespace called
``default`` addresses the server's built-in one). Keys use underscores where the command line
uses dashes (``pinned_memory_limit`` is ``--pinned-memory-limit``).

:func:`declared_servers` turns the parsed file into :class:`DeclaredServer` records whose
options are the command line's (``{"pinned-memory-limit": "4096M"}``), so that the state
machine creates them with the same rules as ``server create`` / ``namespace create`` /
``namespace set``. Static SM partitions (``devices``) are accepted and not emulated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.model.errors import DriverError
from dra_driver.mpsemu.limits import apply_limits, valid_name
from dra_driver.mpsemu.model import DEFAULT_NAMESPACE, Namespace

SERVER_KEYS = frozenset(
    {
        "allowed_devices",
        "pinned_memory_limit",
        "active_thread_percentage",
        "client_priority",
        "uid",
        "locality_domains",
    }
)
"""The keys of a ``[servers.<name>]`` table (Release 615), besides its sub-tables."""
SERVER_TABLES = frozenset({"namespaces", "devices"})
"""The sub-tables of a server: its namespaces and its static SM partitions."""
NAMESPACE_KEYS = frozenset({"pinned_memory_limit", "active_thread_percentage", "client_priority"})
"""The keys of a ``[servers.<name>.namespaces.<ns>]`` table (Release 615)."""
LIMIT_OPTIONS = ("pinned_memory_limit", "active_thread_percentage", "client_priority")
"""Keys that are limits, given to ``namespace set`` / ``server set`` as options."""


class ConfigError(DriverError, ValueError):
    """The file declares something the daemon does not accept; the message says what."""


@dataclass(frozen=True)
class DeclaredServer:
    """One ``[servers.<name>]`` table as command-line options.

    Attributes:
        name: the server's name.
        create: options of ``server create`` (``uid``, ``allowed-devices``).
        limits: options of ``server set`` (its ``default`` namespace), possibly empty.
        namespaces: namespace name -> options of ``namespace set`` (possibly empty), in file
            order; ``default`` included when the file names it.
    """

    name: str
    create: Mapping[str, str]
    limits: Mapping[str, str]
    namespaces: Mapping[str, Mapping[str, str]]


def _text(value: Any, where: str) -> str:
    """A TOML value as the command line would spell it (strings, integers, booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int):
        return str(value)
    raise ConfigError(f"{where}: unsupported value {value!r}")


def _options(table: Mapping[str, Any], keys: tuple[str, ...], where: str) -> dict[str, str]:
    return {k.replace("_", "-"): _text(table[k], f"{where}.{k}") for k in keys if k in table}


def declared_servers(parsed: Mapping[str, Any]) -> list[DeclaredServer]:
    """The servers ``parsed`` (the whole file, as ``tomllib`` reads it) declares, in file order.

    Raises:
        ConfigError: a server or namespace table has a key the Release 615 page does not list,
            or a value that is not a string, integer or boolean.
    """
    servers = parsed.get("servers", {})
    if not isinstance(servers, Mapping):
        raise ConfigError("servers: not a table")
    out = []
    for name, table in servers.items():
        where = f"servers.{name}"
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: not a table")
        unknown = sorted(set(table) - SERVER_KEYS - SERVER_TABLES)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
        spaces = table.get("namespaces", {})
        if not isinstance(spaces, Mapping):
            raise ConfigError(f"{where}.namespaces: not a table")
        namespaces: dict[str, dict[str, str]] = {}
        for ns, keys in spaces.items():
            at = f"{where}.namespaces.{ns}"
            if not isinstance(keys, Mapping):
                raise ConfigError(f"{at}: not a table")
            unknown = sorted(set(keys) - NAMESPACE_KEYS)
            if unknown:
                raise ConfigError(f"{at}: unknown key(s) {', '.join(unknown)}")
            namespaces[str(ns)] = _options(keys, LIMIT_OPTIONS, at)
        out.append(
            DeclaredServer(
                name=str(name),
                create=_options(table, ("uid", "allowed_devices"), where),
                limits=_options(table, LIMIT_OPTIONS, where),
                namespaces=namespaces,
            )
        )
    return out


def check_declared(declared: Sequence[DeclaredServer], multiuser: bool) -> None:
    """Refuse what ``server create`` / ``namespace create`` / ``namespace set`` would refuse.

    Raises:
        ConfigError: a bad or repeated name, a uid other than 0 in multi-user mode, a bad limit.
    """
    for decl in declared:
        if not valid_name(decl.name):
            raise ConfigError(f"servers.{decl.name}: invalid server name")
        uid = decl.create.get("uid", "0")
        if not uid.isdigit() or (multiuser and uid != "0"):
            raise ConfigError(f"servers.{decl.name}: uid {uid} (multi-user mode allows only 0)")
        for name, limits in [(DEFAULT_NAMESPACE, decl.limits), *decl.namespaces.items()]:
            if not valid_name(name):
                raise ConfigError(f"servers.{decl.name}.namespaces.{name}: invalid name")
            error = apply_limits(Namespace(name), limits) if limits else None
            if error:
                raise ConfigError(f"servers.{decl.name}.namespaces.{name}: {error}")
