"""``hack/local-node down``: the node's cgroup trees are walked while the kubelet, containerd
and runc still remove pod cgroups. A fresh-clone CI run lost a whole teardown to that race:
``Path.rglob`` raised FileNotFoundError for a cgroup removed between listing its parent and
reading it, ``down`` stopped before killing anything, and the kubelet, containerd and every
cgroup and bridge stayed behind."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools import localnode
from devtools.localnode import cgroups


@pytest.fixture
def cgroup_fs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """One fake cgroup hierarchy holding node ``n``'s pods cgroup root."""
    hierarchy = tmp_path / "memory"
    pods = hierarchy / localnode.cgroup_names("n")[0]
    monkeypatch.setattr(cgroups, "hierarchies", lambda: [hierarchy])
    yield pods


def _vanishing(monkeypatch: pytest.MonkeyPatch, doomed: Path) -> None:
    """Make ``doomed`` disappear just before anything lists it, as a pod cgroup that runc
    removes while ``down`` walks the tree."""
    real = os.scandir

    def scandir(path: Any) -> Any:  # os.scandir's overloads: a path or a descriptor
        if isinstance(path, str | os.PathLike) and Path(path) == doomed and doomed.exists():
            shutil.rmtree(doomed)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_pids_of_a_tree_whose_cgroup_vanishes_midway(
    cgroup_fs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept, doomed = cgroup_fs / "kubepods" / "pod-a", cgroup_fs / "kubepods" / "pod-b" / "c"
    for d in (kept, doomed):
        d.mkdir(parents=True)
        (d / "cgroup.procs").write_text("")
    (kept / "cgroup.procs").write_text("101\n102\n")
    (cgroup_fs / "cgroup.procs").write_text("7\n")
    _vanishing(monkeypatch, doomed)

    assert localnode.cgroup_pids("n") == {7, 101, 102}
    assert not doomed.exists()


def test_removing_a_tree_whose_cgroup_vanishes_midway(
    cgroup_fs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doomed = cgroup_fs / "kubepods" / "pod-b" / "c"
    doomed.mkdir(parents=True)
    (cgroup_fs / "kubepods" / "pod-a").mkdir()
    _vanishing(monkeypatch, doomed)

    assert localnode.remove_cgroups("n") == []
    assert not cgroup_fs.exists()
