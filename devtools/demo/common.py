"""What the demo works on (the repository, the node, the namespaces) and its output: one numbered
step at a time, the time since the start, and the build logs filtered to their progress lines."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from dra_driver.cluster import gib as occupancy_gib

REPO = Path(__file__).resolve().parents[2]


HACK = REPO / "hack"


API_ERRORS = (ApiException,)
"""Errors of the API server a wait retries (it may be starting or busy)."""


NODE = "gpu-node-1"


NAMESPACE = "gpu-demo"


RELEASE = "gpu-fraction-dra"


DEMO = REPO / "demo"


VALUES = REPO / "deployments" / "helm" / "demo-values.yaml"


PLUGIN_NAMESPACE = "gpu-fraction-dra"


MIB = 1024**2


class Out:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.step_no = 0

    def step(self, title: str) -> None:
        self.step_no += 1
        bold, plain = ("\033[1m", "\033[0m") if sys.stdout.isatty() else ("", "")
        print(f"\n{bold}[{self.step_no}] {title}{plain}  (+{self.elapsed():.1f}s)", flush=True)

    def line(self, text: str = "", indent: int = 4) -> None:
        print(" " * indent + text, flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


out = Out()


def raw(resp: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(resp.data)
    return data


def gib(n: int) -> str:
    """GiB as ``dra-driver occupancy`` prints them (one decimal, rounded down: one rounding)."""
    return occupancy_gib(n)


PROGRESS = re.compile(r"^(build-k8s|build-image|local-cluster|local-node|install-node-prereqs): ")
"""A line of the project's own build and cluster tools (their progress); everything else they
print (Go's module downloads, compiler and package-manager output) goes to the log only."""


def is_progress(line: str) -> bool:
    """Whether ``line`` of a tool's output is shown (:data:`PROGRESS`), not only logged."""
    return bool(PROGRESS.match(line))


def run_logged(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    """Run ``cmd``, appending all its output to ``log`` and showing its progress lines
    indented; on failure show the log's last lines. Returns the exit code."""
    with log.open("a") as sink:
        sink.write(f"$ {' '.join(cmd)}\n")
        sink.flush()
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            sink.write(line)
            if is_progress(line):
                out.line(line.rstrip(), 6)
        rc = proc.wait()
    if rc != 0:
        out.line(f"{Path(cmd[0]).name} failed (exit {rc}); the end of its log {log.name}:", 6)
        for line in log.read_text(errors="replace").splitlines()[-20:]:
            out.line(line, 8)
    return rc


PREPARE_FAILED = "FailedPrepareDynamicResources"
"""Reason of the kubelet's event when the driver refused to prepare a pod's claim."""
