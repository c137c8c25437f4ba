"""The MPS emulator with real processes: the control program, its daemon, server processes,
the driver's own MpsDaemon/MpsControl over SubprocessRunner, and tenant probes.

Every test runs in a private directory under /tmp (short socket paths); every process that
mentions it is killed at the end (``tests.support.mpsemu.private_root``).
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.enforce.mps.control import MpsCommandError
from dra_driver.enforce.mps.daemon import MpsDaemon
from dra_driver.infra.runner import SubprocessRunner
from dra_driver.mpsemu.paths import emulator_path, python_program
from tests.support.mpsemu import Probe, alive, private_root, wait_for

pytestmark = pytest.mark.integration

GPU_A = "GPU-0a0a0a0a-0000-4000-8000-000000000001"
GPU_B = "GPU-0b0b0b0b-0000-4000-8000-000000000002"
CSV = "--format=csv,noheader"


@pytest.fixture
def root() -> Iterator[Path]:
    with private_root() as path:
        yield path


@pytest.fixture(autouse=True)
def visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPS_EMULATOR_VISIBLE_GPUS", GPU_A)


def is_socket(path: Path) -> bool:
    return path.exists() and stat.S_ISSOCK(path.stat().st_mode)


def emu(root: Path, *args: str) -> tuple[int, str, str]:
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(root / "log"),
        "CUDA_MPS_PROTOCOL_VERSION": "3",
    }
    done = SubprocessRunner(timeout=20).run([str(emulator_path()), *args], env=env)
    return done.rc, done.stdout, done.stderr


def daemon_pid(pipe: Path) -> int:
    return int((pipe / "nvidia-cuda-mps-control.pid").read_text())


def test_launchers_are_executable_files_of_the_package() -> None:
    control = emulator_path()
    assert control.name == "nvidia-cuda-mps-control" and os.access(control, os.X_OK)
    assert os.access(control.with_name("nvidia-cuda-mps-server"), os.X_OK)
    # compiled and static (no PT_INTERP program header): it runs in the image as built here
    binary = control.read_bytes()
    assert binary.startswith(b"\x7fELF\x02")  # 64-bit ELF
    phoff = int.from_bytes(binary[32:40], "little")
    size, count = (int.from_bytes(binary[n : n + 2], "little") for n in (54, 56))
    types = [int.from_bytes(binary[phoff + i * size :][:4], "little") for i in range(count)]
    assert types and 3 not in types  # PT_INTERP
    # -I -S: no site-packages or user environment for the Python program behind it
    assert python_program().read_text().startswith("#!/usr/bin/env -S python3 -I -S\n")


def test_control_program_starts_answers_and_quits(root: Path) -> None:
    pipe = root / "pipe"
    assert emu(root, "server", "list") == (1, "", "Cannot find MPS control daemon process\n")
    rc, out, _ = emu(root, "-h")
    assert rc == 0 and "namespace" in out and "server" in out
    assert emu(root, "-p", "3", "-m", "-d")[0] == 0
    pid = daemon_pid(pipe)
    assert alive(pid) and is_socket(pipe / "control")
    assert (root / "log" / "control.log").is_file()
    rc, _, err = emu(root, "-d")
    assert rc == 1 and "already running" in err
    assert emu(root, "server", "list", CSV) == (0, "", "")
    assert emu(root, "namespace", "list", "--server=gpu_9")[2].strip() == "server 'gpu_9' not found"

    # a malformed request, a client that leaves mid-request: answered or dropped, daemon lives
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(pipe / "control"))
        s.sendall(b"{not json\n")
        assert b"malformed request" in s.recv(65536)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(pipe / "control"))
        s.sendall(b"x" * 100_000 + b"\n")
        assert b"longer than" in s.recv(65536)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(pipe / "control"))
        s.sendall(b'{"args": ["server", ')
    assert emu(root, "server", "create", "gpu_0", "--uid=0", f"--allowed-devices={GPU_A}")[0] == 0
    server = int(emu(root, "server", "list", CSV)[1].split(",")[2])
    assert alive(server)
    # the server answers a malformed greeting with an error and goes on serving
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(pipe / "gpu_0" / "control"))
        s.sendall(b"HELLO nope\n")
        assert s.recv(4096).startswith(b"ERROR")
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(pipe / "gpu_0" / "control"))
        s.sendall(b"HELLO 1 raw test\nPING\n")
        welcome = s.recv(4096).decode()
        assert welcome.startswith(f"WELCOME server=gpu_0 server_pid={server} namespace=default")
        rows = emu(root, "client", "list", CSV)[1]
        assert rows == f"{os.getpid()},gpu_0,0,default,raw test\n"  # the peer's PID

    assert emu(root, "-q")[0] == 0
    assert not (pipe / "control").exists() and not (pipe / "nvidia-cuda-mps-control.pid").exists()
    wait_for("daemon and server to exit", lambda: not alive(pid) and not alive(server), 10)
    assert emu(root, "-q") == (1, "", "Cannot find MPS control daemon process\n")


def test_driver_daemon_control_probe_and_crash(root: Path) -> None:
    runner = SubprocessRunner(timeout=20)
    daemon = MpsDaemon(
        "time-slicing", root, runner, binary=str(emulator_path()), check_interval=0.05
    )
    ctl = daemon.control
    assert daemon.ensure_running() is True
    assert daemon.ensure_running() is False
    ctl.server_create("gpu_0", [GPU_A])
    [row] = ctl.server_list()
    assert (row.name, row.status, row.allowed_devices) == ("gpu_0", "Ready", (GPU_A,))
    ctl.namespace_create("c_x", "gpu_0")
    ctl.namespace_set("c_x", "gpu_0", "4096M", 50)
    [ns] = ctl.namespace_list("gpu_0", "c_x")
    assert (ns.pinned_memory_limit, ns.active_thread_percentage) == ("4G", "50")
    ns_dir = Path(ns.pipe_directory)
    assert is_socket(ns_dir / "control")

    tenant = Probe(ns_dir)
    got = tenant.wait_line(lambda f: f.get("state") == "connected", 10)
    assert got["server"] == "gpu_0" and got["server_pid"] == row.pid
    assert (got["namespace"], got["pinned_memory_limit"]) == ("c_x", "4G")
    assert got["active_thread_percentage"] == "50"
    with pytest.raises(MpsCommandError, match="active clients"):
        ctl.namespace_set("c_x", "gpu_0", "1024M", 10)
    [client] = ctl.client_list("gpu_0")
    assert (client.pid, client.server, client.namespace) == (tenant.pid, "gpu_0", "c_x")
    tenant.wait_line(lambda f: f.get("state") == "same", 5)

    old = daemon_pid(daemon.pipe_dir)
    seen = len(tenant.lines)
    os.kill(old, signal.SIGKILL)
    lost = tenant.wait_line(lambda f: f.get("state") == "lost", 5, after=seen)
    assert lost["server_pid"] == row.pid
    wait_for("the server to exit with its daemon", lambda: not alive(int(row.pid)), 5)
    assert is_socket(daemon.pipe_dir / "control")  # stale, as a crashed daemon leaves it
    assert (ns_dir / "control").exists()
    assert not daemon.alive()
    refused = ctl.run("-p", "3", "-m", "-d", check=False)  # control + PID file still there
    assert refused.rc == 1 and "already running" in refused.stderr

    assert daemon.ensure_running() is True
    assert daemon_pid(daemon.pipe_dir) != old and ctl.server_list() == []
    assert tenant.stop() == 0
    assert tenant.raw[-1].endswith("state=stopped")


def test_terminated_client_and_invisible_gpu(root: Path) -> None:
    daemon = MpsDaemon("sm-sharing", root, SubprocessRunner(timeout=20), str(emulator_path()))
    ctl = daemon.control
    daemon.ensure_running()
    ctl.server_create("gpu_0", [GPU_A])
    tenant = Probe(daemon.pipe_dir / "gpu_0")  # the server's own socket: namespace default
    got = tenant.wait_line(lambda f: f.get("state") == "connected", 10)
    assert (got["namespace"], got["pinned_memory_limit"]) == ("default", "unlimited")
    seen = len(tenant.lines)
    ctl.client_terminate(tenant.pid)
    gone = tenant.wait_line(lambda f: f.get("state") != "same", 5, after=seen)
    assert gone["state"] == "terminated" and str(tenant.pid) in gone["reason"]

    ctl.server_create("gpu_1", [GPU_B])  # accepted, then gone: MPS cannot see GPU_B
    wait_for("gpu_1 to vanish", lambda: [r.name for r in ctl.server_list()] == ["gpu_0"], 10)
    assert "no CUDA-capable device is detected" in daemon.server_log_tail("gpu_1")
    assert tenant.stop() == 0
    daemon.stop()
    assert not daemon.pipe_dir.exists()


def test_foreground_daemon_reads_stdin_and_sigterm_quits(root: Path) -> None:
    pipe = root / "pipe"
    env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(root / "log"),
    }
    fg = subprocess.Popen(
        [str(emulator_path()), "-p", "3", "-f"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for("the foreground daemon's socket", lambda: is_socket(pipe / "control"), 10)
        assert emu(root, "server", "create", "gpu_0")[0] == 0  # a client meanwhile
        out, err = fg.communicate("server list --format=csv,noheader\nnamespace bogus\n", 20)
    finally:
        fg.kill()
        fg.wait()
    assert fg.returncode == 0 and out.startswith("gpu_0,0,")  # EOF on stdin: quit
    assert "Unknown command: namespace bogus" in err
    server = int(out.split(",")[2])
    wait_for("the server to end with its daemon", lambda: not alive(server), 5)
    assert not (pipe / "control").exists()

    assert emu(root, "-d")[0] == 0
    pid = daemon_pid(pipe)
    os.kill(pid, signal.SIGTERM)
    wait_for("the daemon to quit on SIGTERM", lambda: not alive(pid), 5)
    assert not (pipe / "control").exists() and not (pipe / "nvidia-cuda-mps-control.pid").exists()


def greet(path: Path, text: str = "HELLO 1 flood") -> tuple[socket.socket, str]:
    """A connection to the socket at ``path`` that said ``text``, and the server's answer."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(str(path))
    s.sendall(text.encode() + b"\n")
    return s, s.recv(4096).decode()


def test_a_server_takes_60_clients_and_refuses_the_61st_as_mps_does(root: Path) -> None:
    """Issue 26, item 2: a real server's client table holds 60 client contexts per device (it
    was 256 here); a client past it fails its context creation and the server logs it."""
    daemon = MpsDaemon("time-slicing", root, SubprocessRunner(timeout=20), str(emulator_path()))
    ctl = daemon.control
    daemon.ensure_running()
    ctl.server_create("gpu_0", [GPU_A])
    ctl.namespace_create("c_a", "gpu_0")
    ctl.namespace_create("c_b", "gpu_0")
    server_dir = daemon.pipe_dir / "gpu_0"
    held = []
    try:
        for i in range(60):  # the table counts the server's clients over all its namespaces
            s, answer = greet(server_dir / ("c_a" if i % 2 else "c_b") / "control")
            held.append(s)
            assert answer.startswith("WELCOME server=gpu_0"), (i, answer)
        assert len(ctl.client_list("gpu_0")) == 60
        late, answer = greet(server_dir / "c_b" / "control")
        assert answer.startswith("ERROR CUDA_ERROR_MPS_MAX_CLIENTS_REACHED: server gpu_0 has 60")
        assert late.recv(4096) == b""  # and closed
        late.close()
        assert "refused on namespace c_b: 60 clients attached" in daemon.server_log_tail("gpu_0")
        tenant = Probe(server_dir / "c_a")  # what a tenant's probe says then
        refused = tenant.wait_line(lambda f: f.get("state") == "rejected", 10)
        assert "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED" in refused["reason"]
        held.pop().close()  # a place frees: the probe's next try (once a second) attaches
        tenant.wait_line(lambda f: f.get("state") == "connected", 10)
        assert tenant.stop() == 0
        assert len(ctl.client_list("gpu_0")) == 59
    finally:
        for s in held:
            s.close()


def test_connections_that_never_say_hello_cannot_exhaust_the_server(root: Path) -> None:
    """The emulator's own protection (not an MPS feature): at most 64 connections wait for
    their HELLO; more are refused at once, and clients attached already keep being served."""
    daemon = MpsDaemon("time-slicing", root, SubprocessRunner(timeout=20), str(emulator_path()))
    daemon.ensure_running()
    daemon.control.server_create("gpu_0", [GPU_A])
    path = daemon.pipe_dir / "gpu_0" / "control"
    attached, answer = greet(path)
    assert answer.startswith("WELCOME")
    silent = []
    try:
        for _ in range(64):
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(path))
            silent.append(s)
        extra, answer = greet(path)
        assert answer.startswith("ERROR emulator: 64 connections already wait for their HELLO")
        extra.close()
        attached.sendall(b"PING\n")
        assert attached.recv(4096).startswith(b"PONG ")
        assert [c.namespace for c in daemon.control.client_list("gpu_0")] == ["default"]
    finally:
        for s in [attached, *silent]:
            s.close()
