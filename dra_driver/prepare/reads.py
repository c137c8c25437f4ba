"""Reading the claims of one kubelet call from the API server: in parallel, on a bounded set of
reader threads, within the reads' share of the call's budget (a hung read fails its claim alone
and never holds the prepare lock)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from typing import Any

from dra_driver.infra.budget import Budget
from dra_driver.model.errors import PrepareError
from dra_driver.model.ids import validate_claim_name, validate_uid
from dra_driver.model.plans import ClaimRef
from dra_driver.prepare.claims import ClaimReader, ClaimReadTimeout

CLAIM_READERS = 32
"""Claims read from the API server at once (over all calls); more wait for a free reader."""


class ClaimReads:
    """The reader threads of one :class:`~dra_driver.prepare.preparation.ClaimPreparation`.

    Args:
        reader: returns the current :class:`~dra_driver.prepare.claims.ClaimReader` (looked up per
            read, so a test or a reconnect may replace it).
    """

    def __init__(self, reader: Callable[[], ClaimReader]) -> None:
        self._reader = reader
        self._pool = ThreadPoolExecutor(max_workers=CLAIM_READERS, thread_name_prefix="claim-read")

    def read_all(
        self, refs: list[ClaimRef], reading: Budget, call: Budget
    ) -> dict[str, Mapping[str, Any] | Exception]:
        """Read ``refs`` in parallel within ``reading`` (part of ``call``); a read that does
        not finish in time gives that claim a timeout error (its thread ends with its own HTTP
        timeout, which is the same deadline)."""
        futures: dict[str, Future[Mapping[str, Any] | Exception]] = {
            r.uid: self._pool.submit(self._read, r, reading, call) for r in refs
        }
        wait_for_futures(futures.values(), timeout=reading.remaining())
        out: dict[str, Mapping[str, Any] | Exception] = {}
        for ref in refs:
            future = futures[ref.uid]
            if future.cancel() or not future.done():
                out[ref.uid] = read_timeout(ref, reading, call)
            else:
                out[ref.uid] = future.result()
        return out

    def _read(self, ref: ClaimRef, reading: Budget, call: Budget) -> Mapping[str, Any] | Exception:
        try:
            validate_uid(ref.uid)
            validate_claim_name(ref.namespace, ref.name)
            if reading.spent():  # waited for a free reader all along
                return read_timeout(ref, reading, call)
            return self._reader().read(ref.namespace, ref.name, timeout=reading.remaining())
        except ClaimReadTimeout:
            return read_timeout(ref, reading, call)
        except PrepareError as exc:
            return exc
        except Exception as exc:  # API server unreachable, bad JSON: this claim fails alone
            return PrepareError(f"reading claim {ref.namespace}/{ref.name} failed: {exc}")

    def close(self) -> None:
        """Stop the reader threads (reads under way end with their own HTTP timeout)."""
        self._pool.shutdown(wait=False)


def read_timeout(ref: ClaimRef, reading: Budget, call: Budget) -> PrepareError:
    return PrepareError(
        f"reading ResourceClaim {ref.namespace}/{ref.name} from the API server did not finish "
        f"within {reading.text()} (the reads' share of the call's {call.text()} budget, "
        "--call-budget); the kubelet retries"
    )


def unread_error(ref: ClaimRef, here: bool) -> PrepareError:
    """The claim was prepared when the call came (so not read) and was unprepared before this
    call got the prepare lock: by a NodeUnprepareResources call of this plugin (``here``) or
    by another plugin instance (the other pod of a rolling update)."""
    who = (
        "a NodeUnprepareResources call for it that ran while this call waited for the node's "
        "prepare lock (the kubelet unprepares a claim once no pod uses it)"
        if here
        else "another instance of the plugin (the other pod of a rolling update) while this "
        "call waited for the node's prepare lock"
    )
    return PrepareError(
        f"claim {ref.namespace}/{ref.name} was unprepared by {who}; not prepared now: if a "
        "pod still needs it, the kubelet calls again"
    )


class UnpreparedLog:
    """When this plugin last unprepared each claim (monotonic seconds), so a Prepare that
    lost a race with an Unprepare can say which one it was; entries older than
    :data:`KEEP_S` are dropped."""

    KEEP_S = 600.0

    def __init__(self) -> None:
        self._at: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, uid: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._at = {u: t for u, t in self._at.items() if now - t < self.KEEP_S}
            self._at[uid] = now

    def since(self, uid: str, start: float) -> bool:
        """Whether this plugin unprepared ``uid`` at or after ``start`` (monotonic)."""
        with self._lock:
            return self._at.get(uid, -1.0) >= start
