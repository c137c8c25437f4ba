"""What each process loads: the command line and the MPS node service load no client library,
the kubelet plugin loads no generated CoreV1Api (about 235 model modules, 20 MiB resident).
Each check imports in a fresh interpreter, so this test process's imports do not count."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("kubernetes", "grpc", "prometheus_client")


def loaded(code: str) -> set[str]:
    """The top modules of ``sys.modules`` after running ``code`` in a fresh interpreter."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


@pytest.mark.parametrize(
    "code",
    [
        "import dra_driver.app.cli",
        "from dra_driver.app.args import build_parser; build_parser().parse_args(['mps-service'])",
        "import dra_driver.enforce.mpsservice.service",
    ],
)
def test_the_command_line_and_the_mps_service_load_no_client_library(code: str) -> None:
    assert {m for m in loaded(code) if m.split(".")[0] in HEAVY} == set()


def test_the_plugin_loads_no_generated_core_v1_api() -> None:
    modules = loaded("import dra_driver.app.plugin")
    assert "kubernetes.client.api.resource_v1_api" in modules  # the check can see the client
    assert "kubernetes.client.api.core_v1_api" not in modules
