"""The integration tier: every test under ``tests/integration`` gets the ``integration`` marker
(``make integration``); ``make unit`` leaves them out."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.integration)
