"""Helpers of the MPS emulator's integration tests: waiting for conditions, the processes a
test started (found by its private directory) and a running tenant probe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

from dra_driver.mpsemu import probe
from tests.support.waiting import wait_for

T = TypeVar("T")


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie nobody reaps counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def processes_mentioning(marker: str) -> list[int]:
    """Live processes whose command line or environment contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in text and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@contextmanager
def private_root() -> Iterator[Path]:
    """A short directory under /tmp (socket paths must stay under 108 bytes); on exit every
    process that mentions it is killed and the directory removed."""
    root = Path(tempfile.mkdtemp(prefix="mpse", dir="/tmp"))
    try:
        yield root
    finally:
        for pid in processes_mentioning(str(root)):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for("test processes to end", lambda: not processes_mentioning(str(root)), 10)
        subprocess.run(["rm", "-rf", str(root)], check=False)


class LineReader:
    """A process whose output lines (stdout and stderr) are collected as they come, in
    :attr:`raw`, each also passed to :meth:`_line`."""

    def __init__(self, argv: list[str], env: Mapping[str, str] | None = None) -> None:
        self.raw: list[str] = []
        self.proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.raw.append(line.rstrip("\n"))
            self._line(line)

    def _line(self, line: str) -> None:
        """What a subclass makes of each line (nothing more here)."""


class Probe(LineReader):
    """A running tenant probe (``python3 probe.py``) whose lines are collected as they come.

    Args:
        pipe: the ``CUDA_MPS_PIPE_DIRECTORY`` it connects through.
        env: more environment (the marker of :func:`private_root` must be in it or in pipe).
        args: its arguments (``--use-memory 2Gi --use-sm 40``).
    """

    def __init__(
        self, pipe: Path, env: Mapping[str, str] | None = None, args: Sequence[str] = ()
    ) -> None:
        self.lines: list[dict[str, str]] = []
        super().__init__(
            [sys.executable, probe.__file__, *args],
            {**os.environ, **(env or {}), "CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
        )

    def _line(self, line: str) -> None:
        self.lines.append(probe.parse_line(line))

    def wait_line(
        self, predicate: Callable[[dict[str, str]], bool], timeout: float, after: int = 0
    ) -> dict[str, str]:
        """The first line from index ``after`` on that matches ``predicate``."""
        return wait_for(
            f"a matching probe line; got {self.raw[after:]}",
            lambda: next((f for f in self.lines[after:] if predicate(f)), None),
            timeout,
        )

    def stop(self) -> int:
        """SIGTERM; the exit status (it must stop within 5 s)."""
        self.proc.terminate()
        rc = self.proc.wait(5)
        self._reader.join(5)
        return rc


_HOLD = r"""
import os, select, socket, sys
path, count = sys.argv[1], int(sys.argv[2])
socks = []
for _ in range(count):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(("HELLO %d flood\n" % os.getpid()).encode())
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = s.recv(4096)
        if not chunk:
            break
        answer += chunk
    print(answer.decode().strip() or "closed", flush=True)
    socks.append(s)
while socks:
    for s in select.select(socks, [], [])[0]:
        data = s.recv(4096)
        if data:
            print(data.decode().strip(), flush=True)
        else:
            socks.remove(s)
            s.close()
"""


class HeldClients(LineReader):
    """A process that attaches ``count`` clients to the MPS socket at ``path`` (``HELLO``),
    one after the other, and holds them; every line the server sends it is collected
    (``WELCOME ...`` per client, then ``TERMINATED ...`` for each one ended). All its clients
    have its PID, as all the contexts of one CUDA process do.

    Args:
        path: a namespace's ``control`` socket (the marker of :func:`private_root` in it).
        count: clients to attach.
    """

    def __init__(self, path: Path, count: int = 1) -> None:
        self.count = count
        super().__init__([sys.executable, "-c", _HOLD, str(path), str(count)])
        self.lines = self.raw

    def answered(self, timeout: float = 10.0) -> list[str]:
        """The server's answers to the ``count`` greetings, once all came."""
        return wait_for(
            f"answers to {self.count} greetings; got {self.lines}",
            lambda: self.lines[: self.count] if len(self.lines) >= self.count else None,
            timeout,
        )

    def terminated(self) -> int:
        """How many of its clients the server said it terminated."""
        return sum(1 for line in self.lines if line.startswith("TERMINATED"))

    def stop(self) -> None:
        """Kill the process (its clients detach)."""
        self.proc.kill()
        self.proc.wait(5)
