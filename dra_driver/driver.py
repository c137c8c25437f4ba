"""Prepare and Unprepare: the effects around the pure plan (API read, MPS, CDI, checkpoint).

Order for one claim (crash-safe without an intent record): plan -> enforcer.apply -> CDI
spec write -> checkpoint save. A crash before the checkpoint save leaves at most a CDI spec
and MPS state for a claim the kubelet will prepare again (idempotent) or unprepare (which
removes by UID, checkpoint or not); the start-up sweep removes CDI specs no record knows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from dra_driver import cdi
from dra_driver.checkpoint import Checkpoint, CheckpointCorrupt
from dra_driver.claims import ClaimReader
from dra_driver.devicenodes import check_device_nodes
from dra_driver.locking import PrepareLock
from dra_driver.metrics import Metrics
from dra_driver.mps import FractionEnforcer, MpsError
from dra_driver.podclaims import PodClaims
from dra_driver.prepare import (
    ClaimPlan,
    ClaimRef,
    PrepareError,
    overcommit_error,
    plan_claim,
    plan_from_json,
    plan_to_json,
    validate_uid,
)
from dra_driver.slices import FractionDevice

log = structlog.get_logger(__name__)

_CLAIM_ERRORS = (PrepareError, MpsError, cdi.CdiError, OSError)


@dataclass(frozen=True)
class PreparedDevice:
    """One entry of the NodePrepareResources reply (CDI IDs are fully qualified)."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    share_id: str | None
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True)
class PrepareOutcome:
    """Per-claim result: the devices, or an error message for the kubelet (never both)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


def _validate_record(record: Mapping[str, Any]) -> None:
    """Raise if a checkpoint record cannot be used (its plan or devices do not parse)."""
    plan_from_json(record["plan"])
    _devices_from_record(record)


def _remove_temp_files(*dirs: Path) -> None:
    """Remove temp files a killed write left behind (``.<name>.<pid>.tmp``)."""
    for d in dirs:
        if d.is_dir():
            for tmp in d.glob(".*.tmp"):
                tmp.unlink(missing_ok=True)
                log.info("removed temp file left by a killed write", path=str(tmp))


def _devices_from_record(record: Mapping[str, Any]) -> tuple[PreparedDevice, ...]:
    return tuple(
        PreparedDevice(
            request_names=tuple(d["request_names"]),
            pool=d["pool"],
            device=d["device"],
            share_id=d.get("share_id"),
            cdi_device_ids=tuple(d["cdi_device_ids"]),
        )
        for d in record["devices"]
    )


class Driver:
    """The node-side driver: serialized, idempotent Prepare/Unprepare of claims.

    Args:
        driver_name: our DRA driver name (also the CDI vendor).
        pool: this node's pool name (the node name).
        reader: reads ResourceClaims from the API server.
        devices: returns the node's current fraction devices by name.
        enforcer: applies MPS ceilings/compute mode.
        cdi_root: CDI spec directory (``/var/run/cdi``).
        state_dir: holds ``checkpoint.json``.
        lock: the Prepare/Unprepare lock shared with other plugin instances.
        boot_id: the node's boot ID (a different one resets the checkpoint).
        device_root: host directory holding the ``dev/nvidia*`` nodes that CDI specs name
            (``/`` on a real node; a simulated node's simulation root).
        device_root_view: where the plugin sees ``device_root`` to check that the nodes exist
            (:mod:`dra_driver.devicenodes`); default ``device_root`` itself.
    """

    def __init__(
        self,
        *,
        driver_name: str,
        pool: str,
        reader: ClaimReader,
        devices: Callable[[], Mapping[str, FractionDevice]],
        enforcer: FractionEnforcer,
        cdi_root: str | Path,
        state_dir: str | Path,
        lock: PrepareLock,
        boot_id: str,
        metrics: Metrics | None = None,
        device_root: str | Path = "/",
        device_root_view: str | Path | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.pool = pool
        self.reader = reader
        self.devices = devices
        self.enforcer = enforcer
        self.cdi_root = Path(cdi_root)
        self.device_root = Path(device_root)
        self.device_root_view = Path(device_root_view or device_root)
        self.lock = lock
        self.checkpoint = Checkpoint(state_dir, boot_id, validate=_validate_record)
        self.metrics = metrics or Metrics()
        self._seen_stat: tuple[int, int, int] | None = None
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="claim-read")
        self._pod_claims = PodClaims()

    def start(self) -> None:
        """Load the checkpoint, re-apply prepared claims, and sweep orphaned CDI specs.

        A corrupt checkpoint is logged as an error and kept aside; enforcement is then left
        as it is (no restore, which would tear down the namespaces of running claims) and
        the sweep is skipped, so running containers keep their CDI specs and MPS settings.
        """
        with self.lock.held():
            _remove_temp_files(self.cdi_root, self.checkpoint.path.parent)
            try:
                same_boot = self.checkpoint.load()
                if not same_boot:
                    log.warning(
                        "checkpoint from an earlier boot discarded", path=str(self.checkpoint.path)
                    )
            except CheckpointCorrupt as exc:
                self.metrics.errors.labels(operation="checkpoint").inc()
                log.error(
                    "checkpoint corrupt; starting with no prepared claims and leaving existing "
                    "CDI specs and MPS state in place (unprepare still removes them by claim UID)",
                    error=str(exc),
                )
                self._remember_stat()
                return
            self._remember_stat()
            self.enforcer.restore(self.prepared_plans())
            self._sweep()

    def _sweep(self) -> None:
        known = set(self.checkpoint.claims)
        for uid in sorted(cdi.claim_uids_on_disk(self.cdi_root, self.driver_name) - known):
            try:
                validate_uid(uid)
            except PrepareError:
                continue
            cdi.remove_spec(self.cdi_root, self.driver_name, uid)
            self.enforcer.release(uid)
            log.info("removed orphaned CDI spec", claim_uid=uid)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.checkpoint.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _remember_stat(self) -> None:
        self._seen_stat = self._stat()

    def _refresh(self) -> None:
        """Reload the checkpoint if another plugin instance changed it since we last looked."""
        if self._stat() != self._seen_stat:
            try:
                self.checkpoint.load()
            except CheckpointCorrupt as exc:
                log.error("checkpoint corrupt; continuing with no prepared claims", error=str(exc))
            self._remember_stat()

    def _save(self) -> None:
        self.checkpoint.save()
        self._remember_stat()

    def prepare(self, refs: Iterable[ClaimRef]) -> dict[str, PrepareOutcome]:
        """Prepare each claim; each one fails alone. Returns outcomes keyed by claim UID.

        A claim listed twice is prepared once.
        """
        refs = list({r.uid: r for r in refs}.values())
        outcomes: dict[str, PrepareOutcome] = {}
        started = time.perf_counter()
        with self.lock.held():
            self._refresh()
            todo: list[ClaimRef] = []
            for ref in refs:
                record = self.checkpoint.claims.get(ref.uid)
                if record is not None:
                    outcomes[ref.uid] = PrepareOutcome(devices=_devices_from_record(record))
                else:
                    todo.append(ref)
            claims = dict(zip([r.uid for r in todo], self._pool.map(self._read, todo), strict=True))
            table = self.devices() if todo else {}
            prepared = {p.claim.uid: p for p in self.prepared_plans()} if todo else {}
            fresh: list[str] = []
            for ref in todo:
                bound = log.bind(claim_uid=ref.uid, namespace=ref.namespace, name=ref.name)
                try:
                    claim = claims[ref.uid]
                    if isinstance(claim, Exception):
                        raise claim
                    outcomes[ref.uid] = self._prepare_one(ref, claim, table, prepared)
                    fresh.append(ref.uid)
                    bound.info(
                        "claim prepared", devices=[d.device for d in outcomes[ref.uid].devices]
                    )
                except _CLAIM_ERRORS as exc:
                    outcomes[ref.uid] = PrepareOutcome(error=str(exc))
                    self.metrics.errors.labels(operation="prepare").inc()
                    bound.warning("claim prepare failed", error=str(exc))
                except Exception as exc:  # a bug must fail this claim only, not the batch
                    outcomes[ref.uid] = PrepareOutcome(error=f"internal error: {exc!r}")
                    self.metrics.errors.labels(operation="prepare").inc()
                    bound.exception("claim prepare failed unexpectedly")
            if fresh:
                try:
                    self._save()
                except OSError as exc:
                    for uid in fresh:
                        self._undo(uid)
                        outcomes[uid] = PrepareOutcome(
                            error=f"checkpoint write to {self.checkpoint.path} failed: {exc}"
                        )
        self.metrics.observe("prepare", len(refs), time.perf_counter() - started)
        return outcomes

    def _read(self, ref: ClaimRef) -> Mapping[str, Any] | Exception:
        try:
            validate_uid(ref.uid)
            return self.reader.read(ref.namespace, ref.name)
        except PrepareError as exc:
            return exc
        except Exception as exc:  # API server unreachable, bad JSON: this claim fails alone
            return PrepareError(f"reading claim {ref.namespace}/{ref.name} failed: {exc}")

    def _prepare_one(
        self,
        ref: ClaimRef,
        claim: Mapping[str, Any],
        table: Mapping[str, FractionDevice],
        prepared: dict[str, ClaimPlan],
    ) -> PrepareOutcome:
        """Prepare one claim; ``prepared`` (plans by claim UID) gains it on success."""
        plan = plan_claim(ref, claim, self.driver_name, self.pool, table)
        problem = overcommit_error(plan, (p for u, p in prepared.items() if u != ref.uid))
        if problem:
            raise PrepareError(f"{problem}; refusing to over-commit the GPU")
        check_device_nodes(self.device_root_view, plan)
        edits = self.enforcer.apply(plan)
        try:
            devices = self._write_cdi(plan, edits)
        except OSError as exc:
            self.enforcer.release(ref.uid)
            raise PrepareError(f"writing the CDI spec under {self.cdi_root} failed: {exc}") from exc
        except BaseException:
            self.enforcer.release(ref.uid)
            raise
        self.checkpoint.claims[ref.uid] = {
            "namespace": ref.namespace,
            "name": ref.name,
            "devices": [
                {
                    "request_names": list(d.request_names),
                    "pool": d.pool,
                    "device": d.device,
                    "share_id": d.share_id,
                    "cdi_device_ids": list(d.cdi_device_ids),
                }
                for d in devices
            ],
            "plan": plan_to_json(plan),
        }
        prepared[ref.uid] = plan
        self._pod_claims.add(claim, plan)
        return PrepareOutcome(devices=devices)

    def _write_cdi(
        self, plan: ClaimPlan, edits: Mapping[str, cdi.ContainerEdits]
    ) -> tuple[PreparedDevice, ...]:
        cdi_devices = []
        prepared = []
        for d in plan.devices:
            name = cdi.device_name(plan.claim.uid, d.device, d.share_id)
            extra = edits.get(d.key, cdi.ContainerEdits())
            nodes = tuple(
                cdi.DeviceNode(p, str(self.device_root / p.lstrip("/")))
                for p in (d.gpu.device_node, *cdi.CONTROL_DEVICE_NODES)
            )
            cdi_devices.append(
                cdi.CdiDevice(name, cdi.ContainerEdits(extra.env, nodes, extra.mounts, extra.hooks))
            )
            prepared.append(
                PreparedDevice(
                    request_names=d.request_names,
                    pool=d.pool,
                    device=d.device,
                    share_id=d.share_id,
                    cdi_device_ids=(cdi.qualified_name(self.driver_name, name),),
                )
            )
        spec = cdi.build_spec(self.driver_name, cdi_devices)
        cdi.write_spec(self.cdi_root, self.driver_name, plan.claim.uid, spec)
        return tuple(prepared)

    def _undo(self, uid: str) -> None:
        self.checkpoint.claims.pop(uid, None)
        self._pod_claims.forget(uid)
        cdi.remove_spec(self.cdi_root, self.driver_name, uid)
        self.enforcer.release(uid)

    def unprepare(self, refs: Iterable[ClaimRef]) -> dict[str, str]:
        """Unprepare each claim (unknown claims succeed); returns error text by UID ("" = ok).

        If the checkpoint cannot be written, the removed records are put back and those
        claims fail, so the kubelet's retry finds them again (memory never runs ahead of disk).
        """
        refs = list({r.uid: r for r in refs}.values())
        errors: dict[str, str] = {}
        started = time.perf_counter()
        with self.lock.held():
            self._refresh()
            removed: dict[str, dict[str, Any]] = {}
            for ref in refs:
                bound = log.bind(claim_uid=ref.uid, namespace=ref.namespace, name=ref.name)
                try:
                    validate_uid(ref.uid)
                    self.enforcer.release(ref.uid)
                    cdi.remove_spec(self.cdi_root, self.driver_name, ref.uid)
                    record = self.checkpoint.claims.pop(ref.uid, None)
                    self._pod_claims.forget(ref.uid)
                    if record is not None:
                        removed[ref.uid] = record
                    errors[ref.uid] = ""
                    bound.info("claim unprepared")
                except _CLAIM_ERRORS as exc:
                    errors[ref.uid] = str(exc)
                    self.metrics.errors.labels(operation="unprepare").inc()
                    bound.warning("claim unprepare failed", error=str(exc))
                except Exception as exc:  # a bug must fail this claim only, not the batch
                    errors[ref.uid] = f"internal error: {exc!r}"
                    self.metrics.errors.labels(operation="unprepare").inc()
                    bound.exception("claim unprepare failed unexpectedly")
            if removed:
                try:
                    self._save()
                except OSError as exc:
                    self.checkpoint.claims.update(removed)
                    for uid in removed:
                        errors[uid] = f"checkpoint write to {self.checkpoint.path} failed: {exc}"
        self.metrics.observe("unprepare", len(refs), time.perf_counter() - started)
        return errors

    def prepared_plans(self) -> list[ClaimPlan]:
        """Plans of every prepared claim (for metrics and health); safe without the lock.

        ``list(dict.values())`` copies in one step under the GIL, and Prepare/Unprepare only
        add or remove whole records, so the snapshot is consistent.
        """
        records = list(self.checkpoint.claims.values())
        return [plan_from_json(r["plan"]) for r in records]

    def close(self) -> None:
        """Stop the claim-reader threads."""
        self._pool.shutdown(wait=False)
