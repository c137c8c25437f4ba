"""hack/gpu-check on a machine without an NVIDIA GPU: a clear message and exit 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.paths import REPO

SCRIPT = REPO / "hack" / "gpu-check"


def _run(
    *args: str, env: dict[str, str] | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GPU_CHECK_NO_REEXEC": "1", **(env or {})},
        check=False,
    )


def _has_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
        pynvml.nvmlShutdown()
    except Exception:
        return False
    return count > 0


@pytest.mark.skipif(_has_gpu(), reason="this machine has an NVIDIA GPU")
def test_no_gpu_exits_zero_with_message() -> None:
    done = _run()
    assert done.returncode == 0, done.stderr
    assert "no NVIDIA GPU found" in done.stdout


def test_pretend_no_gpu() -> None:
    done = _run(env={"GPU_CHECK_PRETEND_NO_GPU": "1"})
    assert done.returncode == 0
    assert (
        done.stdout.strip()
        == "no NVIDIA GPU found (GPU_CHECK_PRETEND_NO_GPU is set); nothing to check"
    )


@pytest.mark.skipif(_has_gpu(), reason="this machine has an NVIDIA GPU")
def test_probe_reports_missing_libcuda_and_exits() -> None:
    done = _run("--probe", stdin="go\nspin 10\nexit\n")
    assert done.returncode == 0
    first, second = (json.loads(line) for line in done.stdout.splitlines())
    assert first["ok"] is False and "libcuda" in first["error"]
    assert second == {"ok": False, "error": "bad command spin"}
