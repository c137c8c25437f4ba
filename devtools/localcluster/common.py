"""Where the control plane lives (state directory, binaries, service range, timeouts) and the
helpers every part uses: the log line, the one error type, pid, port and log files, the lock."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


STATE = Path(os.environ.get("LOCAL_CLUSTER_DIR", "/tmp/dra-local-cluster")).absolute()


CACHE = Path(os.environ.get("DRA_DRIVER_CACHE", str(Path.home() / ".cache" / "dra-driver")))


BIN = CACHE / "bin"


COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


SERVICE_CIDR = "10.96.0.0/16"


SERVICE_IP = "10.96.0.1"


NODE_GRACE = os.environ.get("LOCAL_CLUSTER_NODE_GRACE", "1h")


START_TIMEOUT = float(os.environ.get("LOCAL_CLUSTER_START_TIMEOUT", "180"))


STOP_GRACE = 10.0


def log(msg: str) -> None:
    print(f"local-cluster: {msg}", file=sys.stderr, flush=True)


class UpError(Exception):
    pass


def pki(name: str) -> Path:
    return STATE / "pki" / name


def pid_file(comp: str) -> Path:
    return STATE / "run" / f"{comp}.pid"


def log_file(comp: str) -> Path:
    return STATE / "logs" / f"{comp}.log"


def load_ports() -> dict[str, int] | None:
    try:
        data = json.loads((STATE / "ports.json").read_text())
    except (OSError, ValueError):
        return None
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else None


def read_pid(comp: str) -> int | None:
    try:
        return int(pid_file(comp).read_text().strip())
    except (OSError, ValueError):
        return None


def pid_is_ours(pid: int) -> bool:
    """True if pid is alive and is one of our components for this state dir.

    The command line of every component names a file under STATE, which guards
    against a recycled PID."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":  # zombie: exited
        return False
    args = raw.decode(errors="replace").split("\0")
    exe = os.path.basename(args[0]) if args else ""
    return exe in COMPONENTS and any(str(STATE) + "/" in a for a in args)


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


# Processes started by this invocation of `up`. Right after fork, /proc/PID/cmdline is
# still the Python parent's, so for these the Popen object is the source of truth.
STARTED: dict[int, subprocess.Popen[bytes]] = {}


def alive(pid: int) -> bool:
    proc = STARTED.get(pid)
    if proc is not None:
        return proc.poll() is None
    return pid_is_ours(pid)


class Lock:
    """Serializes up/down for one state dir (the lock file sits beside it)."""

    def __enter__(self) -> Lock:
        STATE.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(str(STATE) + ".lock", "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()
