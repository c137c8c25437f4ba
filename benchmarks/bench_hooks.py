"""Benchmark the createRuntime hooks a container with a GPU-fraction claim runs at its start,
against a no-op process measured in the same run.

runc runs every ``createRuntime`` hook of a container's CDI edits, one after the other, before
the container starts: what they cost, every container of a claim pays at every start. Timed
here as runc runs them (the OCI state as JSON on stdin, the bundle's ``config.json`` beside):

- ``noop``: ``/bin/true``, the floor of any hook (a process start);
- ``consumer_gate``: the consumer gate as the ``hard`` tier runs it: records the container's
  cgroup, counts the claim's running consumers under a lock and records the container; the
  claim already has ``--records`` records of running containers (its other consumers), each
  checked;
- ``cdi_hook_stand_in``: the simulated node's stand-in for NVIDIA's ``nvidia-cdi-hook``
  (simulated nodes only; NVIDIA's is compiled and costs about a no-op).

Samples are interleaved so machine noise hits all alike. Run: ``.venv/bin/python
benchmarks/bench_hooks.py [--runs 200] [--records 3]``; ``--smoke`` runs 5 (``make test``
does, numbers not checked). The last line is ``hooks_per_container_ratio_to_noop: <number>``:
the p50 of the hooks of one ``hard``-tier container together over the no-op's p50.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dra_driver.enforce import consumer_gate_hook  # noqa: E402
from dra_driver.gpus import open_source, simnode  # noqa: E402
from dra_driver.model.cdi import Hook  # noqa: E402
from tests.support.ocistate import oci_state  # noqa: E402

CLAIM_UID = "0a000000-0000-4000-8000-00000000000a"


def state(container: str, pid: int, bundle: Path) -> str:
    """The OCI state runc writes on a hook's stdin (compact JSON, as runc does)."""
    return json.dumps(oci_state(container, pid, bundle), separators=(",", ":"))


def run_hook(hook: Hook, stdin: str) -> float:
    """Seconds ``hook`` took; exits when it failed."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [hook.path, *hook.args[1:]], input=stdin, text=True, capture_output=True, check=False
    )
    spent = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"hook {hook.args[:3]} failed: {done.stderr.strip()[:300]}")
    return spent


def p50(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--records", type=int, default=3, help="running consumers recorded")
    parser.add_argument("--smoke", action="store_true", help="5 runs (numbers not checked)")
    args = parser.parse_args()
    runs = 5 if args.smoke else args.runs
    root = Path(tempfile.mkdtemp(prefix="bench-hooks-"))
    sleepers = []
    try:
        bundle = root / "bundle"
        bundle.mkdir()
        config = {
            "ociVersion": "1.2.0",
            "process": {
                "user": {"uid": 1000, "gid": 1000},
                "env": [
                    "PATH=/bin",
                    "NVIDIA_GPU_MEMORY_REQUEST=1024",
                    "NVIDIA_GPU_MEMORY_LIMIT=2048",
                ],
            },
        }
        (bundle / "config.json").write_text(json.dumps(config, separators=(",", ":")))
        gpus = open_source("simulated:H200x1", seed="bench").discover().gpus
        stand_in = root / "sim" / "bin" / simnode.HOOK_NAME
        stand_in.parent.mkdir(parents=True)
        stand_in.write_text(simnode.hook_script(root / "sim" / simnode.RECORDS))
        stand_in.chmod(0o755)
        users = root / "users" / CLAIM_UID
        max_consumers = args.records + runs + 1
        hooks = {
            "noop": Hook("createRuntime", shutil.which("true") or "/bin/true", ("true",)),
            "consumer_gate": consumer_gate_hook(
                str(users), max_consumers, "team-a/c", "advice", "/bin/sh", str(root / "cgroups")
            ),
            "cdi_hook_stand_in": Hook(
                "createRuntime",
                str(stand_in),
                (stand_in.name, "apply-cuda-memory-limits", "--gpu-id", gpus[0].uuid),
            ),
        }
        for n in range(args.records):  # the claim's other running consumers
            sleeper = subprocess.Popen(["sleep", "600"])
            sleepers.append(sleeper)
            run_hook(hooks["consumer_gate"], state(f"other-{n}", sleeper.pid, bundle))
        times: dict[str, list[float]] = {name: [] for name in hooks}
        for i in range(runs):
            sleeper = subprocess.Popen(["sleep", "600"])
            sleepers.append(sleeper)
            stdin = state(f"c{i}", sleeper.pid, bundle)
            for name, hook in hooks.items():
                times[name].append(run_hook(hook, stdin))
            sleeper.kill()
            sleeper.wait()
        print(f"machine: {os.cpu_count()} cpus; runs: {runs}; running consumers: {args.records}")
        for name, xs in times.items():
            ratio = p50(xs) / p50(times["noop"])
            print(f"{name}_p50_ms: {p50(xs) * 1000:.2f} ({ratio:.1f}x noop)")
        hard = sum(p50(times[n]) for n in ("consumer_gate", "cdi_hook_stand_in"))
        print(f"hooks_per_container_p50_ms: {hard * 1000:.2f}")
        print(f"hooks_per_container_ratio_to_noop: {hard / p50(times['noop']):.1f}")
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
