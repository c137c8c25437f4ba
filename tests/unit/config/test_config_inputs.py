"""Node configuration inputs that once escaped ConfigError or passed validation wrongly."""

from __future__ import annotations

from collections import Counter

import pytest

from dra_driver.config.classnames import class_slots, device_class_name
from dra_driver.config.load import ConfigError, parse_node_config, parse_node_config_text
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.model.vocabulary import COMPUTE_MODES
from dra_driver.publish.slices import build_slices

HEAD = "apiVersion: gpu-fraction.dra.dev/v1alpha1\nkind: NodeConfig\n"


def test_a_yaml_integer_over_4300_digits_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        parse_node_config_text(HEAD + "slotsPerGpu: " + "1" * 5000 + "\n", "node.yaml")


def test_deeply_nested_yaml_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        parse_node_config_text("[" * 20000 + "]" * 20000, "node.yaml")


def test_a_product_name_with_a_trailing_newline_is_refused() -> None:
    # A block scalar (`name: |`) gives "quarter\n"; `$` in _DNS_LABEL matches before it.
    text = HEAD + "extendedResources: true\nproducts:\n- name: |\n    quarter\n  portion: 1/4\n"
    with pytest.raises(ConfigError):
        config = parse_node_config_text(text, "node.yaml")
        inventory = SimulatedGpuSource("simulated:H200x1", seed="n").discover()
        names = [
            d["name"]
            for s in build_slices(inventory, config, "gpu-fraction.dra.dev", "n")
            for d in s["spec"].get("devices", [])
        ]
        assert "gpu-0-time-slicing-quarter\n" not in names


def _config(*products: tuple[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "gpu-fraction.dra.dev/v1alpha1",
        "kind": "NodeConfig",
        "products": [{"name": n, "portion": p} for n, p in products],
    }


@pytest.mark.parametrize(
    "products",
    [
        # "gpu-quarter-sm-sharing" is both quarter/sm-sharing and quarter-sm-sharing/time-slicing
        (("quarter", "1/4"), ("quarter-sm-sharing", "1/2")),
        # "gpu-memory-sm-sharing" is the capacity model's sm-sharing class
        (("quarter", "1/4"), ("memory-sm-sharing", "1/2")),
    ],
)
def test_product_names_cannot_make_two_device_classes_of_one_name(
    products: tuple[tuple[str, str], ...],
) -> None:
    try:
        config = parse_node_config(_config(*products))
    except ConfigError:
        return
    names = Counter(
        device_class_name(product, mode)
        for product in [*(p.name for p in config.all_products()), None]
        for mode in COMPUTE_MODES
    )
    assert not [n for n, k in names.items() if k > 1], names
    # and the sizing policy's table must not size the capacity class
    assert "gpu-memory-sm-sharing" not in class_slots(config)
