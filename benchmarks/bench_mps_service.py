"""Benchmark the MPS node service's start time and memory against a bare interpreter.

Baseline, measured in the same run and interleaved with the service's samples: a Python
interpreter of the same virtualenv that imports nothing (``python -c`` waiting on stdin), its
time to first output and its RSS. Service: ``dra-driver mps-service`` on simulated GPUs (the
MPS emulator as ``nvidia-cuda-mps-control``, one control daemon per compute mode), its time
from exec until ``<root>/mps/service.json`` lists every mode's daemon alive, then its own RSS
and the RSS of its daemons (processes it started), read from ``/proc/<pid>/status`` (VmRSS),
then SIGTERM and the time until it exited.

On a GPU node the daemons are NVIDIA's programs and their RSS differs; the service's own
process is the same Python code. Run: ``.venv/bin/python benchmarks/bench_mps_service.py
[--runs 10] [--gpus simulated:H200x8]``; ``--smoke`` runs once (``make test`` does, numbers
not checked). The last line is ``mps_service_start_ratio_to_interpreter: <number>``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dra_driver.enforce import state_path  # noqa: E402
from dra_driver.model.vocabulary import COMPUTE_MODES  # noqa: E402

MIB = 1024 * 1024
READY_TIMEOUT_S = 60.0


def rss_bytes(pid: int) -> int:
    """VmRSS of ``pid`` in bytes (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (``/proc/<pid>/task/*/children``)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    todo, seen = children(pid), []
    while todo:
        child = todo.pop()
        seen.append(child)
        todo += children(child)
    return seen


def baseline() -> tuple[float, int]:
    """Seconds until a bare interpreter answers, and its RSS in bytes."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-S", "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    proc.stdout.readline()
    seconds = time.monotonic() - t0
    rss = rss_bytes(proc.pid)
    proc.stdin.close()
    proc.wait(10)
    return seconds, rss


def ready(path: Path) -> bool:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    daemons = state.get("daemons") or {}
    return not state.get("stopping") and set(daemons) == set(COMPUTE_MODES)


def service_run(gpus: str) -> dict[str, float]:
    """One start, measurement and stop of the service; times in seconds, sizes in bytes."""
    with tempfile.TemporaryDirectory(prefix="bench-mps-") as tmp:
        root = Path(tmp)
        env = {**os.environ, "NODE_NAME": "bench-node"}
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "dra_driver", "mps-service", f"--gpus={gpus}",
             f"--mps-root={root}", "--log-format=json"],
            env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        path = state_path(root / "mps")
        try:
            while not ready(path):
                if proc.poll() is not None:
                    raise RuntimeError(f"mps-service exited with {proc.returncode}")
                if time.monotonic() - t0 > READY_TIMEOUT_S:
                    raise RuntimeError(f"mps-service not ready after {READY_TIMEOUT_S:.0f} s")
                time.sleep(0.01)
            start = time.monotonic() - t0
            time.sleep(0.5)  # the first health check has run
            own = rss_bytes(proc.pid)
            daemons = sum(rss_bytes(p) for p in descendants(proc.pid))
            t1 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            stop = time.monotonic() - t1
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {"start": start, "stop": stop, "rss": own, "daemons_rss": daemons}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="service starts (and baselines)")
    parser.add_argument("--gpus", default="simulated:H200x8", help="simulated GPUs served")
    parser.add_argument("--smoke", action="store_true", help="one run (numbers not checked)")
    args = parser.parse_args()
    runs = 1 if args.smoke else args.runs
    base_t, base_rss, runs_seen = [], [], []
    for _ in range(runs):
        t, rss = baseline()
        base_t.append(t)
        base_rss.append(rss)
        runs_seen.append(service_run(args.gpus))
    med = statistics.median
    start = med(r["start"] for r in runs_seen)
    print(f"runs: {runs}, GPUs: {args.gpus}, modes: {', '.join(COMPUTE_MODES)}")
    print(f"baseline python start: median {med(base_t) * 1000:.0f} ms, "
          f"RSS {med(base_rss) / MIB:.1f} MiB")  # fmt: skip
    print(f"mps-service start until ready: median {start * 1000:.0f} ms, "
          f"max {max(r['start'] for r in runs_seen) * 1000:.0f} ms")  # fmt: skip
    own, daemons = (med(r[k] for r in runs_seen) / MIB for k in ("rss", "daemons_rss"))
    print(f"mps-service RSS: median {own:.1f} MiB (its control daemons: {daemons:.1f} MiB)")
    print(
        f"mps-service stop after SIGTERM: median {med(r['stop'] for r in runs_seen) * 1000:.0f} ms"
    )
    print(f"mps_service_start_ratio_to_interpreter: {start / med(base_t):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
