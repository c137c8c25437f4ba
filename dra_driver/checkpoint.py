"""Durable record of prepared claims, so Prepare/Unprepare stay idempotent across restarts.

File format (JSON)::

    {"version": 1, "bootId": "<node boot id>", "checksum": "<sha256 hex of the claims JSON>",
     "claims": {"<uid>": {"namespace": ..., "name": ..., "devices": [...], "plan": {...}}}}

Written atomically (temp file, fsync, rename). A checkpoint from another boot is
discarded (CDI specs under /var/run and MPS state do not survive a reboot). A
corrupt checkpoint (bad JSON, wrong version, checksum mismatch) raises
:class:`CheckpointCorrupt` after being moved aside to ``<file>.corrupt-<unix time>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_driver.atomicfile import write_atomic

VERSION = 1
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


class CheckpointCorrupt(RuntimeError):
    """The checkpoint could not be trusted; ``kept_at`` is where the bad file was moved."""

    def __init__(self, message: str, kept_at: Path) -> None:
        super().__init__(f"{message}; kept at {kept_at}")
        self.kept_at = kept_at


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """Return the kernel's boot ID (changes on every reboot); ``unknown`` if unreadable."""
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "unknown"


def _checksum(claims: Mapping[str, Any]) -> str:
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


class Checkpoint:
    """Prepared-claim records keyed by claim UID, persisted in ``<state-dir>/checkpoint.json``.

    Not thread-safe by itself: the plugin calls it under its prepare lock.
    """

    def __init__(self, state_dir: str | Path, boot_id: str) -> None:
        self.path = Path(state_dir) / "checkpoint.json"
        self.boot_id = boot_id
        self.claims: dict[str, dict[str, Any]] = {}

    def load(self) -> bool:
        """Load the file; return False when it belonged to another boot (then start empty).

        Raises:
            CheckpointCorrupt: unreadable JSON, unknown version or checksum mismatch (the
                file is moved aside first; the in-memory record starts empty).
        """
        self.claims = {}
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return True
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("version") != VERSION:
                raise ValueError(f"unsupported version {doc.get('version')!r}")
            claims = doc["claims"]
            if not isinstance(claims, dict) or _checksum(claims) != doc.get("checksum"):
                raise ValueError("checksum mismatch")
        except (ValueError, KeyError, TypeError) as exc:
            kept = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            os.replace(self.path, kept)
            raise CheckpointCorrupt(f"checkpoint {self.path} is corrupt ({exc})", kept) from exc
        if doc.get("bootId") != self.boot_id:
            self.save()
            return False
        self.claims = claims
        return True

    def save(self) -> None:
        """Write the current records atomically (temp file, fsync, rename).

        The directory is not fsynced: after a power loss the boot ID changes and the
        checkpoint is discarded anyway, so only atomicity against a killed process matters.
        """
        doc = {
            "version": VERSION,
            "bootId": self.boot_id,
            "checksum": _checksum(self.claims),
            "claims": self.claims,
        }
        write_atomic(self.path, json.dumps(doc, sort_keys=True).encode(), 0o600)
