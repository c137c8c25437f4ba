"""Root MPS clients, made visible: a container of a claim that runs as UID 0 on an MPS GPU.

MPS authorises control commands as the server's owner or root, so a root client could change
the limits of its neighbours' namespaces (NVIDIA MPS docs, "Security"; ``docs/admin-guide.md``,
"Tenants"). Prepare cannot see containers; the user record hook
(:func:`dra_driver.enforce.hooks.record_user_hook`) that every MPS device's CDI spec carries
writes, when the runtime creates a container, the UID it will run as into
``<root>/users/<claim-uid>/<container-id>``. :class:`RootClientWatch` reads those records for
the prepared claims, logs a warning once per container that runs as root, and reports the
claim (the claim status writer then adds a ``NonRootClients=False`` condition). Records of
claims that are no longer prepared are removed once they are a minute old.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import structlog

from dra_driver.model.ids import is_uid
from dra_driver.model.plans import ClaimPlan

log = structlog.get_logger(__name__)

ROOT_UID = "0"
STALE_AFTER_S = 60.0
"""Age after which the records of a claim that is not prepared are removed (a claim prepared
after the list of prepared claims was taken may already have records)."""


def root_containers(records: Mapping[str, str]) -> list[str]:
    """Pure: the container IDs whose recorded UID is root, sorted (``records``: container ID
    -> the record's text)."""
    return sorted(cid for cid, text in records.items() if text.strip() == ROOT_UID)


def uses_mps(plan: ClaimPlan) -> bool:
    """Whether a claim's containers may be MPS clients (any device other than admin access)."""
    return any(not d.admin_access for d in plan.devices)


class RootClientWatch:
    """Checks the user records of prepared claims (call :meth:`check` periodically).

    Args:
        record_root: ``<root>/users`` (the enforcer's ``MpsOptions.user_record_root``).
        on_root: called with a claim's plan and its root containers (so far) when new ones
            are found, from the checking thread; it must return at once (default: nothing).
        clock: ``time.time`` (tests pass their own).
    """

    def __init__(
        self,
        record_root: Path,
        on_root: Callable[[ClaimPlan, list[str]], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.record_root = record_root
        self.on_root = on_root or (lambda plan, containers: None)
        self.clock = clock
        self._reported: dict[str, set[str]] = {}

    def _records(self, claim_uid: str) -> dict[str, str]:
        out = {}
        try:
            entries = list((self.record_root / claim_uid).iterdir())
        except OSError:
            return {}
        for entry in entries:
            try:
                out[entry.name] = entry.read_text(errors="replace")[:32]
            except OSError:
                continue
        return out

    def check(self, plans: Iterable[ClaimPlan]) -> dict[str, list[str]]:
        """Warn about new root containers of ``plans`` (the prepared claims); returns claim UID
        -> its root containers, for every claim that has any."""
        found: dict[str, list[str]] = {}
        prepared = set()
        for plan in plans:
            uid = plan.claim.uid
            prepared.add(uid)
            if not uses_mps(plan):
                continue
            roots = root_containers(self._records(uid))
            if not roots:
                continue
            found[uid] = roots
            new = set(roots) - self._reported.get(uid, set())
            if not new:
                continue
            self._reported.setdefault(uid, set()).update(new)
            ref = plan.claim
            log.warning(
                "a container of the claim runs as root on an MPS GPU: a root MPS client can "
                "change its neighbours' limits; run the pod as non-root (runAsNonRoot, Pod "
                "Security restricted)",
                claim_uid=uid,
                namespace=ref.namespace,
                name=ref.name,
                containers=sorted(new),
                gpu=sorted({d.gpu.uuid for d in plan.devices}),
            )
            self.on_root(plan, roots)
        self._sweep(prepared)
        return found

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
