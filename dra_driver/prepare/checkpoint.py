"""Durable record of prepared claims, so Prepare/Unprepare stay idempotent across restarts.

File format (JSON), version 1::

    {"version": 1, "bootId": "<node boot id>", "checksum": "<sha256 hex of the claims JSON>",
     "claims": {"<uid>": RECORD}}
    RECORD      = {"namespace": str, "name": str, "devices": [DEVICE], "plan": PLAN}
    DEVICE      = {"request_names": [str], "pool": str, "device": str,
                   "share_id"?: str | null, "cdi_device_ids": [str]}
    PLAN        = {"claim": {"namespace": str, "name": str, "uid": str},
                   "devices": [DEVICE_PLAN]}
    DEVICE_PLAN = {"request_names": [str], "pool": str, "device": str,
                   "share_id"?: str | null, "gpu": GPU, "compute_mode": str,
                   "memory_request_bytes": int, "memory_limit_bytes": int,
                   "active_thread_percentage"?: int | null,
                   "admin_access"?: bool (written only when true)}
    GPU         = {"index": int, "minor": int, "uuid": str, "memory_bytes": int,
                   "name"?: str, "sm_count"?: int, "compute_capability"?: str,
                   "architecture"?: str, "pci_bus_id"?: str, "mig_enabled"?: bool,
                   "driver_version"?: str, "cuda_driver_version"?: str}

The typed form is :class:`ClaimRecord` (with :class:`PreparedDevice` and the plan's
:class:`~dra_driver.model.plans.ClaimPlan`). Compatibility rules: a field marked ``?`` may be
missing (an older writer did not know it) and takes its default (null, ``""``, ``0`` or
``false``); a field this version does not know (a newer writer added it) is ignored; each
released version has a reader in ``_READERS`` that turns its records into the current ones
(its migration), and saving writes :data:`VERSION`. Fixtures of every released format are
kept in ``tests/data/checkpoints/``.

Written atomically (temp file, fsync, rename). A checkpoint from another boot is
discarded (CDI specs under /var/run and MPS state do not survive a reboot). A
corrupt checkpoint (bad JSON, unknown version, checksum mismatch, a record of the wrong shape)
raises :class:`CheckpointCorrupt` after being moved aside to ``<file>.corrupt-<unix time>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from dra_driver.gpus import Gpu
from dra_driver.infra.atomicfile import write_atomic
from dra_driver.model.errors import DriverError, StartupError
from dra_driver.model.plans import ClaimPlan, ClaimRef, DevicePlan, PreparedDevice, plan_to_json
from dra_driver.model.textlimits import shorten
from dra_driver.model.vocabulary import ComputeMode

log = structlog.get_logger(__name__)

VERSION = 1
"""The format :meth:`Checkpoint.save` writes."""
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class ClaimRecord:
    """One prepared claim: what the kubelet was answered (``devices``) and what was enforced
    (``plan``), so that a restart can answer again and re-create the claim's artifacts."""

    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    plan: ClaimPlan

    def to_json(self) -> dict[str, Any]:
        """The record in the current format (``RECORD`` above)."""
        return {
            "namespace": self.namespace,
            "name": self.name,
            "devices": [
                {
                    "request_names": list(d.request_names),
                    "pool": d.pool,
                    "device": d.device,
                    "share_id": d.share_id,
                    "cdi_device_ids": list(d.cdi_device_ids),
                }
                for d in self.devices
            ],
            "plan": plan_to_json(self.plan),
        }


_REQUIRED: Any = object()


def _value(
    doc: Mapping[str, Any], key: str, kind: type, where: str, default: Any = _REQUIRED
) -> Any:
    """``doc[key]`` checked to be a ``kind`` (a missing key takes ``default``; null is allowed
    when the default is None).

    Raises:
        CheckpointFormatError: missing without a default, or of another JSON type.
    """
    if key not in doc:
        if default is _REQUIRED:
            raise CheckpointFormatError(f"{where}.{key} is missing")
        return default
    value = doc[key]
    if value is None and default is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CheckpointFormatError(f"{where}.{key} is {type(value).__name__}, not {kind.__name__}")
    return value


def _object(doc: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value: Mapping[str, Any] = _value(doc, key, dict, where)
    return value


def _objects(doc: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    items: list[Any] = _value(doc, key, list, where)
    if not all(isinstance(i, dict) for i in items):
        raise CheckpointFormatError(f"{where}.{key} is not a list of objects")
    return items


def _strings(doc: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    items: list[Any] = _value(doc, key, list, where)
    if not all(isinstance(i, str) for i in items):
        raise CheckpointFormatError(f"{where}.{key} is not a list of strings")
    return tuple(items)


def _gpu_v1(doc: Mapping[str, Any], where: str) -> Gpu:
    return Gpu(
        index=_value(doc, "index", int, where),
        minor=_value(doc, "minor", int, where),
        uuid=_value(doc, "uuid", str, where),
        name=_value(doc, "name", str, where, ""),
        memory_bytes=_value(doc, "memory_bytes", int, where),
        sm_count=_value(doc, "sm_count", int, where, 0),
        compute_capability=_value(doc, "compute_capability", str, where, ""),
        architecture=_value(doc, "architecture", str, where, ""),
        pci_bus_id=_value(doc, "pci_bus_id", str, where, ""),
        mig_enabled=_value(doc, "mig_enabled", bool, where, False),
        driver_version=_value(doc, "driver_version", str, where, ""),
        cuda_driver_version=_value(doc, "cuda_driver_version", str, where, ""),
    )


def _compute_mode(doc: Mapping[str, Any], where: str) -> ComputeMode:
    """``doc["compute_mode"]``, one of :class:`ComputeMode`.

    Raises:
        CheckpointFormatError: missing, not a string, or not a compute mode.
    """
    value = _value(doc, "compute_mode", str, where)
    try:
        return ComputeMode(value)
    except ValueError:
        raise CheckpointFormatError(f"{where}.compute_mode {value!r} is no compute mode") from None


def _device_plan_v1(doc: Mapping[str, Any], where: str) -> DevicePlan:
    return DevicePlan(
        request_names=_strings(doc, "request_names", where),
        pool=_value(doc, "pool", str, where),
        device=_value(doc, "device", str, where),
        share_id=_value(doc, "share_id", str, where, None),
        gpu=_gpu_v1(_object(doc, "gpu", where), f"{where}.gpu"),
        compute_mode=_compute_mode(doc, where),
        memory_request_bytes=_value(doc, "memory_request_bytes", int, where),
        memory_limit_bytes=_value(doc, "memory_limit_bytes", int, where),
        active_thread_percentage=_value(doc, "active_thread_percentage", int, where, None),
        admin_access=_value(doc, "admin_access", bool, where, False),
        max_consumers=_value(doc, "max_consumers", int, where, 1),
    )


def _plan_v1(doc: Mapping[str, Any], where: str) -> ClaimPlan:
    claim = _object(doc, "claim", where)
    return ClaimPlan(
        claim=ClaimRef(
            namespace=_value(claim, "namespace", str, f"{where}.claim"),
            name=_value(claim, "name", str, f"{where}.claim"),
            uid=_value(claim, "uid", str, f"{where}.claim"),
        ),
        devices=tuple(
            _device_plan_v1(d, f"{where}.devices[{i}]")
            for i, d in enumerate(_objects(doc, "devices", where))
        ),
    )


def _record_v1(doc: Mapping[str, Any], where: str) -> ClaimRecord:
    return ClaimRecord(
        namespace=_value(doc, "namespace", str, where),
        name=_value(doc, "name", str, where),
        devices=tuple(
            PreparedDevice(
                request_names=_strings(d, "request_names", f"{where}.devices[{i}]"),
                pool=_value(d, "pool", str, f"{where}.devices[{i}]"),
                device=_value(d, "device", str, f"{where}.devices[{i}]"),
                share_id=_value(d, "share_id", str, f"{where}.devices[{i}]", None),
                cdi_device_ids=_strings(d, "cdi_device_ids", f"{where}.devices[{i}]"),
            )
            for i, d in enumerate(_objects(doc, "devices", where))
        ),
        plan=_plan_v1(_object(doc, "plan", where), f"{where}.plan"),
    )


_READERS: dict[int, Callable[[Mapping[str, Any], str], ClaimRecord]] = {1: _record_v1}
"""Per released format version: its record reader (a migration to the current records)."""


def read_record(version: int, uid: str, doc: Mapping[str, Any]) -> ClaimRecord:
    """The record of claim ``uid`` as written in format ``version``, as a :class:`ClaimRecord`.

    Raises:
        CheckpointFormatError: unknown version, a required field missing or of the wrong JSON type
            (the message names the field, e.g. ``record <uid>.plan.devices[0].gpu.uuid``),
            or a plan for another claim UID.
    """
    reader = _READERS.get(version)
    if reader is None:
        raise CheckpointFormatError(f"unsupported version {version!r}")
    record = reader(doc, f"record {uid}")
    if record.plan.claim.uid != uid:
        raise CheckpointFormatError(f"record {uid} holds the plan of claim {record.plan.claim.uid}")
    return record


class CheckpointFormatError(DriverError, ValueError):
    """The checkpoint's bytes are not a checkpoint this version reads (the message says why)."""


class CheckpointCorrupt(StartupError, RuntimeError):
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


def _aside(path: Path) -> Path:
    """Move a corrupt checkpoint to ``<name>.corrupt-<unix time>[-<n>]``, never over an earlier
    one (a second corrupt file in the same second replaced the first); returns the new path.
    Callers hold the prepare lock, so no other instance picks the same name meanwhile."""
    stem, n = f"{path.name}.corrupt-{int(time.time())}", 0
    while (kept := path.with_name(stem if n == 0 else f"{stem}-{n}")).exists():
        n += 1
    os.replace(path, kept)
    return kept


def parse(raw: bytes) -> dict[str, Any]:
    """Parse and verify checkpoint bytes (read-only; used by ``load`` and ``dra-driver status``).

    Returns the document (``version``, ``bootId``, ``checksum``, ``claims``).

    Raises:
        CheckpointFormatError: bad JSON, not an object, a version without a reader, claims
            not an object of objects, or checksum mismatch.
    """
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, 4300+ digits, deep nesting
        raise CheckpointFormatError(f"not JSON: {shorten(str(exc))}") from exc
    if not isinstance(doc, dict):
        raise CheckpointFormatError(f"not a JSON object but {type(doc).__name__}")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version not in _READERS:
        raise CheckpointFormatError(f"unsupported version {doc.get('version')!r}")
    claims = doc.get("claims")
    if not isinstance(claims, dict) or not all(isinstance(r, dict) for r in claims.values()):
        raise CheckpointFormatError("claims is not an object of records")
    if _checksum(claims) != doc.get("checksum"):
        raise CheckpointFormatError("checksum mismatch")
    return doc


def _checksum(claims: Mapping[str, Any]) -> str:
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


class Checkpoint:
    """Prepared-claim records keyed by claim UID, persisted in ``<state-dir>/checkpoint.json``.

    ``claims`` is the in-memory state: change it, then :meth:`save`. Not thread-safe by
    itself: the plugin calls it under its prepare lock.
    """

    def __init__(self, state_dir: str | Path, boot_id: str) -> None:
        self.path = Path(state_dir) / "checkpoint.json"
        self.boot_id = boot_id
        self.claims: dict[str, ClaimRecord] = {}
        self._encoded: dict[str, tuple[ClaimRecord, dict[str, Any]]] = {}
        self._seen: tuple[int, int, int] | None = None

    def load(self) -> bool:
        """Load the file; return False when it belonged to another boot (then start empty).

        Records of an older version or an older writer are read with defaults (see the module
        docstring); they are written in the current format at the next :meth:`save`.

        Raises:
            CheckpointCorrupt: unreadable JSON, not an object, unknown version, checksum
                mismatch or a record of the wrong shape (the file is moved aside first; the
                in-memory record starts empty).
        """
        self.claims = {}
        self._encoded = {}
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return True
        try:
            doc = parse(raw)
            if doc.get("bootId") != self.boot_id:
                self.save()
                return False
            claims = {
                uid: read_record(doc["version"], uid, record)
                for uid, record in doc["claims"].items()
            }
        except CheckpointFormatError as exc:
            kept = _aside(self.path)
            raise CheckpointCorrupt(f"checkpoint {self.path} is corrupt ({exc})", kept) from exc
        self.claims = claims
        return True

    def _file_stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def remember_file(self) -> None:
        """Note the file as it is now (inode, mtime, size), for :meth:`reload_if_changed`."""
        self._seen = self._file_stat()

    def reload_if_changed(self) -> None:
        """Reload when another plugin instance (a rolling update) wrote the file since this
        one last loaded or saved it; a corrupt file is logged and leaves no records."""
        if self._file_stat() != self._seen:
            try:
                self.load()
            except CheckpointCorrupt as exc:
                log.error("checkpoint corrupt; continuing with no prepared claims", error=str(exc))
            self.remember_file()

    def _records_json(self) -> dict[str, dict[str, Any]]:
        """Every record in the current format (encoded once per record object)."""
        encoded = {}
        for uid, record in self.claims.items():
            cached = self._encoded.get(uid)
            if cached is None or cached[0] is not record:
                cached = (record, record.to_json())
            encoded[uid] = cached
        self._encoded = encoded
        return {uid: doc for uid, (_, doc) in encoded.items()}

    def save(self) -> None:
        """Write the current records atomically (temp file, fsync, rename) in format
        :data:`VERSION`.

        The directory is not fsynced: after a power loss the boot ID changes and the
        checkpoint is discarded anyway, so only atomicity against a killed process matters.
        """
        claims = self._records_json()
        doc = {
            "version": VERSION,
            "bootId": self.boot_id,
            "checksum": _checksum(claims),
            "claims": claims,
        }
        write_atomic(self.path, json.dumps(doc, sort_keys=True).encode(), 0o600, dir_mode=0o700)
        self.remember_file()
