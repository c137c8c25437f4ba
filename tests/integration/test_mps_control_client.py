"""The MPS emulator's compiled ``nvidia-cuda-mps-control`` answers as its Python program does.

The compiled client sends plain commands itself and hands every other invocation to the Python
program (``dra_driver/mpsemu/cli.py``): each case runs through both, against the same daemon
(or none), and their exit status, stdout and stderr must be equal. Daemons that answer wrongly
(closing at once, a malformed reply) are sockets of the test's own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dra_driver.infra.runner import SubprocessRunner
from dra_driver.model.commands import Completed
from dra_driver.mpsemu.paths import (
    CLIENT_SOURCE,
    EmulatorBuildError,
    build_client,
    emulator_path,
    python_program,
)
from dra_driver.mpsemu.wire import encode_reply
from tests.support.mpsemu import private_root

pytestmark = pytest.mark.integration

COMMANDS: list[tuple[str, ...]] = [
    ("server", "list"),
    ("server", "list", "--format=csv,noheader"),
    ("namespace", "list", "--server=gpu_9"),
    ("bogus", 'a"b\\c', "tab\there", "line\nbreak", "ünï✓"),
    ("server", "help"),
    ("server",),
    (),
    ("-h",),
]


@pytest.fixture
def root() -> Iterator[Path]:
    with private_root() as path:
        yield path


def env(root: Path) -> dict[str, str]:
    return {
        "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(root / "log"),
        "CUDA_MPS_PROTOCOL_VERSION": "3",
    }


def both(root: Path, *args: str) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    """(compiled, Python) answers to ``args``."""
    answers = []
    for program in (emulator_path(), python_program()):
        done = SubprocessRunner(timeout=20).run([str(program), *args], env=env(root))
        answers.append((done.rc, done.stdout, done.stderr))
    return answers[0], answers[1]


def test_the_compiled_client_answers_as_the_python_program(root: Path) -> None:
    for args in COMMANDS:
        compiled, python = both(root, *args)
        assert compiled == python, args
    assert both(root, "server", "list")[0] == (1, "", "Cannot find MPS control daemon process\n")
    assert SubprocessRunner().run([str(emulator_path()), "-d"], env=env(root)).ok
    for args in COMMANDS:
        compiled, python = both(root, *args)
        assert compiled == python, args
    assert both(root, "bogus", "x")[0][2] == "Unknown command: bogus x\n"
    assert both(root, "server", "list")[0] == (0, "", "")
    assert SubprocessRunner().run([str(emulator_path()), "-q"], env=env(root)).ok


def make_stale(program: Path) -> None:
    """Date ``program`` before its source. Not "an hour before its own time": a binary built
    more than an hour after the source was edited stayed newer (a local run that then
    started a real MPS service and timed out)."""
    before = CLIENT_SOURCE.stat().st_mtime - 60
    os.utime(program, (before, before))


def serve_once(
    path: Path, answer: Callable[[socket.socket], None], read_first: bool = True
) -> threading.Thread:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(1)

    def run() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                if read_first:
                    conn.recv(65536)
                else:
                    time.sleep(0.2)  # the client's request arrives, unread
                answer(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    "reply",
    [b"", b'{"rc": 0, "stdout": "", "stderr": ""}\n', b"0 5 0\nab", b"0 1 1\nabc"],
)
def test_a_daemon_that_answers_wrongly_is_no_answer(root: Path, reply: bytes) -> None:
    (root / "pipe").mkdir()
    for program in (emulator_path(), python_program()):
        thread = serve_once(root / "pipe" / "control", lambda conn: conn.sendall(reply))
        done = SubprocessRunner(timeout=20).run([str(program), "server", "list"], env=env(root))
        thread.join(5)
        (root / "pipe" / "control").unlink()
        assert done.rc == 1 and done.stdout == "", program
        assert done.stderr.startswith("no answer from the MPS control daemon: "), program


def test_an_answer_sent_before_the_request_is_read_comes_through(root: Path) -> None:
    """A busy daemon answers at once and closes without reading the request (a reset follows
    the answer): found by review, both clients then said "no answer"."""
    (root / "pipe").mkdir()
    busy = encode_reply(Completed(1, "", "MPS control daemon busy; retry"))
    for program in (emulator_path(), python_program()):
        answer = serve_once(root / "pipe" / "control", lambda c: c.sendall(busy), read_first=False)
        done = SubprocessRunner(timeout=20).run([str(program), "server", "list"], env=env(root))
        answer.join(5)
        (root / "pipe" / "control").unlink()
        assert (done.rc, done.stderr) == (1, "MPS control daemon busy; retry\n"), program


def test_a_build_that_fails_stops_the_programs_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plugin and the MPS service on simulated GPUs need the emulator's control program: a
    compiler that fails is an error line and exit status 2, not a traceback."""
    program = emulator_path()
    built = program.stat().st_mtime
    make_stale(program)  # rebuilt at start
    try:
        env = {**os.environ, "CC": "false", "PYTHONPATH": str(Path.cwd())}
        for command in ("mps-service", "kubelet-plugin"):
            done = subprocess.run(
                [sys.executable, "-m", "dra_driver", command, "--node-name=n",
                 "--gpus=simulated:H200x1", f"--mps-root={tmp_path}"],
                env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert done.returncode == 2, done.stderr[-2000:]
            assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr
            assert "compiling" in done.stderr
    finally:
        assert emulator_path() == program  # rebuilt
    assert program.stat().st_mtime >= built


def test_a_socket_path_too_long_is_no_daemon(tmp_path: Path) -> None:
    pipe = tmp_path / ("p" * 120)
    done = SubprocessRunner().run([str(emulator_path()), "server", "list"], env=env(pipe.parent))
    assert done.rc == 1
    assert done.stderr.startswith("Cannot find MPS control daemon process")
    pipe_env = {**env(tmp_path), "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    compiled = SubprocessRunner().run([str(emulator_path()), "server", "list"], env=pipe_env)
    python = SubprocessRunner().run([str(python_program()), "server", "list"], env=pipe_env)
    assert compiled.rc == python.rc == 1
    assert (
        compiled.stderr
        == python.stderr
        == ("Cannot find MPS control daemon process (AF_UNIX path too long)\n")
    )


def test_it_is_rebuilt_when_its_source_is_newer_and_a_failed_build_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = emulator_path()
    make_stale(program)
    assert program.stat().st_mtime < CLIENT_SOURCE.stat().st_mtime
    assert emulator_path() == program and program.stat().st_mtime >= CLIENT_SOURCE.stat().st_mtime
    monkeypatch.setenv("CC", "false")
    with pytest.raises(EmulatorBuildError, match="failed"):
        build_client(tmp_path / "x")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(EmulatorBuildError, match="install a C compiler"):
        build_client(tmp_path / "x")
    assert not (tmp_path / "x").exists() and not list(program.parent.glob(".build-*"))
