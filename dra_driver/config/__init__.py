"""config: what a node offers and what a claim may ask (the node configuration, its
loader, claim parameters, caps, class names). Pure except the file loader.
May import: model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dra_driver.faces import lazy_face

if TYPE_CHECKING:
    from dra_driver.config.caps import CapPolicy
    from dra_driver.config.classnames import class_slots
    from dra_driver.config.load import ConfigError, load_node_config, parse_node_config
    from dra_driver.config.node import API_VERSION, KIND, NodeConfig, warn_unmatched_selectors

__all__ = [
    "API_VERSION",
    "ConfigError",
    "KIND",
    "parse_node_config",
    "class_slots",
    "CapPolicy",
    "NodeConfig",
    "load_node_config",
    "warn_unmatched_selectors",
]

__getattr__ = lazy_face(__name__, __file__)
