"""Shared fixtures (helpers live in ``tests.support``) and the hypothesis profiles."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import structlog
from hypothesis import settings

from dra_driver.config.load import load_node_config, parse_node_config
from dra_driver.kubelet.server import PluginServer
from tests.support.kubelet import Kubelet, serving
from tests.support.node import MIXED_CONFIG, Node, make_node

# Property tests: the unit tier's default draws 25 examples per test; DRA_HYPOTHESIS_PROFILE=deep
# (or pytest's --hypothesis-profile=deep) draws 1000 for a thorough run.
settings.register_profile("unit", max_examples=25)
settings.register_profile("deep", max_examples=1000)
settings.load_profile(os.environ.get("DRA_HYPOTHESIS_PROFILE", "unit"))


@pytest.fixture(autouse=True)
def default_logging() -> Iterator[None]:
    """Every test starts with structlog's defaults (lines on stdout): a test that runs the
    plugin's ``configure`` (stderr) would otherwise change what later tests capture, so a test's
    outcome would hang on the order the tests run in."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def node() -> Iterator[Node]:
    yield from make_node(load_node_config(None))


@pytest.fixture
def mixed_node() -> Iterator[Node]:
    yield from make_node(parse_node_config(MIXED_CONFIG))


@pytest.fixture
def served(node: Node) -> Iterator[tuple[Node, PluginServer, Kubelet]]:
    with serving(node) as (server, kubelet):
        yield node, server, kubelet
