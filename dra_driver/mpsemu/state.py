"""The MPS control daemon's semantics as a transport-independent state machine.

:class:`MpsState` answers invocations of ``nvidia-cuda-mps-control`` the way the driver sees
the real program answer them (``docs/enforcement.md``): daemons keyed by pipe directory,
protocol 2 or 3, servers, namespaces and their limits, clients, the ``list``/``get`` output
formats and the error texts. Its side effects go through a :class:`~.model.World`; answers are
:class:`~dra_driver.infra.runner.Completed` (rc, stdout, stderr), never exceptions.

Behaviours the driver depends on:

- a server created for a GPU UUID it cannot see is accepted (rc 0) with status
  ``Initializing``, then disappears: after ``vanish_after_lists`` more ``server list`` calls, or
  (``vanish_after_lists=None``) when its world reports it ended;
- ``namespace delete`` and ``server delete`` without ``--force`` are refused while clients are
  attached, and so is ``namespace set`` (the text is the emulator's own);
- a v2-only program lists no v3 modules in ``-h``, refuses ``-p 3`` daemons and calls the v3
  modules unknown commands;
- a new daemon is refused while its pipe directory holds both ``control`` and the PID file;
- the servers and namespaces its ``-a`` file declares (:mod:`dra_driver.mpsemu.config`) exist,
  with their limits, when the daemon starts: each namespace is created with its limits already
  set, so no client ever finds it without them; a key the file may not have, a bad name or a
  bad limit refuses the start (``config error: ...``).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from dra_driver.model.commands import Completed
from dra_driver.mpsemu.config import (
    ConfigError,
    DeclaredServer,
    check_declared,
    declared_servers,
)
from dra_driver.mpsemu.grammar import (
    NO_DAEMON,
    Invocation,
    help_answer,
    precheck,
    split_command,
)
from dra_driver.mpsemu.limits import apply_limits, namespace_rows, threads_text, valid_name
from dra_driver.mpsemu.model import (
    DEFAULT_NAMESPACE,
    PID_FILE,
    Daemon,
    Namespace,
    Server,
    World,
    WorldError,
    mem_text,
)
from dra_driver.mpsemu.wire import CONTROL_SOCKET

"""stderr of a command when no daemon runs at the pipe directory (rc 1)."""
ALREADY_RUNNING = "An instance of this daemon is already running"
"""stderr of a start refused because a daemon (or its ``control`` + PID file) is there."""

Handler = Callable[[Daemon, Sequence[str], dict[str, str], frozenset[str]], Completed]


def _fail(text: str) -> Completed:
    return Completed(1, "", text)


class MpsState:
    """The daemons of one host and the commands they answer.

    Args:
        world: carries out the side effects.
        visible_gpus: UUIDs servers can open; None = every UUID.
        v2_only: behave like a pre-r615 program (protocol 2 only).
        vanish_after_lists: ``server list`` calls that still show a server that cannot open
            its GPU; None = it stays until the world reports it gone.
        server_status: status of healthy servers in ``server list``.
    """

    def __init__(
        self,
        world: World,
        visible_gpus: Iterable[str] | None = None,
        *,
        v2_only: bool = False,
        vanish_after_lists: int | None = 0,
        server_status: str = "Ready",
    ) -> None:
        self.world = world
        self.visible_gpus = None if visible_gpus is None else set(visible_gpus)
        self.v2_only = v2_only
        self.vanish_after_lists = vanish_after_lists
        self.server_status = server_status
        self.daemons: dict[str, Daemon] = {}
        self._handlers: dict[tuple[str, str], Handler] = {
            ("server", "create"): self._server_create,
            ("server", "delete"): self._server_delete,
            ("server", "list"): self._server_list,
            ("server", "set"): self._server_set,
            ("namespace", "create"): self._namespace_create,
            ("namespace", "set"): self._namespace_set,
            ("namespace", "delete"): self._namespace_delete,
            ("namespace", "list"): self._namespace_list,
            ("namespace", "get"): self._namespace_get,
            ("client", "list"): self._client_list,
            ("client", "terminate"): self._client_terminate,
        }

    # invocations ----------------------------------------------------------------------
    def invoke(self, inv: Invocation) -> Completed:
        """Answer one whole invocation (help, start, quit or a command) in process."""
        if inv.has("h"):
            return self.help()
        if inv.has("d") or inv.has("f"):
            return self.start(inv)
        if inv.has("q"):
            return self.quit(inv.pipe)
        return self.precheck(inv.args) or self.command(inv.pipe, inv.args)

    def help(self) -> Completed:
        """``-h``: the usage text (v3 modules listed unless v2-only)."""
        return help_answer(self.v2_only)

    def precheck(self, args: Sequence[str]) -> Completed | None:
        """See :func:`~dra_driver.mpsemu.grammar.precheck`."""
        return precheck(args, self.v2_only)

    def start(self, inv: Invocation) -> Completed:
        """``-d``/``-f``: start the daemon of ``inv.pipe`` (refused when one is there)."""
        if inv.pipe in self.daemons:
            return _fail(ALREADY_RUNNING)
        if inv.protocol not in ("2", "3") or (inv.protocol == "3" and self.v2_only):
            return _fail(f"Unsupported protocol version {inv.protocol}")
        parsed: dict[str, object] = {}
        declared: list[DeclaredServer] = []
        if inv.config:
            try:
                parsed = tomllib.loads(Path(inv.config).read_text())
                declared = declared_servers(parsed)
                check_declared(declared, inv.has("m"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ConfigError) as exc:
                return _fail(f"config error: {exc}")
        pipe = Path(inv.pipe)
        if (pipe / CONTROL_SOCKET).exists() and (pipe / PID_FILE).exists():
            return _fail(ALREADY_RUNNING)
        daemon = Daemon(pipe, Path(inv.log), int(inv.protocol), inv.has("m"), parsed)
        try:
            self.world.daemon_started(daemon)
        except (WorldError, OSError) as exc:
            return _fail(f"Cannot start MPS control daemon: {exc}")
        self.daemons[inv.pipe] = daemon
        self._declare(daemon, declared)
        return Completed(0)

    def _declare(self, d: Daemon, declared: Sequence[DeclaredServer]) -> None:
        """Create the servers and namespaces of the ``-a`` file (checked by
        :func:`~dra_driver.mpsemu.config.check_declared`), each namespace with its limits before
        its socket exists. A server that cannot start is left out, as one made by ``server
        create`` would be."""
        for decl in declared:
            try:
                if not self._server_create(d, [decl.name], dict(decl.create), frozenset()).ok:
                    continue
                server = d.servers[decl.name]
                if decl.limits:
                    self._server_set(d, [decl.name], dict(decl.limits), frozenset())
                for name, limits in decl.namespaces.items():
                    if name == DEFAULT_NAMESPACE:
                        self._server_set(d, [decl.name], dict(limits), frozenset())
                        continue
                    ns = Namespace(name)
                    if limits:
                        apply_limits(ns, limits)
                    self.world.namespace_created(d, server, ns)
                    server.namespaces[name] = ns
            except (WorldError, OSError):
                continue

    def quit(self, pipe: str) -> Completed:
        """``-q``: stop the daemon of ``pipe`` and its servers."""
        if pipe not in self.daemons:
            return _fail(NO_DAEMON)
        gone = self.daemons.pop(pipe)
        try:
            self.world.daemon_stopped(gone)
        except (WorldError, OSError) as exc:
            return _fail(f"daemon stopped, clean-up failed: {exc}")
        return Completed(0)

    def command(self, pipe: str, args: Sequence[str]) -> Completed:
        """Run the v3 command ``args`` (e.g. ``["server", "list"]``) on the daemon of ``pipe``."""
        d = self.daemons.get(pipe)
        if d is None:
            return _fail(NO_DAEMON)
        if d.protocol != 3 or not args:
            return _fail(f"Unrecognized command: {args[0] if args else ''}")
        c = split_command(args)
        handler = self._handlers.get((c.module, c.verb))
        if handler is None:
            return _fail(f"Unknown command: {c.module} {c.verb}")
        try:
            self._observe(d)
            return handler(d, c.pos, dict(c.kv), c.flags)
        except (WorldError, OSError) as exc:
            return _fail(f"{c.module} {c.verb} failed: {exc}")

    # servers --------------------------------------------------------------------------
    def _observe(self, d: Daemon) -> None:
        seen = self.world.observe(d)
        for name in seen.exited:
            if name in d.servers:
                self._drop_server(d, name)
        if seen.clients is not None:
            d.clients = list(seen.clients)

    def _visible_servers(self, d: Daemon) -> list[Server]:
        for s in list(d.servers.values()):
            if s.vanish_in is not None:
                if s.vanish_in <= 0:
                    self._drop_server(d, s.name)
                else:
                    s.vanish_in -= 1
        return list(d.servers.values())

    def _drop_server(self, d: Daemon, name: str) -> None:
        self.world.server_stopped(d, d.servers[name])
        d.servers.pop(name, None)
        d.clients = [c for c in d.clients if c.server != name]

    def _visible(self, device: str) -> bool:
        return self.visible_gpus is None or device in self.visible_gpus

    def _server_create(
        self, d: Daemon, pos: Sequence[str], kv: dict[str, str], flags: frozenset[str]
    ) -> Completed:
        if not pos or not valid_name(pos[0]):
            return _fail("invalid server name")
        name = pos[0]
        if name in d.servers:
            return _fail(f"server {name} already exists")
        uid = kv.get("uid", "0")
        if d.multiuser and uid != "0":
            return _fail("only --uid=0 is allowed in multiuser mode")
        if not uid.isdigit():
            return _fail(f"invalid uid {uid!r}")
        allowed = tuple(x for x in kv.get("allowed-devices", "").split(",") if x)
        server = Server(name, int(uid), 0, allowed, self.server_status)
        visible = all(self._visible(dev) for dev in allowed)
        if not visible:
            server.vanish_in = self.vanish_after_lists
            server.status = "Initializing"
        server.pid = self.world.server_started(d, server, visible)
        d.servers[name] = server
        return Completed(0, f"Server {name} created\n")

    def _server_delete(
        self, d: Daemon, pos: Sequence[str], kv: dict[str, str], flags: frozenset[str]
    ) -> Completed:
        name = pos[0] if pos else ""
        if name not in d.servers:
            return _fail(f"server {name} not found")
        if any(c.server == name for c in d.clients) and "force" not in flags:
            return _fail(f"server {name} has active clients; use --force")
        self._drop_server(d, name)
        return Completed(0)

    def _server_list(
        self, d: Daemon, pos: Sequence[str], kv: dict[str, str], flags: frozenset[str]
    ) -> Completed:
        rows = []
        for s in self._visible_servers(d):
            if pos and s.name != pos[0]:
                continue
            devices = ",".join(s.allowed) or "all"
            rows.append(f"{s.name},{s.uid},{s.pid},{s.status},{d.pipe / s.name},{devices},-")
        return Completed(0, "".join(r + "\n" for r in rows))

    def _server_set(
        self, d: Daemon, pos: Sequence[str], kv: dict[str, str], flags: frozenset[str]
    ) -> Completed:
        name = pos[0] if pos else ""
        if name not in d.servers:
            return _fail(f"server {name} not found")
        server = d.servers[name]
        ns = server.namespaces.setdefault(DEFAULT_NAMESPACE, Namespace(DEFAULT_NAMESPACE))
        return self._set_limits(d, server, ns, kv)

    # namespaces -----------------------------------------------------------------------
    def _set_limits(
        self, d: Daemon, server: Server, ns: Namespace, kv: dict[str, str]
    ) -> Completed:
        error = apply_limits(ns, kv)
        if error:
            return _fail(error)
        self.world.namespace_set(d, server, ns)
        return Completed(0)

    def _server_of(self, d: Daemon, name: str | None) -> Server | None:
        return next((s for s in self._visible_servers(d) if s.name == name), None)

    def _busy(self, d: Daemon, server: str, namespace: str) -> bool:
        return any(c.server == server and c.namespace == namespace for c in d.clients)

    def _namespace_create(
        self, d: Daemon, pos: Sequence[str], kv: dict[str, str], flags: frozenset[str]
    ) -> Completed:
        server = self._server_of(d, kv.get("server"))
        if server is None:
            return _fail(f"server {kv.get('server')!r} not found")
        if not pos or not valid_name(pos[0]) or pos[0] == DEFAULT_NAMESPACE:
            return _fail("invalid namespace name")
        if pos[0] in server.namespaces:
            return _fail(f"namespace {pos[0]} already exists")
        ns = Namespace(pos[0])
        self.world.namespace_created(d, server, ns)
        server.namespaces[ns.name] = ns
        return Completed(0)

    def _namespace_set(
        self, d: Daemon, pos: Sequence[str], kv: dict[str, str], flags: frozenset[str]
    ) -> Completed:
        server = self._server_of(d, kv.get("server"))
        if server is None or not pos or pos[0] not in server.namespaces:
            return _fail("namespace not found")
        if self._busy(d, server.name, pos[0]):
            return _fail(f"namespace {pos[0]} has active clients; cannot set")
        return self._set_limits(d, server, server.namespaces[pos[0]], kv)

    def _namespace_delete(
        self, d: Daemon, pos: Sequence[str], kv: dict[str, str], flags: frozenset[str]
    ) -> Completed:
        server = self._server_of(d, kv.get("server"))
        if server is None or not pos or pos[0] not in server.namespaces:
            return _fail("namespace not found")
        name = pos[0]
        if self._busy(d, server.name, name) and "force" not in flags:
            return _fail(f"namespace {name} has active clients; use --force")
        self.world.namespace_removed(d, server, server.namespaces[name])
        d.clients = [c for c in d.clients if not (c.server == server.name and c.namespace == name)]
        del server.namespaces[name]
        return Completed(0)

    def _namespace_list(
        self, d: Daemon, pos: Sequence[str], kv: dict[str, str], flags: frozenset[str]
    ) -> Completed:
        servers = self._visible_servers(d)
        if "server" in kv:
            servers = [s for s in servers if s.name == kv["server"]]
            if not servers:
                return _fail(f"server {kv['server']!r} not found")
        rows = [r for s in servers for r in namespace_rows(d.pipe, s, pos[0] if pos else None)]
        return Completed(0, "".join(r + "\n" for r in rows))

    def _namespace_get(
        self, d: Daemon, pos: Sequence[str], kv: dict[str, str], flags: frozenset[str]
    ) -> Completed:
        if len(pos) < 3:
            return _fail("usage: namespace get <name> <server> <field>")
        server = next((s for s in self._visible_servers(d) if s.name == pos[1]), None)
        if server is None or pos[0] not in server.namespaces:
            return _fail("namespace not found")
        ns = server.namespaces[pos[0]]
        values = {
            "name": ns.name,
            "server": server.name,
            "pinned-memory-limit": mem_text(ns.pinned),
            "active-thread-percentage": threads_text(ns.threads),
            "client-priority": str(ns.priority),
            "pipe-directory": str(d.pipe / server.name / ns.name),
        }
        if pos[2] not in values:
            return _fail(f"unknown field {pos[2]}")
        return Completed(0, values[pos[2]] + "\n")

    # clients --------------------------------------------------------------------------
    def _client_list(
        self, d: Daemon, pos: Sequence[str], kv: dict[str, str], flags: frozenset[str]
    ) -> Completed:
        self._visible_servers(d)
        rows = [
            f"{c.pid},{c.server},0,{c.namespace},{c.cmd}"
            for c in d.clients
            if "server" not in kv or c.server == kv["server"]
        ]
        if "server" in kv and kv["server"] not in d.servers:
            return _fail(f"server {kv['server']!r} not found")
        return Completed(0, "".join(r + "\n" for r in rows))

    def _client_terminate(
        self, d: Daemon, pos: Sequence[str], kv: dict[str, str], flags: frozenset[str]
    ) -> Completed:
        pid = int(pos[0]) if pos and pos[0].isdigit() else -1
        ending = [c for c in d.clients if c.pid == pid]
        if not ending:
            return _fail(f"client {pid} not found")
        for client in ending:
            self.world.client_terminated(d, client)
        d.clients = [c for c in d.clients if c.pid != pid]
        return Completed(0)
