"""A fake ``nvidia-cuda-mps-control`` (the grammar of NVIDIA's "MPS v3 Interface") and a fake
NVML facade.

:class:`FakeMpsControl` implements the Runner interface over the emulator's state machine
(:class:`dra_driver.mpsemu.state.MpsState`, which defines the commands, their output and their
errors): it answers the argv a real ``subprocess`` call would get, keyed by
``CUDA_MPS_PIPE_DIRECTORY`` (several daemons may run). Its world, :class:`FileWorld`, creates
and removes the daemon's directories and sockets (as plain files) on the real filesystem, so
tests can check what is left behind; servers and clients exist only in memory.

Failure modes, as ``docs/enforcement.md`` describes them (the state machine's):

- a server created for a UUID MPS cannot see is accepted (rc 0), listed for
  ``vanish_after_lists`` more ``server list`` calls, then gone;
- busy clients: ``namespace delete`` without ``--force`` and ``server delete`` without
  ``--force`` are refused while clients are attached, and so is ``namespace set`` (on r615
  drivers it fails once a client is attached, as the maintainers of KAI's gpu-fractioning
  operator measured; the real error text is not known, the emulator's is its own);
- ``v2_only``: ``-h`` lists no ``server``/``namespace`` modules, ``-p 3`` daemons are refused
  and modules are unknown commands.

Test-only helpers:

- :meth:`FakeMpsControl.crash`: the daemon dies; servers, namespaces and clients are gone, the
  stale ``control`` socket and namespace directories stay;
- :meth:`FakeMpsControl.add_client`: a client attaches (no process);
- ``fail(prefix, ...)``: the next matching command fails with the given rc/stderr;
- ``hang(prefix, ...)``: matching commands do not answer: each returns only when the timeout the
  caller gave passes (then rc 124, as :class:`~dra_driver.infra.runner.SubprocessRunner` reports a
  timeout) or when :meth:`FakeMpsControl.release` is called.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dra_driver.enforce.mps.nvmlcontrol import UNLIMITED, CgroupMemory, MpsProcess, NvmlError
from dra_driver.model.commands import Completed
from dra_driver.mpsemu.grammar import DEFAULT_PIPE, PROGRAM, parse_invocation
from dra_driver.mpsemu.model import (
    DEFAULT_NAMESPACE,
    PID_FILE,
    Client,
    Daemon,
    Namespace,
    Observation,
    Server,
)
from dra_driver.mpsemu.state import MpsState
from dra_driver.mpsemu.wire import CONTROL_SOCKET

BINARY = PROGRAM


class FileWorld:
    """The fake's world: directories and plain files where sockets would be, invented PIDs."""

    def __init__(self) -> None:
        self._next_pid = 40000

    def next_pid(self) -> int:
        """A new invented PID (40001, 40002, ...)."""
        self._next_pid += 1
        return self._next_pid

    def daemon_started(self, daemon: Daemon) -> None:
        daemon.pipe.mkdir(parents=True, exist_ok=True)
        daemon.log.mkdir(parents=True, exist_ok=True)
        (daemon.pipe / CONTROL_SOCKET).write_text("socket")
        (daemon.pipe / PID_FILE).write_text(str(self.next_pid()))

    def daemon_stopped(self, daemon: Daemon) -> None:
        (daemon.pipe / CONTROL_SOCKET).unlink(missing_ok=True)
        (daemon.pipe / PID_FILE).unlink(missing_ok=True)

    def server_started(self, daemon: Daemon, server: Server, device_visible: bool) -> int:
        pid = self.next_pid()
        (daemon.pipe / server.name).mkdir(parents=True, exist_ok=True)
        (daemon.pipe / server.name / CONTROL_SOCKET).write_text("socket")
        return pid

    def server_stopped(self, daemon: Daemon, server: Server) -> None:
        srv = daemon.pipe / server.name
        if srv.is_dir():
            for child in sorted(srv.rglob("*"), reverse=True):
                child.rmdir() if child.is_dir() else child.unlink()
            srv.rmdir()

    def namespace_created(self, daemon: Daemon, server: Server, namespace: Namespace) -> None:
        ns_dir = daemon.pipe / server.name / namespace.name
        ns_dir.mkdir(parents=True, exist_ok=True)
        (ns_dir / CONTROL_SOCKET).write_text("socket")

    def namespace_set(self, daemon: Daemon, server: Server, namespace: Namespace) -> None:
        return None

    def namespace_removed(self, daemon: Daemon, server: Server, namespace: Namespace) -> None:
        ns_dir = daemon.pipe / server.name / namespace.name
        (ns_dir / CONTROL_SOCKET).unlink(missing_ok=True)
        if ns_dir.is_dir():
            ns_dir.rmdir()

    def client_terminated(self, daemon: Daemon, client: Client) -> None:
        return None

    def observe(self, daemon: Daemon) -> Observation:
        return Observation()


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
        self.world = FileWorld()
        self.state = MpsState(
            self.world,
            set(visible_gpus),
            v2_only=v2_only,
            vanish_after_lists=vanish_after_lists,
            server_status=server_status,
        )
        self.missing = missing
        self.calls: list[tuple[str, ...]] = []
        self.envs: list[dict[str, str]] = []
        self._failures: list[_Failure] = []
        self._hangs: list[tuple[tuple[str, ...], str | None]] = []
        self._released = threading.Event()

    @property
    def daemons(self) -> dict[str, Daemon]:
        """Running daemons by pipe directory (the state machine's own dict)."""
        return self.state.daemons

    @property
    def visible_gpus(self) -> set[str]:
        """UUIDs the servers can open (the state machine's own set: tests may change it)."""
        assert self.state.visible_gpus is not None
        return self.state.visible_gpus

    # test helpers -----------------------------------------------------------------------
    def commands(self, pipe: str | Path | None = None) -> list[str]:
        """Every call as ``"<args...>"`` (binary dropped), optionally for one pipe dir."""
        out = []
        for argv, env in zip(self.calls, self.envs, strict=True):
            if pipe is None or env.get("CUDA_MPS_PIPE_DIRECTORY") == str(pipe):
                out.append(" ".join(argv[1:]))
        return out

    def daemon(self, pipe: str | Path) -> Daemon:
        """The running daemon at ``pipe`` (KeyError if none)."""
        return self.daemons[str(pipe)]

    def crash(self, pipe: str | Path) -> None:
        """Kill the daemon at ``pipe``: its servers, namespaces and clients are gone."""
        d = self.daemons.pop(str(pipe))
        (d.pipe / PID_FILE).unlink(missing_ok=True)

    def add_client(
        self, pipe: str | Path, server: str, namespace: str, cmd: str = "python app.py"
    ) -> int:
        """Attach a client to ``server``/``namespace``; returns its PID."""
        d = self.daemon(pipe)
        if namespace != DEFAULT_NAMESPACE and namespace not in d.servers[server].namespaces:
            raise KeyError(namespace)
        pid = self.world.next_pid()
        d.clients.append(Client(pid, server, namespace, cmd))
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
        pipe = env.get("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_PIPE)
        if self._hangs_on(args, pipe) and not self._released.wait(timeout):
            return Completed(124, "", f"{argv[0]}: timed out after {timeout:g} s")
        for f in self._failures:
            if f.times > 0 and tuple(args[: len(f.prefix)]) == f.prefix:
                f.times -= 1
                return Completed(f.rc, "", f.stderr)
        return self.state.invoke(parse_invocation(args, env))


@dataclass
class FakeGpuState:
    total: int
    used: int = 0
    compute_mode: str = "DEFAULT"
    processes: list[MpsProcess] = field(default_factory=list)
    sm_utilization: dict[int, float] = field(default_factory=dict)


class FakeNvml:
    """A fake :class:`~dra_driver.enforce.mps.nvmlcontrol.NvmlFacade` with per-cgroup limits.

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

    def process_sm_utilization(self, uuid: str) -> dict[int, float]:
        return dict(self._gpu(uuid).sm_utilization)
