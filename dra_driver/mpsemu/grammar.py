"""How ``nvidia-cuda-mps-control`` reads its command line and environment (pure).

Options come first (``-d``, ``-f``, ``-q``, ``-h``, ``-m``, ``-v``, ``-p <2|3>``, ``-a <toml>``
and their long forms), the v3 command after them: ``<module> <verb> [positional...]
[--key=value ...] [--flag ...]`` (NVIDIA MPS docs, "MPS v3 Interface"). The protocol is
``CUDA_MPS_PROTOCOL_VERSION`` when set (only ``3`` selects v3), else ``-p``, else 2.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dra_driver.model.commands import Completed

PROGRAM = "nvidia-cuda-mps-control"
"""The control program's name."""
NO_DAEMON = "Cannot find MPS control daemon process"
"""What the program answers when no control daemon listens at the pipe directory."""
DEFAULT_PIPE = "/tmp/nvidia-mps"
"""``CUDA_MPS_PIPE_DIRECTORY`` when unset."""
DEFAULT_LOG = "/var/log/nvidia-mps"
"""``CUDA_MPS_LOG_DIRECTORY`` when unset."""

V3_HELP = """Usage: nvidia-cuda-mps-control [OPTIONS] [<module> <verb> ...]
Options: -h/--help -d/--daemon -f/--foreground -m/--multiuser -a/--apply <file>
         -p/--protocol <2|3> -q/--quit -v/--version
Modules: server namespace client device sm-partition feature memacct context-share
"""
V2_HELP = """Usage: nvidia-cuda-mps-control [-d | -f | -v | -S]
Commands (stdin): get_server_list, start_server, shutdown_server, get_client_list, quit
"""
V3_MODULES = ("server", "namespace", "client", "feature")
"""Modules a v2-only program does not know."""

_VALUED = ("-p", "--protocol", "-a", "--apply")


@dataclass(frozen=True)
class Invocation:
    """One parsed invocation.

    Attributes:
        pipe: ``CUDA_MPS_PIPE_DIRECTORY`` (default ``/tmp/nvidia-mps``).
        log: ``CUDA_MPS_LOG_DIRECTORY`` (default ``/var/log/nvidia-mps``).
        protocol: the protocol asked for, as text (``"2"``, ``"3"``, or what ``-p`` said).
        options: option letter -> value (``""`` for flags), e.g. ``{"d": "", "a": "x.toml"}``.
        args: the command after the options, e.g. ``["server", "list"]``.
    """

    pipe: str
    log: str
    protocol: str
    options: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()

    def has(self, letter: str) -> bool:
        """Whether option ``letter`` (``d``, ``f``, ``q``, ``h``, ``m``, ``v``...) was given."""
        return letter in self.options

    @property
    def config(self) -> str | None:
        """The ``-a`` file, or None."""
        return self.options.get("a") or None


def parse_invocation(args: Sequence[str], env: Mapping[str, str]) -> Invocation:
    """Parse the arguments after the program name and the ``CUDA_MPS_*`` environment."""
    rest = list(args)
    options: dict[str, str] = {}
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0)
        letter = flag.lstrip("-")[:1]
        if not letter:
            continue
        options[letter] = (rest.pop(0) if rest else "") if flag in _VALUED else ""
    protocol = "3" if env.get("CUDA_MPS_PROTOCOL_VERSION") == "3" else "2"
    if "p" in options and "CUDA_MPS_PROTOCOL_VERSION" not in env:
        protocol = options["p"] or "2"
    return Invocation(
        pipe=env.get("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_PIPE),
        log=env.get("CUDA_MPS_LOG_DIRECTORY", DEFAULT_LOG),
        protocol=protocol,
        options=options,
        args=tuple(rest),
    )


@dataclass(frozen=True)
class Command:
    """A v3 command split up: ``module verb pos... --key=value... --flag...``.

    Attributes:
        module: e.g. ``namespace``.
        verb: e.g. ``set`` (``""`` when missing).
        pos: positional arguments.
        kv: ``--key=value`` options (also ``key=value``), key without dashes.
        flags: ``--flag`` options without dashes.
    """

    module: str
    verb: str
    pos: tuple[str, ...]
    kv: Mapping[str, str]
    flags: frozenset[str]


def split_command(args: Sequence[str]) -> Command:
    """Split a non-empty v3 command into its parts."""
    rest = list(args[2:])
    kv: dict[str, str] = {}
    for a in rest:
        if "=" in a:
            k, _, v = a.lstrip("-").partition("=")
            kv[k] = v
    return Command(
        module=args[0] if args else "",
        verb=args[1] if len(args) > 1 else "",
        pos=tuple(a for a in rest if "=" not in a and not a.startswith("--")),
        kv=kv,
        flags=frozenset(a[2:] for a in rest if "=" not in a and a.startswith("--")),
    )


def help_answer(v2_only: bool) -> Completed:
    """``-h``: the usage text; a v2-only program lists no v3 modules."""
    return Completed(0, V2_HELP if v2_only else V3_HELP)


def precheck(args: Sequence[str], v2_only: bool) -> Completed | None:
    """The answer to a command that needs no daemon (none given, a v3 module to a v2-only
    program, ``<module> help``), or None when the daemon must answer it."""
    if not args:
        return Completed(1, "", "no command")
    if v2_only and args[0] in V3_MODULES:
        return Completed(1, "", f"Unrecognized command: {args[0]}")
    if len(args) >= 2 and args[1] in ("help", "--help"):
        return Completed(0, f"{args[0]} verbs: create delete list set get\n")
    return None
