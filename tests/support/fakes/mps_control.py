"""A fake ``nvidia-cuda-mps-control`` (the grammar of NVIDIA's "MPS v3 Interface") and a fake
NVML facade.

:class:`FakeMpsControl` implements the Runner interface: it answers the argv a real
``subprocess`` call would get, keyed by ``CUDA_MPS_PIPE_DIRECTORY`` (several daemons may run).
It creates and removes the daemon's directories and sockets (as plain files) on the real
filesystem, so tests can check what is left behind.

Failure modes, as ``docs/enforcement.md`` describes them:

- a server created for a UUID MPS cannot see is accepted (rc 0), listed for
  ``vanish_after_lists`` more ``server list`` calls, then gone;
- :meth:`FakeMpsControl.crash`: the daemon dies; servers, namespaces and clients are gone, the
  stale ``control`` socket and namespace directories stay;
- busy clients: ``namespace delete`` without ``--force`` and ``server delete`` without
  ``--force`` are refused while clients are attached, and so is ``namespace set`` (on r615
  drivers it fails once a client is attached, as the maintainers of KAI's gpu-fractioning
  operator measured; the real error text is not known, the fake's is its own);
- ``v2_only``: ``-h`` lists no ``server``/``namespace`` modules, ``-p 3`` daemons are refused
  and modules are unknown commands;
- ``fail(prefix, ...)``: the next matching command fails with the given rc/stderr;
- ``hang(prefix, ...)``: matching commands do not answer: each returns only when the timeout the
  caller gave passes (then rc 124, as :class:`~dra_driver.runner.SubprocessRunner` reports a
  timeout) or when :meth:`FakeMpsControl.release` is called.
"""

from __future__ import annotations

import re
import threading
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dra_driver.mps.nvml import UNLIMITED, CgroupMemory, MpsProcess, NvmlError
from dra_driver.runner import Completed

BINARY = "nvidia-cuda-mps-control"
_NAME = re.compile(r"^[a-z0-9_]{1,64}$")
_MEM = re.compile(r"^([0-9]+)([GMK])$")
_UNIT = {"G": 1024**3, "M": 1024**2, "K": 1024}

V3_HELP = """Usage: nvidia-cuda-mps-control [OPTIONS] [<module> <verb> ...]
Options: -h/--help -d/--daemon -f/--foreground -m/--multiuser -a/--apply <file>
         -p/--protocol <2|3> -q/--quit -v/--version
Modules: server namespace client device sm-partition feature memacct context-share
"""
V2_HELP = """Usage: nvidia-cuda-mps-control [-d | -f | -v | -S]
Commands (stdin): get_server_list, start_server, shutdown_server, get_client_list, quit
"""


def _mem_text(value: int | None) -> str:
    if value is None:
        return "unlimited"
    for suffix, unit in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


@dataclass
class FakeNamespace:
    name: str
    pinned: int | None = None
    threads: int | None = None
    priority: int = 0


@dataclass
class FakeServer:
    name: str
    uid: int
    pid: int
    allowed: tuple[str, ...]
    status: str = "Ready"
    namespaces: dict[str, FakeNamespace] = field(default_factory=dict)
    vanish_in: int | None = None
    """Lists left before the server disappears (wrong UUID), None = stays."""


@dataclass
class FakeClient:
    pid: int
    server: str
    namespace: str
    cmd: str = "python app.py"


@dataclass
class FakeDaemon:
    pipe: Path
    log: Path
    protocol: int
    multiuser: bool
    config: dict[str, object]
    servers: dict[str, FakeServer] = field(default_factory=dict)
    clients: list[FakeClient] = field(default_factory=list)


@dataclass
class _Failure:
    prefix: tuple[str, ...]
    rc: int
    stderr: str
    times: int


class FakeMpsControl:
    """A fake control program behind the Runner interface.

    Args:
        visible_gpus: UUIDs the MPS servers can open (others "vanish" after create).
        v2_only: behave like a pre-r615 binary (protocol 2 only).
        missing: behave as if the program is not installed (rc 127).
        vanish_after_lists: ``server list`` calls that still show a doomed server.
        server_status: status of healthy servers in ``server list``.
    """

    def __init__(
        self,
        visible_gpus: Sequence[str],
        *,
        v2_only: bool = False,
        missing: bool = False,
        vanish_after_lists: int = 0,
        server_status: str = "Ready",
    ) -> None:
        self.visible_gpus = set(visible_gpus)
        self.v2_only = v2_only
        self.missing = missing
        self.vanish_after_lists = vanish_after_lists
        self.server_status = server_status
        self.daemons: dict[str, FakeDaemon] = {}
        self.calls: list[tuple[str, ...]] = []
        self.envs: list[dict[str, str]] = []
        self._failures: list[_Failure] = []
        self._hangs: list[tuple[tuple[str, ...], str | None]] = []
        self._released = threading.Event()
        self._next_pid = 40000

    # test helpers -----------------------------------------------------------------------
    def commands(self, pipe: str | Path | None = None) -> list[str]:
        """Every call as ``"<args...>"`` (binary dropped), optionally for one pipe dir."""
        out = []
        for argv, env in zip(self.calls, self.envs, strict=True):
            if pipe is None or env.get("CUDA_MPS_PIPE_DIRECTORY") == str(pipe):
                out.append(" ".join(argv[1:]))
        return out

    def daemon(self, pipe: str | Path) -> FakeDaemon:
        """The running daemon at ``pipe`` (KeyError if none)."""
        return self.daemons[str(pipe)]

    def crash(self, pipe: str | Path) -> None:
        """Kill the daemon at ``pipe``: its servers, namespaces and clients are gone."""
        d = self.daemons.pop(str(pipe))
        (d.pipe / "nvidia-cuda-mps-control.pid").unlink(missing_ok=True)

    def add_client(
        self, pipe: str | Path, server: str, namespace: str, cmd: str = "python app.py"
    ) -> int:
        """Attach a client to ``server``/``namespace``; returns its PID."""
        d = self.daemon(pipe)
        if namespace != "default" and namespace not in d.servers[server].namespaces:
            raise KeyError(namespace)
        pid = self._pid()
        d.clients.append(FakeClient(pid, server, namespace, cmd))
        return pid

    def fail(
        self, *prefix: str, rc: int = 1, stderr: str = "injected failure", times: int = 1
    ) -> None:
        """Make the next ``times`` commands whose args start with ``prefix`` fail."""
        self._failures.append(_Failure(tuple(prefix), rc, stderr, times))

    def hang(self, *prefix: str, pipe: str | Path | None = None) -> None:
        """Make commands whose args start with ``prefix`` (all: no prefix) hang, for the daemon
        at ``pipe`` only when given, until :meth:`release`."""
        self._released.clear()
        self._hangs.append((tuple(prefix), None if pipe is None else str(pipe)))

    def release(self) -> None:
        """End every hang: waiting commands go on as normal, later ones answer at once."""
        self._hangs.clear()
        self._released.set()

    def _hangs_on(self, args: Sequence[str], pipe: str) -> bool:
        return any(
            tuple(args[: len(prefix)]) == prefix and where in (None, pipe)
            for prefix, where in self._hangs
        )

    # Runner -----------------------------------------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        timeout: float | None = None,
    ) -> Completed:
        """Answer one command as the real program would."""
        env = dict(env or {})
        self.calls.append(tuple(argv))
        self.envs.append(env)
        if self.missing or not argv or Path(argv[0]).name != BINARY:
            return Completed(127, "", f"{argv[0] if argv else '?'}: not found")
        args = list(argv[1:])
        pipe = env.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
        if self._hangs_on(args, pipe) and not self._released.wait(timeout):
            return Completed(124, "", f"{argv[0]}: timed out after {timeout:g} s")
        for f in self._failures:
            if f.times > 0 and tuple(args[: len(f.prefix)]) == f.prefix:
                f.times -= 1
                return Completed(f.rc, "", f.stderr)
        log = env.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
        protocol = 3 if env.get("CUDA_MPS_PROTOCOL_VERSION") == "3" else 2
        opts: dict[str, str] = {}
        while args and args[0].startswith("-"):
            flag = args.pop(0)
            if flag in ("-p", "--protocol", "-a", "--apply"):
                opts[flag.lstrip("-")[0]] = args.pop(0) if args else ""
            else:
                opts[flag.lstrip("-")[0]] = ""
        if "p" in opts and "CUDA_MPS_PROTOCOL_VERSION" not in env:
            protocol = int(opts["p"] or 2)
        if "h" in opts:
            return Completed(0, V2_HELP if self.v2_only else V3_HELP)
        if "d" in opts or "f" in opts:
            return self._start(pipe, log, protocol, "m" in opts, opts.get("a"))
        if "q" in opts:
            if pipe not in self.daemons:
                return Completed(1, "", "Cannot find MPS control daemon process")
            gone = self.daemons.pop(pipe)
            (gone.pipe / "control").unlink(missing_ok=True)
            (gone.pipe / "nvidia-cuda-mps-control.pid").unlink(missing_ok=True)
            return Completed(0)
        if not args:
            return Completed(1, "", "no command")
        if self.v2_only and args[0] in ("server", "namespace", "client", "feature"):
            return Completed(1, "", f"Unrecognized command: {args[0]}")
        if len(args) >= 2 and args[1] in ("help", "--help"):
            return Completed(0, f"{args[0]} verbs: create delete list set get\n")
        d = self.daemons.get(pipe)
        if d is None:
            return Completed(1, "", "Cannot find MPS control daemon process")
        if d.protocol != 3:
            return Completed(1, "", f"Unrecognized command: {args[0]}")
        module, verb, rest = args[0], args[1] if len(args) > 1 else "", args[2:]
        pos = [a for a in rest if "=" not in a and not a.startswith("--")]
        kv = {}
        flags = set()
        for a in rest:
            if "=" in a:
                k, _, v = a.lstrip("-").partition("=")
                kv[k] = v
            elif a.startswith("--"):
                flags.add(a[2:])
        handler = getattr(self, f"_{module.replace('-', '_')}_{verb}", None)
        if handler is None:
            return Completed(1, "", f"Unknown command: {module} {verb}")
        result: Completed = handler(d, pos, kv, flags)
        return result

    # daemon -----------------------------------------------------------------------------
    def _pid(self) -> int:
        self._next_pid += 1
        return self._next_pid

    def _start(
        self, pipe: str, log: str, protocol: int, multiuser: bool, config: str | None
    ) -> Completed:
        if pipe in self.daemons:
            return Completed(1, "", "An instance of this daemon is already running")
        if protocol == 3 and self.v2_only:
            return Completed(1, "", "Unsupported protocol version 3")
        parsed: dict[str, object] = {}
        if config:
            try:
                parsed = tomllib.loads(Path(config).read_text())
            except (OSError, tomllib.TOMLDecodeError) as exc:
                return Completed(1, "", f"config error: {exc}")
        p = Path(pipe)
        if (p / "control").exists() and (p / "nvidia-cuda-mps-control.pid").exists():
            return Completed(1, "", "An instance of this daemon is already running")
        p.mkdir(parents=True, exist_ok=True)
        Path(log).mkdir(parents=True, exist_ok=True)
        (p / "control").write_text("socket")
        (p / "nvidia-cuda-mps-control.pid").write_text(str(self._pid()))
        self.daemons[pipe] = FakeDaemon(p, Path(log), protocol, multiuser, parsed)
        return Completed(0)

    # server -----------------------------------------------------------------------------
    def _visible_servers(self, d: FakeDaemon) -> list[FakeServer]:
        for s in list(d.servers.values()):
            if s.vanish_in is not None:
                if s.vanish_in <= 0:
                    self._drop_server(d, s.name)
                else:
                    s.vanish_in -= 1
        return list(d.servers.values())

    def _drop_server(self, d: FakeDaemon, name: str) -> None:
        d.servers.pop(name, None)
        d.clients = [c for c in d.clients if c.server != name]
        srv = d.pipe / name
        if srv.is_dir():
            for child in sorted(srv.rglob("*"), reverse=True):
                child.rmdir() if child.is_dir() else child.unlink()
            srv.rmdir()

    def _server_create(
        self, d: FakeDaemon, pos: list[str], kv: dict[str, str], flags: set[str]
    ) -> Completed:
        if not pos or not _NAME.match(pos[0]):
            return Completed(1, "", "invalid server name")
        name = pos[0]
        if name in d.servers:
            return Completed(1, "", f"server {name} already exists")
        if d.multiuser and kv.get("uid", "0") != "0":
            return Completed(1, "", "only --uid=0 is allowed in multiuser mode")
        allowed = tuple(x for x in kv.get("allowed-devices", "").split(",") if x)
        server = FakeServer(name, int(kv.get("uid", "0")), self._pid(), allowed, self.server_status)
        if any(dev not in self.visible_gpus for dev in allowed):
            server.vanish_in = self.vanish_after_lists
            server.status = "Initializing"
        d.servers[name] = server
        (d.pipe / name).mkdir(parents=True, exist_ok=True)
        (d.pipe / name / "control").write_text("socket")
        return Completed(0, f"Server {name} created\n")

    def _server_delete(
        self, d: FakeDaemon, pos: list[str], kv: dict[str, str], flags: set[str]
    ) -> Completed:
        name = pos[0] if pos else ""
        if name not in d.servers:
            return Completed(1, "", f"server {name} not found")
        if any(c.server == name for c in d.clients) and "force" not in flags:
            return Completed(1, "", f"server {name} has active clients; use --force")
        self._drop_server(d, name)
        return Completed(0)

    def _server_list(
        self, d: FakeDaemon, pos: list[str], kv: dict[str, str], flags: set[str]
    ) -> Completed:
        rows = []
        for s in self._visible_servers(d):
            if pos and s.name != pos[0]:
                continue
            devices = ",".join(s.allowed) or "all"
            rows.append(f"{s.name},{s.uid},{s.pid},{s.status},{d.pipe / s.name},{devices},-")
        return Completed(0, "".join(r + "\n" for r in rows))

    def _server_set(
        self, d: FakeDaemon, pos: list[str], kv: dict[str, str], flags: set[str]
    ) -> Completed:
        name = pos[0] if pos else ""
        if name not in d.servers:
            return Completed(1, "", f"server {name} not found")
        ns = d.servers[name].namespaces.setdefault("default", FakeNamespace("default"))
        return self._apply_limits(ns, kv)

    # namespace --------------------------------------------------------------------------
    def _apply_limits(self, ns: FakeNamespace, kv: dict[str, str]) -> Completed:
        if not ({"pinned-memory-limit", "active-thread-percentage", "client-priority"} & kv.keys()):
            return Completed(1, "", "set needs at least one option")
        if "pinned-memory-limit" in kv:
            m = _MEM.match(kv["pinned-memory-limit"])
            if not m:
                return Completed(1, "", f"invalid memory value {kv['pinned-memory-limit']!r}")
            ns.pinned = int(m.group(1)) * _UNIT[m.group(2)]
        if "active-thread-percentage" in kv:
            raw = kv["active-thread-percentage"]
            if not raw.isdigit() or not 1 <= int(raw) <= 100:
                return Completed(1, "", f"invalid active thread percentage {raw!r}")
            ns.threads = int(raw)
        return Completed(0)

    def _server_of(self, d: FakeDaemon, kv: dict[str, str]) -> FakeServer | None:
        return next((s for s in self._visible_servers(d) if s.name == kv.get("server")), None)

    def _namespace_create(
        self, d: FakeDaemon, pos: list[str], kv: dict[str, str], flags: set[str]
    ) -> Completed:
        server = self._server_of(d, kv)
        if server is None:
            return Completed(1, "", f"server {kv.get('server')!r} not found")
        if not pos or not _NAME.match(pos[0]) or pos[0] == "default":
            return Completed(1, "", "invalid namespace name")
        if pos[0] in server.namespaces:
            return Completed(1, "", f"namespace {pos[0]} already exists")
        server.namespaces[pos[0]] = FakeNamespace(pos[0])
        ns_dir = d.pipe / server.name / pos[0]
        ns_dir.mkdir(parents=True, exist_ok=True)
        (ns_dir / "control").write_text("socket")
        return Completed(0)

    def _namespace_set(
        self, d: FakeDaemon, pos: list[str], kv: dict[str, str], flags: set[str]
    ) -> Completed:
        server = self._server_of(d, kv)
        if server is None or not pos or pos[0] not in server.namespaces:
            return Completed(1, "", "namespace not found")
        if any(c.server == server.name and c.namespace == pos[0] for c in d.clients):
            return Completed(1, "", f"namespace {pos[0]} has active clients; cannot set")
        return self._apply_limits(server.namespaces[pos[0]], kv)

    def _namespace_delete(
        self, d: FakeDaemon, pos: list[str], kv: dict[str, str], flags: set[str]
    ) -> Completed:
        server = self._server_of(d, kv)
        if server is None or not pos or pos[0] not in server.namespaces:
            return Completed(1, "", "namespace not found")
        name = pos[0]
        if any(c.server == server.name and c.namespace == name for c in d.clients):
            if "force" not in flags:
                return Completed(1, "", f"namespace {name} has active clients; use --force")
            d.clients = [
                c for c in d.clients if not (c.server == server.name and c.namespace == name)
            ]
        del server.namespaces[name]
        ns_dir = d.pipe / server.name / name
        (ns_dir / "control").unlink(missing_ok=True)
        if ns_dir.is_dir():
            ns_dir.rmdir()
        return Completed(0)

    def _namespace_list(
        self, d: FakeDaemon, pos: list[str], kv: dict[str, str], flags: set[str]
    ) -> Completed:
        servers = self._visible_servers(d)
        if "server" in kv:
            servers = [s for s in servers if s.name == kv["server"]]
            if not servers:
                return Completed(1, "", f"server {kv['server']!r} not found")
        rows = []
        for s in servers:
            spaces = [FakeNamespace("default"), *s.namespaces.values()]
            if "default" in s.namespaces:
                spaces = list(s.namespaces.values())
                spaces.sort(key=lambda n: n.name != "default")
            for ns in spaces:
                if pos and ns.name != pos[0]:
                    continue
                pipe = d.pipe / s.name / ns.name
                threads = "-" if ns.threads is None else str(ns.threads)
                rows.append(
                    f"{ns.name},{s.name},{s.status},{_mem_text(ns.pinned)},{threads},{ns.priority},{pipe}"
                )
        return Completed(0, "".join(r + "\n" for r in rows))

    def _namespace_get(
        self, d: FakeDaemon, pos: list[str], kv: dict[str, str], flags: set[str]
    ) -> Completed:
        if len(pos) < 3:
            return Completed(1, "", "usage: namespace get <name> <server> <field>")
        server = next((s for s in self._visible_servers(d) if s.name == pos[1]), None)
        if server is None or pos[0] not in server.namespaces:
            return Completed(1, "", "namespace not found")
        ns = server.namespaces[pos[0]]
        values = {
            "name": ns.name,
            "server": server.name,
            "pinned-memory-limit": _mem_text(ns.pinned),
            "active-thread-percentage": "-" if ns.threads is None else str(ns.threads),
            "client-priority": str(ns.priority),
            "pipe-directory": str(d.pipe / server.name / ns.name),
        }
        if pos[2] not in values:
            return Completed(1, "", f"unknown field {pos[2]}")
        return Completed(0, values[pos[2]] + "\n")

    # client -----------------------------------------------------------------------------
    def _client_list(
        self, d: FakeDaemon, pos: list[str], kv: dict[str, str], flags: set[str]
    ) -> Completed:
        self._visible_servers(d)
        rows = [
            f"{c.pid},{c.server},0,{c.namespace},{c.cmd}"
            for c in d.clients
            if "server" not in kv or c.server == kv["server"]
        ]
        if "server" in kv and kv["server"] not in d.servers:
            return Completed(1, "", f"server {kv['server']!r} not found")
        return Completed(0, "".join(r + "\n" for r in rows))

    def _client_terminate(
        self, d: FakeDaemon, pos: list[str], kv: dict[str, str], flags: set[str]
    ) -> Completed:
        pid = int(pos[0]) if pos and pos[0].isdigit() else -1
        if all(c.pid != pid for c in d.clients):
            return Completed(1, "", f"client {pid} not found")
        d.clients = [c for c in d.clients if c.pid != pid]
        return Completed(0)


@dataclass
class FakeGpuState:
    total: int
    used: int = 0
    compute_mode: str = "DEFAULT"
    processes: list[MpsProcess] = field(default_factory=list)


class FakeNvml:
    """A fake :class:`~dra_driver.mps.nvml.NvmlFacade` with per-cgroup limits.

    Args:
        gpus: UUID -> total memory in bytes.
        require_cgroup_dirs: ``set_cgroup_limits`` fails ("not found") for a path that is not
            an existing directory (as NVML does for a cgroup without dmem files).
    """

    def __init__(self, gpus: Mapping[str, int], require_cgroup_dirs: bool = False) -> None:
        self.gpus = {u: FakeGpuState(total) for u, total in gpus.items()}
        self.cgroups: dict[tuple[str, str], CgroupMemory] = {}
        self.require_cgroup_dirs = require_cgroup_dirs
        self.fail_set_compute_mode = False
        self.calls: list[tuple[object, ...]] = []

    def _gpu(self, uuid: str) -> FakeGpuState:
        if uuid not in self.gpus:
            raise NvmlError(f"nvmlDeviceGetHandleByUUID: Not Found ({uuid})")
        return self.gpus[uuid]

    def has_gpu(self, uuid: str) -> bool:
        return uuid in self.gpus

    def compute_mode(self, uuid: str) -> str:
        return self._gpu(uuid).compute_mode

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        self.calls.append(("set_compute_mode", uuid, mode))
        if self.fail_set_compute_mode:
            raise NvmlError("nvmlDeviceSetComputeMode: Insufficient Permissions")
        self._gpu(uuid).compute_mode = mode

    def cgroup_memory(self, uuid: str, cgroup: str) -> CgroupMemory:
        self._gpu(uuid)
        return self.cgroups.get((uuid, cgroup), CgroupMemory(0, UNLIMITED, 0))

    def set_cgroup_limits(self, uuid: str, cgroup: str, soft_bytes: int, hard_bytes: int) -> None:
        self.calls.append(("set_cgroup_limits", uuid, cgroup, soft_bytes, hard_bytes))
        self._gpu(uuid)
        if self.require_cgroup_dirs and not Path(cgroup).is_dir():
            raise NvmlError("nvmlDeviceSetMemoryLimits_v1: Not Found")
        used = self.cgroups.get((uuid, cgroup), CgroupMemory(0, UNLIMITED, 0)).used_bytes
        self.cgroups[(uuid, cgroup)] = CgroupMemory(soft_bytes, hard_bytes, used)

    def mps_processes(self, uuid: str) -> list[MpsProcess]:
        return list(self._gpu(uuid).processes)
