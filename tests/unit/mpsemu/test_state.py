"""The MPS emulator's state machine against a recording world (no files, no processes)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from dra_driver.model.commands import Completed
from dra_driver.mpsemu.grammar import parse_invocation, split_command
from dra_driver.mpsemu.model import (
    Client,
    Daemon,
    Namespace,
    Observation,
    Server,
    WorldError,
    mem_text,
)
from dra_driver.mpsemu.state import ALREADY_RUNNING, NO_DAEMON, MpsState

GPU = "GPU-a"
PIPE = "/nowhere/pipe"
ENV = {"CUDA_MPS_PIPE_DIRECTORY": PIPE, "CUDA_MPS_PROTOCOL_VERSION": "3"}


class RecordingWorld:
    """Records each call; ``fail`` names a method that raises; ``seen`` is what observe says."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.fail: str | None = None
        self.seen = Observation()
        self._pid = 100

    def last(self) -> tuple[str, ...]:
        """The latest call."""
        return self.calls[-1]

    def _note(self, what: str, *names: str) -> None:
        if self.fail == what:
            raise WorldError(f"{what} failed")
        self.calls.append((what, *names))

    def daemon_started(self, daemon: Daemon) -> None:
        self._note("daemon_started")

    def daemon_stopped(self, daemon: Daemon) -> None:
        self._note("daemon_stopped")

    def server_started(self, daemon: Daemon, server: Server, device_visible: bool) -> int:
        self._note("server_started", server.name, str(device_visible))
        self._pid += 1
        return self._pid

    def server_stopped(self, daemon: Daemon, server: Server) -> None:
        self._note("server_stopped", server.name)

    def namespace_created(self, daemon: Daemon, server: Server, namespace: Namespace) -> None:
        self._note("namespace_created", server.name, namespace.name)

    def namespace_set(self, daemon: Daemon, server: Server, namespace: Namespace) -> None:
        self._note("namespace_set", server.name, namespace.name, mem_text(namespace.pinned))

    def namespace_removed(self, daemon: Daemon, server: Server, namespace: Namespace) -> None:
        self._note("namespace_removed", server.name, namespace.name)

    def client_terminated(self, daemon: Daemon, client: Client) -> None:
        self._note("client_terminated", str(client.pid))

    def observe(self, daemon: Daemon) -> Observation:
        seen, self.seen = self.seen, Observation()
        return seen


def run(state: MpsState, *args: str, env: Mapping[str, str] = ENV) -> Completed:
    return state.invoke(parse_invocation(args, env))


@pytest.fixture
def world() -> RecordingWorld:
    return RecordingWorld()


@pytest.fixture
def state(world: RecordingWorld) -> MpsState:
    s = MpsState(world, {GPU}, vanish_after_lists=None)
    assert run(s, "-p", "3", "-m", "-d").ok
    return s


def test_invocation_grammar() -> None:
    inv = parse_invocation(["-p", "3", "-", "--multiuser", "-a", "x.toml", "-d"], {})
    assert (inv.protocol, inv.config, inv.pipe, inv.args) == ("3", "x.toml", "/tmp/nvidia-mps", ())
    assert inv.has("m") and inv.has("d") and not inv.has("f")
    # the environment's protocol wins over -p (and only "3" selects v3)
    assert parse_invocation(["-p", "3"], {"CUDA_MPS_PROTOCOL_VERSION": "2"}).protocol == "2"
    c = split_command(["namespace", "delete", "c_x", "--server=gpu_0", "--force", "k=v"])
    assert (c.module, c.verb, c.pos) == ("namespace", "delete", ("c_x",))
    assert c.flags == {"force"}
    assert dict(c.kv) == {"server": "gpu_0", "k": "v"}


def test_start_refusals(world: RecordingWorld, tmp_path: Path) -> None:
    s = MpsState(world, None)
    only_pipe = {"CUDA_MPS_PIPE_DIRECTORY": PIPE}
    assert run(s, "-p", "7", "-d", env=only_pipe) == Completed(
        1, "", "Unsupported protocol version 7"
    )
    bad = tmp_path / "bad.toml"
    bad.write_text("[x\n")
    assert "config error" in run(s, "-d", "-a", str(bad)).stderr
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "control").write_text("")
    (pipe / "nvidia-cuda-mps-control.pid").write_text("1")
    assert run(s, "-d", env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}).stderr == ALREADY_RUNNING
    world.fail = "daemon_started"
    done = run(s, "-d")
    assert done.rc == 1 and "daemon_started failed" in done.stderr and s.daemons == {}
    assert run(MpsState(world, None, v2_only=True), "-p", "3", "-d").rc == 1


def test_commands_need_a_v3_daemon(world: RecordingWorld) -> None:
    s = MpsState(world, None)
    assert run(s, "server", "list") == Completed(1, "", NO_DAEMON)
    assert run(s, "-q") == Completed(1, "", NO_DAEMON)
    assert run(s, "server", "help").stdout.startswith("server verbs")
    assert run(s, "-d", env={"CUDA_MPS_PIPE_DIRECTORY": PIPE}).ok  # protocol 2
    assert run(s, "server", "list").stderr == "Unrecognized command: server"


def test_unknown_and_odd_commands_are_errors_not_crashes(state: MpsState) -> None:
    assert run(state).stderr == "no command"
    assert run(state, "drop", "server").stderr == "Unknown command: drop server"
    assert run(state, "server").stderr == "Unknown command: server "
    assert run(state, "server", "create", "Bad-Name").stderr == "invalid server name"
    assert run(state, "server", "create", "s", "--uid=5").stderr.startswith("only --uid=0")
    assert run(state, "client", "terminate", "x").stderr == "client -1 not found"
    assert run(state, "namespace", "get", "a").rc == 1


def test_servers_namespaces_and_their_listings(state: MpsState, world: RecordingWorld) -> None:
    assert run(state, "server", "create", "gpu_0", "--uid=0", f"--allowed-devices={GPU}").ok
    assert world.last() == ("server_started", "gpu_0", "True")
    assert run(state, "namespace", "create", "c_x", "--server=gpu_0").ok
    assert run(state, "namespace", "set", "c_x", "--server=gpu_0", "--pinned-memory-limit=4096M").ok
    assert world.last() == ("namespace_set", "gpu_0", "c_x", "4G")
    assert run(state, "server", "list").stdout == f"gpu_0,0,101,Ready,{PIPE}/gpu_0,{GPU},-\n"
    assert run(state, "namespace", "list", "--server=gpu_0").stdout == (
        f"default,gpu_0,Ready,unlimited,-,0,{PIPE}/gpu_0/default\n"
        f"c_x,gpu_0,Ready,4G,-,0,{PIPE}/gpu_0/c_x\n"
    )
    get = run(state, "namespace", "get", "c_x", "gpu_0", "pinned-memory-limit")
    assert get.stdout == "4G\n"
    assert run(state, "namespace", "create", "c_x", "--server=gpu_0").rc == 1
    assert run(state, "namespace", "create", "default", "--server=gpu_0").rc == 1


def test_a_bad_limit_changes_nothing(state: MpsState, world: RecordingWorld) -> None:
    run(state, "server", "create", "gpu_0")
    run(state, "namespace", "create", "c_x", "--server=gpu_0")
    done = run(
        state,
        "namespace",
        "set",
        "c_x",
        "--server=gpu_0",
        "--pinned-memory-limit=1G",
        "--active-thread-percentage=101",
    )
    assert done.stderr == "invalid active thread percentage '101'"
    ns = state.daemons[PIPE].servers["gpu_0"].namespaces["c_x"]
    assert (ns.pinned, ns.threads) == (None, None)
    assert world.last()[0] == "namespace_created"


def test_world_failure_leaves_records_unchanged(state: MpsState, world: RecordingWorld) -> None:
    run(state, "server", "create", "gpu_0")
    world.fail = "namespace_created"
    done = run(state, "namespace", "create", "c_x", "--server=gpu_0")
    assert done.rc == 1 and "namespace_created failed" in done.stderr
    assert state.daemons[PIPE].servers["gpu_0"].namespaces == {}


def test_observed_clients_make_a_namespace_busy(state: MpsState, world: RecordingWorld) -> None:
    run(state, "server", "create", "gpu_0")
    run(state, "namespace", "create", "c_x", "--server=gpu_0")
    world.seen = Observation(clients=(Client(7, "gpu_0", "c_x", "probe"),))
    refused = run(state, "namespace", "set", "c_x", "--server=gpu_0", "--pinned-memory-limit=1G")
    assert refused.stderr == "namespace c_x has active clients; cannot set"
    assert run(state, "client", "list").stdout == "7,gpu_0,0,c_x,probe\n"
    assert run(state, "server", "delete", "gpu_0").stderr.endswith("use --force")
    assert run(state, "namespace", "delete", "c_x", "--server=gpu_0").rc == 1
    assert run(state, "client", "terminate", "7").ok
    assert world.last() == ("client_terminated", "7")
    assert run(state, "client", "list").stdout == ""  # observe said nothing new: kept


def test_invisible_gpu_server_stays_initializing_until_its_world_says_it_ended(
    state: MpsState, world: RecordingWorld
) -> None:
    assert run(state, "server", "create", "gpu_1", "--allowed-devices=GPU-b").ok
    assert world.last() == ("server_started", "gpu_1", "False")
    assert ",Initializing," in run(state, "server", "list").stdout
    assert ",Initializing," in run(state, "server", "list").stdout
    world.seen = Observation(exited=("gpu_1",))
    assert run(state, "server", "list").stdout == ""
    assert world.last() == ("server_stopped", "gpu_1")


def test_counted_vanish_and_quit(world: RecordingWorld) -> None:
    s = MpsState(world, set(), vanish_after_lists=1)
    run(s, "-p", "3", "-d")
    run(s, "server", "create", "gpu_0", "--allowed-devices=GPU-b")
    assert run(s, "server", "list").stdout.startswith("gpu_0,")
    assert run(s, "server", "list").stdout == ""
    assert run(s, "-q").ok and s.daemons == {}
    assert world.last() == ("daemon_stopped",)


def test_servers_and_namespaces_of_the_config_file_exist_with_limits_at_start(
    world: RecordingWorld, tmp_path: Path
) -> None:
    config = tmp_path / "mps.toml"
    config.write_text(
        'schema_version = "1.0"\n\n'
        f'[servers.gpu_0]\nallowed_devices = "{GPU}"\nuid = 0\n\n'
        '[servers.gpu_0.namespaces.c_x]\npinned_memory_limit = "4096M"\n'
        'active_thread_percentage = "40"\n\n'
        '[servers.gpu_0.namespaces.default]\npinned_memory_limit = "1G"\n'
    )
    s = MpsState(world, {GPU}, vanish_after_lists=None)
    assert run(s, "-p", "3", "-m", "-f", "-a", str(config)).ok
    # the namespace is made once, with its limits: its socket never serves without them
    created = world.calls.index(("namespace_created", "gpu_0", "c_x"))
    assert world.calls[created - 1] == ("server_started", "gpu_0", "True")
    assert s.daemons[PIPE].servers["gpu_0"].namespaces["c_x"].pinned == 4 * 1024**3
    assert run(s, "namespace", "list", "--server=gpu_0").stdout == (
        f"default,gpu_0,Ready,1G,-,0,{PIPE}/gpu_0/default\n"
        f"c_x,gpu_0,Ready,4G,40,0,{PIPE}/gpu_0/c_x\n"
    )
    assert run(s, "server", "list").stdout == f"gpu_0,0,101,Ready,{PIPE}/gpu_0,{GPU},-\n"


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[servers.gpu_0]\ncgroup = 'x'\n", "servers.gpu_0: unknown key(s) cgroup"),
        (
            "[servers.gpu_0.namespaces.c_x]\ncgroup_depth = 1\n",
            "servers.gpu_0.namespaces.c_x: unknown key(s) cgroup_depth",
        ),
        ("[servers.gpu_0]\nuid = 5\n", "multi-user mode allows only 0"),
        ("[servers.Bad]\n", "invalid server name"),
        (
            "[servers.gpu_0.namespaces.c_x]\npinned_memory_limit = '4X'\n",
            "invalid memory value",
        ),
    ],
)
def test_a_config_file_the_daemon_refuses(
    world: RecordingWorld, tmp_path: Path, toml: str, message: str
) -> None:
    config = tmp_path / "mps.toml"
    config.write_text(toml)
    s = MpsState(world, {GPU})
    done = run(s, "-p", "3", "-m", "-d", "-a", str(config))
    assert done.rc == 1 and done.stderr.startswith("config error: ") and message in done.stderr
    assert s.daemons == {} and world.calls == []
