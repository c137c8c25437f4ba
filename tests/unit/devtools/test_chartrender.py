"""devtools.chartrender's mapping of a node configuration to chart values refuses what the
plugin would refuse: a typo or a wrong type used to render the default classes silently (a
review found ``extendedResources: "false"`` turned extended resources on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools import chartrender
from dra_driver.config import ConfigError


def test_a_node_configuration_maps_to_the_values_the_chart_maps_back() -> None:
    doc = {
        "apiVersion": "gpu-fraction.dra.dev/v1alpha1",
        "kind": "NodeConfig",
        "products": [{"name": "third", "portion": "1/3"}],
        "slotsPerGpu": 6,
        "extendedResources": True,
        "defaults": {"computeMode": "sm-sharing"},
    }
    assert chartrender.chart_values(doc, driver="gpu.example.org") == {
        "driverName": "gpu.example.org",
        "products": [{"name": "third", "portion": "1/3"}],
        "slotsPerGpu": 6,
        "extendedResources": {"enabled": True},
        "nodeConfig": {"defaults": {"computeMode": "sm-sharing"}},
    }
    assert chartrender.chart_values() == {"driverName": "gpu-fraction.dra.dev"}


@pytest.mark.parametrize(
    "doc",
    [
        {"prodcts": [{"name": "third", "portion": "1/3"}]},
        {"extendedResources": "false"},
        {"defaults": {"computeMode": "exclusive"}},
    ],
    ids=["typo", "string-for-bool", "unknown-mode"],
)
def test_a_configuration_the_plugin_refuses_renders_nothing(doc: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        chartrender.chart_values(doc)


def test_the_command_refuses_a_document_that_is_no_mapping(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "node.yaml"
    config.write_text("- a\n- list\n")
    assert chartrender.main(["--config", str(config)]) == 2
    assert "not a mapping" in capsys.readouterr().err
