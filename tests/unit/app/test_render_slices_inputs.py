"""`dra-driver render-slices` inputs that once gave a traceback or a name with a newline."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.app.cli import main
from dra_driver.config.node import default_node_config
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.model.errors import UsageError
from dra_driver.publish.slices import build_slices

HEAD = "apiVersion: gpu-fraction.dra.dev/v1alpha1\nkind: NodeConfig\n"


@pytest.mark.parametrize(
    "body", [HEAD + "slotsPerGpu: " + "1" * 5000 + "\n", "[" * 20000 + "]" * 20000]
)
def test_render_slices_bad_yaml_exits_2(tmp_path: Path, body: str) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(body)
    argv = ["render-slices", "--node", "n", "--gpus", "simulated:H200x1", "--config", str(config)]
    assert main(argv) == 2


@pytest.mark.parametrize(
    ("node", "driver"), [("node-a\n", "gpu-fraction.dra.dev"), ("n", "gpu-fraction.dra.dev\n")]
)
def test_names_with_a_trailing_newline_are_usage_errors(node: str, driver: str) -> None:
    inventory = SimulatedGpuSource("simulated:H200x1", seed="n").discover()
    with pytest.raises(UsageError):
        build_slices(inventory, default_node_config(), driver, node)
