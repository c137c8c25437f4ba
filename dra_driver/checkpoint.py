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
from collections.abc import Callable, Mapping
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


def parse(raw: bytes) -> dict[str, Any]:
    """Parse and verify checkpoint bytes (read-only; used by ``load`` and ``dra-driver status``).

    Returns the document (``version``, ``bootId``, ``checksum``, ``claims``).

    Raises:
        ValueError: bad JSON, not an object, unsupported version, claims not an object of
            objects, or checksum mismatch.
    """
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError(f"not a JSON object but {type(doc).__name__}")
    if doc.get("version") != VERSION:
        raise ValueError(f"unsupported version {doc.get('version')!r}")
    claims = doc.get("claims")
    if not isinstance(claims, dict) or not all(isinstance(r, dict) for r in claims.values()):
        raise ValueError("claims is not an object of records")
    if _checksum(claims) != doc.get("checksum"):
        raise ValueError("checksum mismatch")
    return doc


def _checksum(claims: Mapping[str, Any]) -> str:
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


class Checkpoint:
    """Prepared-claim records keyed by claim UID, persisted in ``<state-dir>/checkpoint.json``.

    Not thread-safe by itself: the plugin calls it under its prepare lock.
    """

    def __init__(
        self,
        state_dir: str | Path,
        boot_id: str,
        validate: Callable[[Mapping[str, Any]], object] | None = None,
    ) -> None:
        self.path = Path(state_dir) / "checkpoint.json"
        self.boot_id = boot_id
        self.claims: dict[str, dict[str, Any]] = {}
        self._validate = validate

    def load(self) -> bool:
        """Load the file; return False when it belonged to another boot (then start empty).

        Every record is checked with ``validate`` (e.g. that its plan still parses).

        Raises:
            CheckpointCorrupt: unreadable JSON, not an object, unknown version, checksum
                mismatch or a record ``validate`` rejects (the file is moved aside first;
                the in-memory record starts empty).
        """
        self.claims = {}
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return True
        try:
            doc = parse(raw)
            for uid, record in doc["claims"].items():
                if self._validate is not None:
                    try:
                        self._validate(record)
                    except (KeyError, TypeError, ValueError, AttributeError) as exc:
                        raise ValueError(f"record {uid} unreadable: {exc!r}") from exc
        except ValueError as exc:
            kept = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            os.replace(self.path, kept)
            raise CheckpointCorrupt(f"checkpoint {self.path} is corrupt ({exc})", kept) from exc
        if doc.get("bootId") != self.boot_id:
            self.save()
            return False
        self.claims = doc["claims"]
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
        write_atomic(self.path, json.dumps(doc, sort_keys=True).encode(), 0o600, dir_mode=0o700)
