"""A claim's consumers, made visible: the containers that use a prepared claim on an MPS GPU.

Prepare cannot see containers. The consumer gate
(:func:`dra_driver.enforce.rules.hooks.consumer_gate_hook`) that every MPS device's CDI spec carries
admits at most ``maxConsumers`` running containers of a claim and writes, for each one it
admits, ``<root>/users/<claim-uid>/<device-key>/<container-id>``: ``<uid> <pid> <start-ticks>
<namespace>/<pod>/<container>``. :class:`ConsumerWatch` reads those records for the prepared
claims and reports each claim whose running consumers changed (the claim status writer then
lists them in the claim's ``status.devices``), and warns once per container that runs as root
(MPS authorises control commands as the server's owner or root, so a root client could change
the limits of its neighbours' namespaces; NVIDIA MPS docs, "Security"; the claim then gets a
``NonRootClients=False`` condition). Records of claims that are no longer prepared are removed
once they are a minute old.

A consumer runs while ``/proc/<pid>/stat`` shows the recorded start time (field 22, clock
ticks since boot): a PID reused by another process has another start time. The plugin runs
with the host's PID namespace (chart value ``hostPID``, on by default) to see them.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

import structlog

from dra_driver.model.ids import is_uid
from dra_driver.model.plans import ClaimPlan

log = structlog.get_logger(__name__)

ROOT_UID = "0"
STALE_AFTER_S = 60.0
"""Age after which the records of a claim that is not prepared are removed (a claim prepared
after the list of prepared claims was taken may already have records)."""


class Consumer(NamedTuple):
    """One container of a claim, as the consumer gate recorded it.

    Attributes:
        container_id: the runtime's container ID (the record's file name).
        uid: the UID its process runs as (``"-"`` if the gate could not read it).
        pid: its process ID in the host's PID namespace (0 for a record without one).
        start: the process start time, clock ticks since boot (``/proc/<pid>/stat`` field 22).
        who: ``<namespace>/<pod>/<container>`` from the runtime's CRI annotations.
    """

    container_id: str
    uid: str
    pid: int = 0
    start: str = ""
    who: str = ""


def parse_record(container_id: str, text: str) -> Consumer:
    """Pure: a consumer record (``<uid> <pid> <start> <who>``; a record of an older plugin holds
    only the UID, and its PID is then 0)."""
    words = text.split()
    uid = words[0] if words else ""
    pid = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    start = words[2] if len(words) > 2 else ""
    who = words[3] if len(words) > 3 else ""
    return Consumer(container_id, uid, pid, start, who)


def _entries(directory: Path) -> list[Path]:
    """The entries of ``directory`` but hidden ones (the gate's lock and temporary files);
    none if it cannot be read."""
    try:
        return [e for e in directory.iterdir() if not e.name.startswith(".")]
    except OSError:
        return []


def root_containers(records: Iterable[Consumer]) -> list[str]:
    """Pure: the container IDs whose recorded UID is root, sorted."""
    return sorted(c.container_id for c in records if c.uid == ROOT_UID)


def uses_mps(plan: ClaimPlan) -> bool:
    """Whether a claim's containers may be MPS clients (any device other than admin access)."""
    return any(not d.admin_access for d in plan.devices)


def process_start(proc: Path, pid: int) -> str | None:
    """The start time of process ``pid`` (field 22 of ``<proc>/<pid>/stat``), or None if it
    does not run. The command name (field 2) may hold spaces and parentheses: fields are
    counted after its last ``)``."""
    try:
        stat = (proc / str(pid) / "stat").read_text(errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


class ClaimConsumers(NamedTuple):
    """What :class:`ConsumerWatch` reports of one claim.

    Attributes:
        running: its running consumers, by container ID.
        root: container IDs (running or not) recorded as root.
    """

    running: tuple[Consumer, ...]
    root: tuple[str, ...]


class ConsumerWatch:
    """Checks the consumer records of prepared claims (call :meth:`check` periodically).

    Args:
        record_root: ``<root>/users`` (the enforcer's ``MpsOptions.user_record_root``).
        on_change: called with a claim's plan and its consumers when its running consumers
            changed or a new root container was found, from the checking thread; it must return
            at once (default: nothing).
        clock: ``time.time`` (tests pass their own).
        proc: the host's ``/proc``.
    """

    def __init__(
        self,
        record_root: Path,
        on_change: Callable[[ClaimPlan, ClaimConsumers], None] | None = None,
        clock: Callable[[], float] = time.time,
        proc: Path = Path("/proc"),
    ) -> None:
        self.record_root = record_root
        self.on_change = on_change or (lambda plan, consumers: None)
        self.clock = clock
        self.proc = proc
        self._reported: dict[str, ClaimConsumers] = {}

    def records(self, claim_uid: str) -> list[Consumer]:
        """Every record of a claim, running or not, once per container (the gate keeps one
        directory per device of the claim, ``<claim-uid>/<device-key>/<container-id>``; a
        container that got several devices is in each)."""
        return [consumer for consumer, _ in self._records(claim_uid).values()]

    def _records(self, claim_uid: str) -> dict[str, tuple[Consumer, float]]:
        """Container ID -> its record and the record's modification time (when the gate
        admitted the container, seconds since the epoch)."""
        out: dict[str, tuple[Consumer, float]] = {}
        for entry in _entries(self.record_root / claim_uid):
            for record in _entries(entry) if entry.is_dir() else [entry]:
                try:
                    text = record.read_text(errors="replace")[:512]
                    written = record.stat().st_mtime
                except OSError:
                    continue
                out.setdefault(record.name, (parse_record(record.name, text), written))
        return out

    def running_before(self, claim_uid: str, since: float) -> list[str]:
        """The container IDs of the claim's consumers admitted before ``since`` (seconds since
        the epoch) that still run, sorted: after an MPS outage at ``since``, the containers
        still to restart (:data:`dra_driver.observe.mpsoutages.StaleConsumers`)."""
        records = self._records(claim_uid)
        early = [c for c, written in records.values() if written < since]
        return [c.container_id for c in self.running(early)]

    def running(self, records: Iterable[Consumer]) -> tuple[Consumer, ...]:
        """The consumers among ``records`` whose process still runs, by container ID."""
        live = [c for c in records if c.pid and process_start(self.proc, c.pid) == c.start]
        return tuple(sorted(live))

    def check(self, plans: Iterable[ClaimPlan]) -> dict[str, ClaimConsumers]:
        """Report the claims of ``plans`` (the prepared claims) whose consumers changed; warn
        about new root containers. Returns claim UID -> its consumers, for every MPS claim
        with any record."""
        found: dict[str, ClaimConsumers] = {}
        prepared = set()
        for plan in plans:
            uid = plan.claim.uid
            prepared.add(uid)
            if not uses_mps(plan):
                continue
            records = self.records(uid)
            if not records and uid not in self._reported:
                continue
            now = ClaimConsumers(self.running(records), tuple(root_containers(records)))
            found[uid] = now
            before = self._reported.get(uid, ClaimConsumers((), ()))
            if now == before:
                continue
            self._reported[uid] = now
            new_root = sorted(set(now.root) - set(before.root))
            if new_root:
                self._warn_root(plan, new_root)
            self.on_change(plan, now)
        self._sweep(prepared)
        return found

    @staticmethod
    def _warn_root(plan: ClaimPlan, containers: list[str]) -> None:
        ref = plan.claim
        log.warning(
            "a container of the claim runs as root on an MPS GPU: a root MPS client can "
            "change its neighbours' limits; run the pod as non-root (runAsNonRoot, Pod "
            "Security restricted)",
            claim_uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            containers=containers,
            gpu=sorted({d.gpu.uuid for d in plan.devices}),
        )

    def _sweep(self, prepared: set[str]) -> None:
        """Forget, and remove the records of, claims that are not prepared (once stale)."""
        for uid in [u for u in self._reported if u not in prepared]:
            del self._reported[uid]
        try:
            dirs = list(self.record_root.iterdir())
        except OSError:
            return
        for d in dirs:
            if d.name in prepared or not is_uid(d.name):
                continue
            try:
                old = self.clock() - d.stat().st_mtime > STALE_AFTER_S
            except OSError:
                continue
            if old:
                shutil.rmtree(d, ignore_errors=True)
