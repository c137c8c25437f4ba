"""Paths of the repository the tests check."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root (where ``pyproject.toml`` is)."""
TEST_DATA = REPO / "tests" / "data"
"""Fixtures checked in under ``tests/data`` (CDI schema copy, released checkpoint formats)."""
