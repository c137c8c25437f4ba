"""Modes of what the plugin creates do not depend on the umask (issue 10, item 11)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.infra.atomicfile import ensure_dir, write_atomic


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.usefixtures("umask_000")
def test_ensure_dir_sets_created_modes_and_keeps_existing_ones(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o751)
    ensure_dir(shared / "a" / "b", 0o700)
    assert [_mode(shared), _mode(shared / "a"), _mode(shared / "a" / "b")] == [0o751, 0o700, 0o700]


@pytest.mark.usefixtures("umask_000")
def test_write_atomic_gives_exact_modes(tmp_path: Path) -> None:
    write_atomic(tmp_path / "state" / "checkpoint.json", b"{}", 0o600, dir_mode=0o700)
    write_atomic(tmp_path / "cdi" / "spec.json", b"{}")
    assert _mode(tmp_path / "state") == 0o700
    assert _mode(tmp_path / "state" / "checkpoint.json") == 0o600
    assert _mode(tmp_path / "cdi") == 0o755
    assert _mode(tmp_path / "cdi" / "spec.json") == 0o644
