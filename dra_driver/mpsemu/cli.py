"""The emulated ``nvidia-cuda-mps-control`` command line.

- ``-h``: usage (v3 modules); ``-d``: start a daemon in the background and report whether it
  started (rc and error as the state machine answers them); ``-f``: run the daemon in the
  foreground; ``-q``: ask the daemon to quit;
- anything else is a client: the command goes to ``$CUDA_MPS_PIPE_DIRECTORY/control`` and the
  daemon's answer is printed (stdout, stderr) with its rc; with no daemon there, ``Cannot find
  MPS control daemon process`` and rc 1.

This is the Python program (``bin/nvidia-cuda-mps-control-py``) and the reference for every
answer. The program the driver runs per MPS command is the compiled client
(``control_client.c``), which sends plain commands itself, as this module does, and hands
everything else to this one. A client here still imports only what it needs (the grammar and
the wire); the daemon's modules load for ``-d`` and ``-f`` only.
"""

from __future__ import annotations

import errno
import os
import sys

from dra_driver.model.commands import Completed
from dra_driver.mpsemu.grammar import NO_DAEMON, help_answer, parse_invocation, precheck
from dra_driver.mpsemu.wire import (
    CONTROL_SOCKET,
    HEADER_LIMIT,
    MAX_REPLY,
    Request,
    WireError,
    call,
    decode_reply,
)

TYPE_CHECKING = False
"""Not ``typing.TYPE_CHECKING``: importing ``typing`` alone costs a client ~10 ms per command
(mypy treats a module constant of this name the same)."""
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Sequence

READY_FD_ENV = "_MPS_EMULATOR_READY_FD"
"""Set by ``-d`` for the daemon process it starts: the pipe on which that reports its start."""
CLIENT_TIMEOUT_S = 30.0
"""Seconds a client waits for the daemon's answer."""
START_TIMEOUT_S = 15.0
"""Seconds ``-d`` waits for the new daemon to report."""


def control_main(argv: Sequence[str]) -> int:
    """Run the program with the arguments after its name; returns the exit status."""
    inv = parse_invocation(argv, os.environ)
    if inv.has("h"):
        return _emit(help_answer(v2_only=False))
    if inv.has("d"):
        ready = os.environ.pop(READY_FD_ENV, None)
        if ready is not None and ready.isdigit():
            from dra_driver.mpsemu.daemon import run_detached

            return run_detached(inv, int(ready))
        return _emit(start_detached(argv, inv.log))
    if inv.has("f"):
        from dra_driver.mpsemu.daemon import run_foreground

        return run_foreground(inv)
    if inv.has("q"):
        return _emit(ask(inv.pipe, Request(quit=True)))
    early = precheck(inv.args, v2_only=False)
    return _emit(early or ask(inv.pipe, Request(args=inv.args)))


def ask(pipe: str, request: Request) -> Completed:
    """The daemon's answer to ``request`` (rc 1 with the reason when there is none)."""
    try:
        return call(os.path.join(pipe, CONTROL_SOCKET), request, CLIENT_TIMEOUT_S)
    except WireError as exc:
        return Completed(1, "", f"no answer from the MPS control daemon: {exc}")
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR):
            return Completed(1, "", NO_DAEMON)
        return Completed(1, "", f"{NO_DAEMON} ({exc})")


def start_detached(argv: Sequence[str], log_dir: str) -> Completed:
    """Start this program again as a daemon in its own session (stdio detached, stderr to
    ``<log>/control.log``) and return what it reports within :data:`START_TIMEOUT_S`."""
    import subprocess
    from pathlib import Path

    from dra_driver.mpsemu.paths import python_program

    log = Path(log_dir)
    read_end, write_end = os.pipe()
    try:
        log.mkdir(parents=True, exist_ok=True)
        with (log / "control.log").open("ab") as errors:
            proc = subprocess.Popen(
                [sys.executable, str(python_program()), *argv],
                env={**os.environ, READY_FD_ENV: str(write_end)},
                pass_fds=(write_end,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                start_new_session=True,
            )
    except OSError as exc:
        os.close(read_end)
        return Completed(1, "", f"Cannot start MPS control daemon: {exc}")
    finally:
        os.close(write_end)
    try:
        report = _read_report(read_end)
    finally:
        os.close(read_end)
    try:
        done = decode_reply(report) if report else None
    except WireError as exc:
        done = Completed(1, "", f"MPS control daemon start: {exc}")
    if done is not None:
        if not done.ok:
            _reap(proc)
        return done
    rc = proc.poll()
    if rc is None:
        proc.kill()
        proc.wait()
        return Completed(1, "", f"MPS control daemon did not report within {START_TIMEOUT_S:g} s")
    return Completed(1, "", f"MPS control daemon exited at start (rc {rc}); see {log}")


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Wait for a daemon process that refused to start (it exits at once)."""
    import subprocess

    try:
        proc.wait(START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _read_report(fd: int) -> bytes:
    """What the starting daemon wrote on its ready pipe before closing it (a reply), or what
    came within :data:`START_TIMEOUT_S`."""
    import select
    import time

    data = b""
    deadline = time.monotonic() + START_TIMEOUT_S
    while len(data) <= MAX_REPLY + HEADER_LIMIT:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data


def _emit(done: Completed) -> int:
    if done.stdout:
        sys.stdout.write(done.stdout)
        sys.stdout.flush()
    if done.stderr:
        sys.stderr.write(done.stderr.rstrip("\n") + "\n")
        sys.stderr.flush()
    return done.rc
