"""The directory layout of a test node, shared by the unit and end-to-end fixtures."""

from __future__ import annotations

from pathlib import Path


class NodeDirs:
    """Plugin directories under ``self.root`` (set by the subclass)."""

    root: Path

    @property
    def registry_dir(self) -> Path:
        return self.root / "registry"

    @property
    def plugin_dir(self) -> Path:
        return self.root / "plugins"

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"
