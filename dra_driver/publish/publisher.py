"""The ResourceSlice executor: list, write, retry and count failures (resource.k8s.io/v1).

:class:`SlicePublisher` owns the slices whose ``spec.nodeName`` is the node and ``spec.driver``
the driver (listed with that field selector; nothing else is ever touched). Each
:meth:`SlicePublisher.publish` call:

1. takes the existing slices of this node and driver from its :class:`SliceCache` (filled and
   kept current by :meth:`SlicePublisher.watch`, :mod:`dra_driver.publish.slicewatch`), or,
   when the cache is not current (no watch yet, the watch broken, a write of its own not yet
   seen in the watch, a retry after a failure), lists them through the official client; the
   client's models become API JSON dicts, once, here;
2. asks the pure :func:`dra_driver.publish.slicediff.diff_slices` which writes make them equal the
   desired slices (pool generations, semantic comparison, write order: see that module);
3. applies those writes in order: creates, replaces (with ``resourceVersion``, so a concurrent
   change is a conflict, not an overwrite) and deletes.

Nothing is written when nothing changed, so a restarted plugin with the same inventory makes no
write call and never deletes its slices, and a round that changes nothing makes no API request
at all while the watch runs. When the server stores something other than what was
sent (fields of a disabled feature gate dropped), the server's form is remembered here and
passed to the diff, so the publisher does not rewrite forever.

Errors: API conflicts, throttling, server errors, 404 (a slice vanished mid-way) and connection
failures are retried: the whole reconcile is redone after a capped exponential backoff
(``initial_backoff * 2**k``, at most ``max_backoff`` seconds, ``max_attempts`` tries). Other API
errors (400, 403, 422) raise :class:`PublishError` at once. Every failed API call (a 404 on
delete excepted: the slice is gone, as wanted) increments
``dra_gpu_fraction_slice_publish_failures_total{operation,reason}``
(:mod:`dra_driver.infra.metrics`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
import urllib3.exceptions
from kubernetes.client import ApiClient, ResourceV1Api, V1ResourceSlice
from kubernetes.client.exceptions import ApiException

from dra_driver.infra.metrics import Metrics
from dra_driver.model.errors import DriverError
from dra_driver.publish.slicecache import SliceCache
from dra_driver.publish.slicediff import (
    SliceWrite,
    check_desired,
    diff_slices,
    owned_slices,
    slice_name,
    stored_form,
)
from dra_driver.publish.slicediff import (
    normalize_spec as normalize_spec,  # imported from here by e2e
)
from dra_driver.publish.slicewatch import SliceWatch

log = structlog.get_logger(__name__)

RETRYABLE_STATUSES = frozenset({0, 404, 408, 409, 429, 500, 502, 503, 504})
"""HTTP statuses after which the reconcile is retried (0: no response)."""


class ResourceSliceApi(Protocol):
    """The subset of ``kubernetes.client.ResourceV1Api`` the publisher uses; it takes and
    returns the client's models (``V1ResourceSlice``, ``V1ResourceSliceList``)."""

    api_client: Any
    """The ``kubernetes.client.ApiClient``; its ``sanitize_for_serialization`` turns models
    into API JSON."""

    def list_resource_slice(self, *, field_selector: str) -> Any:
        """Return a list object whose ``items`` are the matching ResourceSlices."""
        ...

    def create_resource_slice(self, body: Any) -> Any:
        """Create a ResourceSlice; return the stored object."""
        ...

    def replace_resource_slice(self, name: str, body: Any) -> Any:
        """Replace a ResourceSlice (``body.metadata.resourceVersion`` set); return it."""
        ...

    def delete_resource_slice(self, name: str) -> Any:
        """Delete a ResourceSlice by name."""
        ...


RETRY_S = 5.0
"""Seconds before a failed publishing round is retried (at most the publish interval)."""


class PublishError(DriverError, RuntimeError):
    """Publishing failed: a non-retryable API error, or retries exhausted (``__cause__``)."""


@dataclass(frozen=True)
class PublishResult:
    """What one :meth:`SlicePublisher.publish` did.

    Attributes:
        created, updated, deleted: slice names written, in call order.
        generations: pool name -> generation now published (every slice of a pool has it).
        attempts: reconcile attempts made (1 without retries).
    """

    created: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    generations: Mapping[str, int] = field(default_factory=dict)
    attempts: int = 1

    @property
    def writes(self) -> int:
        """Number of successful write calls (create + replace + delete)."""
        return len(self.created) + len(self.updated) + len(self.deleted)

    @property
    def changed(self) -> bool:
        """Whether anything was written."""
        return self.writes > 0


def _status(exc: BaseException) -> int | None:
    """HTTP status of a client ``ApiException`` (0: no response), else None."""
    return int(exc.status or 0) if isinstance(exc, ApiException) else None


def is_retryable(exc: BaseException) -> bool:
    """Whether an error from the API client is worth retrying (see :data:`RETRYABLE_STATUSES`;
    ``urllib3`` errors and ``OSError`` - connection refused, timeouts - are retried too)."""
    status = _status(exc)
    if status is not None:
        return status in RETRYABLE_STATUSES
    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)


def failure_reason(exc: BaseException) -> str:
    """The ``reason`` label of a failed call: the HTTP status (``"409"``), ``"connection"``
    (no response: status 0, ``urllib3`` errors, ``OSError``) or ``"other"``."""
    status = _status(exc)
    if status:
        return str(status)
    if status == 0 or isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return "connection"
    return "other"


class SlicePublisher:
    """Keeps the API server's ResourceSlices of one node and driver equal to a desired list.

    Args:
        resource_api: a ``kubernetes.client.ResourceV1Api`` (or a fake with the same interface).
        driver: driver name; only slices with this ``spec.driver`` are considered.
        node: node name; only slices with this ``spec.nodeName`` are considered.
        sleep: called with the backoff delay in seconds between attempts (default: wait on an
            internal event that :meth:`run`'s stop event interrupts).
        max_attempts: reconcile attempts per :meth:`publish` before giving up.
        initial_backoff, max_backoff: backoff bounds in seconds.
        metrics: where failed API calls are counted (default: a registry of its own).
    """

    @classmethod
    def of_client(
        cls, api: ApiClient, driver: str, node: str, metrics: Metrics | None = None
    ) -> SlicePublisher:
        """A publisher that writes through ``api`` (the official client's ``ResourceV1Api``)."""
        return cls(ResourceV1Api(api), driver, node, metrics=metrics)

    def __init__(
        self,
        resource_api: ResourceSliceApi,
        driver: str,
        node: str,
        *,
        sleep: Callable[[float], object] | None = None,
        max_attempts: int = 8,
        initial_backoff: float = 0.5,
        max_backoff: float = 30.0,
        metrics: Metrics | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._api = resource_api
        self.driver = driver
        self.node = node
        self._sleep = sleep
        self._stop = threading.Event()
        self.max_attempts = max_attempts
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.metrics = metrics or Metrics()
        self._server_forms: dict[str, tuple[str, str]] = {}
        self.cache = SliceCache()

    @property
    def field_selector(self) -> str:
        """``spec.nodeName=<node>,spec.driver=<driver>``: the slices this publisher owns."""
        return f"spec.nodeName={self.node},spec.driver={self.driver}"

    # --- public API -----------------------------------------------------------------------

    def publish(self, desired: Sequence[Mapping[str, Any]]) -> PublishResult:
        """Make the node's slices equal ``desired`` (bodies from ``build_slices``).

        Returns:
            What was written; ``writes == 0`` when everything already matched.

        Raises:
            ValueError: a desired slice of another node or driver, or a duplicate name.
            PublishError: non-retryable API error, or ``max_attempts`` reached.
        """
        check_desired(desired, self.driver, self.node)
        attempt = 0
        while True:
            attempt += 1
            try:
                result = self._reconcile(desired, fresh=attempt > 1)
            except Exception as exc:
                if not is_retryable(exc):
                    raise PublishError(f"publishing ResourceSlices failed: {exc}") from exc
                if attempt >= self.max_attempts:
                    raise PublishError(
                        f"publishing ResourceSlices failed after {attempt} attempts: {exc}"
                    ) from exc
                delay = min(self.max_backoff, self.initial_backoff * 2 ** (attempt - 1))
                log.warning(
                    "resource slice publish failed; retrying",
                    attempt=attempt,
                    delay_s=delay,
                    error=str(exc),
                    status=_status(exc),
                )
                self._wait(delay)
                continue
            result = PublishResult(
                created=result.created,
                updated=result.updated,
                deleted=result.deleted,
                generations=result.generations,
                attempts=attempt,
            )
            if result.changed:
                log.info(
                    "resource slices published",
                    node=self.node,
                    created=len(result.created),
                    updated=len(result.updated),
                    deleted=len(result.deleted),
                    generations=dict(result.generations),
                )
            else:
                log.debug("resource slices up to date", node=self.node)
            return result

    def run(
        self,
        stop_event: threading.Event,
        desired_fn: Callable[[], Sequence[Mapping[str, Any]]],
        interval: float = 30.0,
        wake: threading.Event | None = None,
    ) -> None:
        """Publish ``desired_fn()`` now and every ``interval`` seconds until ``stop_event``.

        Setting ``wake`` (e.g. from :meth:`watch`, when someone else deleted or changed one
        of our slices) starts the next round at once. Errors (of ``desired_fn`` too: e.g. the
        Node cannot be read) are logged and retried after at most :data:`RETRY_S` seconds;
        slices are left in place on stop (the kubelet removes them if the plugin stays away).
        Set ``wake`` after ``stop_event`` to end a wait early.
        """
        self._stop = stop_event
        wake = wake or stop_event
        while not stop_event.is_set():
            wait = interval
            try:
                self.publish(desired_fn())
            except Exception as exc:  # keep the loop alive; the next round retries
                if stop_event.is_set():
                    break
                wait = min(interval, RETRY_S)
                log.error("resource slice publishing failed", error=str(exc), retry_s=wait)
            wake.wait(wait)
            if wake is not stop_event:
                wake.clear()

    def watch(self, stop_event: threading.Event, on_change: Callable[[str], None]) -> None:
        """Keep :attr:`cache` current until ``stop_event`` (thread target: LIST, then WATCH,
        :class:`~dra_driver.publish.slicewatch.SliceWatch`); ``on_change`` gets the type of
        each event that was someone else's change (a kubelet restart wipes the slices), so
        that :meth:`run` republishes at once instead of after its interval."""
        SliceWatch(
            self._api.list_resource_slice, self.field_selector, self.cache, on_change, self._to_dict
        ).run(stop_event)

    # --- internals ------------------------------------------------------------------------

    def _wait(self, delay: float) -> None:
        if self._sleep is not None:
            self._sleep(delay)
        elif self._stop.wait(delay):
            raise PublishError("publishing stopped")

    def _call(
        self, operation: str, call: Callable[[], Any], ok_statuses: frozenset[int] = frozenset()
    ) -> Any:
        """``call()``; a failure is counted under ``operation`` and re-raised, unless its HTTP
        status is in ``ok_statuses`` (then None is returned)."""
        try:
            return call()
        except Exception as exc:
            if _status(exc) in ok_statuses:
                return None
            reason = failure_reason(exc)
            self.metrics.slice_publish_failures.labels(operation=operation, reason=reason).inc()
            raise

    def _to_dict(self, model: Any) -> dict[str, Any]:
        """A client model (or list of them) as API JSON: camelCase keys, no nulls."""
        result: dict[str, Any] = self._api.api_client.sanitize_for_serialization(model)
        return result

    def _current(self, fresh: bool) -> list[Mapping[str, Any]]:
        """The node's slices: the cache's, unless ``fresh`` or the cache is not current."""
        cached = None if fresh else self.cache.snapshot()
        if cached is not None:
            return owned_slices(cached, self.driver, self.node)
        selector = self.field_selector
        response = self._call(
            "list", lambda: self._api.list_resource_slice(field_selector=selector)
        )
        return owned_slices(self._to_dict(response).get("items") or [], self.driver, self.node)

    def _remember_server_form(self, sent: Mapping[str, Any], stored: Mapping[str, Any]) -> None:
        name = slice_name(sent)
        form = stored_form(sent, stored)
        if form is None:
            self._server_forms.pop(name, None)
        elif self._server_forms.get(name) != form:
            self._server_forms[name] = form
            log.warning(
                "API server stored a ResourceSlice different from the one sent (fields dropped? "
                "check the DRAPartitionableDevices / DRAConsumableCapacity feature gates)",
                slice=name,
            )

    def _apply(self, write: SliceWrite) -> None:
        name = write.name
        if write.op == "delete":
            delete = self._api.delete_resource_slice
            gone = self._call("delete", lambda: delete(name=name), ok_statuses=frozenset({404}))
            if gone is not None:  # None: a 404, already deleted (the watch has its event)
                self.cache.deleted(name)
            self._server_forms.pop(name, None)
            return
        model = V1ResourceSlice.from_dict(dict(write.body))
        if write.op == "create":
            stored = self._call("create", lambda: self._api.create_resource_slice(body=model))
        else:
            replace = self._api.replace_resource_slice
            stored = self._call("update", lambda: replace(name=name, body=model))
        stored_json = self._to_dict(stored)
        self.cache.wrote(stored_json)
        self._remember_server_form(write.body, stored_json)

    def _reconcile(self, desired: Sequence[Mapping[str, Any]], fresh: bool) -> PublishResult:
        diff = diff_slices(desired, self._current(fresh), self._server_forms)
        done: dict[str, list[str]] = {"create": [], "update": [], "delete": []}
        for write in diff.writes:
            self._apply(write)
            done[write.op].append(write.name)
        return PublishResult(
            created=tuple(done["create"]),
            updated=tuple(done["update"]),
            deleted=tuple(done["delete"]),
            generations=diff.generations,
        )
