"""Reconcile this node's ResourceSlices with the API server (official client, resource.k8s.io/v1).

:class:`SlicePublisher` owns the slices whose ``spec.nodeName`` is the node and ``spec.driver``
the driver (listed with that field selector; nothing else is ever touched). Each
:meth:`SlicePublisher.publish` call:

1. lists the existing slices of this node and driver;
2. per pool, keeps the existing ``generation`` when every slice already matches the desired
   content, otherwise uses ``existing + 1`` (at least the desired bodies' generation) for
   *every* slice of the pool, as the API requires of a changed pool;
3. creates missing slices, replaces changed ones (with ``resourceVersion``, so a concurrent
   change is a conflict, not an overwrite), then deletes slices no longer desired.

Nothing is written when nothing changed, so a restarted plugin with the same inventory makes no
write call and never deletes its slices. Content is compared semantically: quantities by value
(``1Gi`` == ``1073741824``), labels we set (others' labels are kept), and the spec. When the
server stores something other than what was sent (fields of a disabled feature gate dropped),
the server's form is remembered and accepted, so the publisher does not rewrite forever.

Errors: API conflicts, throttling, server errors, 404 (a slice vanished mid-way) and connection
failures are retried: the whole reconcile is redone after a capped exponential backoff
(``initial_backoff * 2**k``, at most ``max_backoff`` seconds, ``max_attempts`` tries). Other API
errors (400, 403, 422) raise :class:`PublishError` at once.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from kubernetes import watch as k8s_watch

from dra_driver.errors import DriverError
from dra_driver.quantities import quantity_value

log = structlog.get_logger(__name__)

RETRYABLE_STATUSES = frozenset({0, 404, 408, 409, 429, 500, 502, 503, 504})
"""HTTP statuses after which the reconcile is retried (0: no response)."""


class ResourceSliceApi(Protocol):
    """The subset of ``kubernetes.client.ResourceV1Api`` the publisher calls."""

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


def _api_exception_type() -> type[Exception]:
    from kubernetes.client.exceptions import ApiException

    exc_type: type[Exception] = ApiException
    return exc_type


def _status(exc: BaseException) -> int | None:
    """HTTP status of a client ``ApiException`` (or a look-alike with ``status``), else None."""
    status = getattr(exc, "status", None)
    if isinstance(exc, _api_exception_type()) or isinstance(status, int):
        return int(status or 0)
    return None


def is_retryable(exc: BaseException) -> bool:
    """Whether an error from the API client is worth retrying (see :data:`RETRYABLE_STATUSES`;
    ``urllib3`` errors and ``OSError`` - connection refused, timeouts - are retried too)."""
    import urllib3.exceptions

    status = _status(exc)
    if status is not None:
        return status in RETRYABLE_STATUSES
    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)


def _norm_quantity(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return f"q:{quantity_value(value)}"
    except ValueError:
        return value


def _drop_empty(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _drop_empty(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None and v != [] and v != {}}
    if isinstance(value, list):
        return [_drop_empty(v) for v in value]
    return value


def normalize_spec(spec: Mapping[str, Any], ignore_generation: bool = False) -> dict[str, Any]:
    """A ResourceSlice spec with quantities replaced by their exact values and empty fields
    dropped, for comparison; ``ignore_generation`` removes ``pool.generation``."""
    out: dict[str, Any] = _drop_empty(copy.deepcopy(dict(spec)))
    if ignore_generation and isinstance(out.get("pool"), dict):
        out["pool"].pop("generation", None)
    for counter_set in out.get("sharedCounters", []):
        for counter in counter_set.get("counters", {}).values():
            counter["value"] = _norm_quantity(counter.get("value"))
    for device in out.get("devices", []):
        for capacity in device.get("capacity", {}).values():
            capacity["value"] = _norm_quantity(capacity.get("value"))
            policy = capacity.get("requestPolicy", {})
            if "default" in policy:
                policy["default"] = _norm_quantity(policy["default"])
            if "validValues" in policy:
                policy["validValues"] = [_norm_quantity(v) for v in policy["validValues"]]
            for key, v in policy.get("validRange", {}).items():
                policy["validRange"][key] = _norm_quantity(v)
        for consumption in device.get("consumesCounters", []):
            for counter in consumption.get("counters", {}).values():
                counter["value"] = _norm_quantity(counter.get("value"))
    return out


def _key(spec: Mapping[str, Any]) -> str:
    return json.dumps(normalize_spec(spec, ignore_generation=True), sort_keys=True)


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _pool(obj: Mapping[str, Any]) -> str:
    return str(obj.get("spec", {}).get("pool", {}).get("name", ""))


def _generation(obj: Mapping[str, Any]) -> int:
    return int(obj.get("spec", {}).get("pool", {}).get("generation", 0))


class SlicePublisher:
    """Keeps the API server's ResourceSlices of one node and driver equal to a desired list.

    Args:
        resource_api: a ``kubernetes.client.ResourceV1Api`` (or a fake with the same methods).
        driver: driver name; only slices with this ``spec.driver`` are considered.
        node: node name; only slices with this ``spec.nodeName`` are considered.
        sleep: called with the backoff delay in seconds between attempts (default: wait on an
            internal event that :meth:`run`'s stop event interrupts).
        max_attempts: reconcile attempts per :meth:`publish` before giving up.
        initial_backoff, max_backoff: backoff bounds in seconds.
    """

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
        self._server_forms: dict[str, tuple[str, str]] = {}
        self._serializer: Any = None

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
        self._check_desired(desired)
        attempt = 0
        while True:
            attempt += 1
            try:
                result = self._reconcile(desired)
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
        of our slices) starts the next round at once. Errors are logged and retried at the
        next round; slices are left in place on stop (the kubelet removes them if the plugin
        stays away). Set ``wake`` after ``stop_event`` to end a wait early.
        """
        self._stop = stop_event
        wake = wake or stop_event
        while not stop_event.is_set():
            try:
                self.publish(desired_fn())
            except Exception as exc:  # keep the loop alive; the next round retries
                if stop_event.is_set():
                    break
                log.error("resource slice publishing failed", error=str(exc), interval_s=interval)
            wake.wait(interval)
            if wake is not stop_event:
                wake.clear()

    def watch(self, stop_event: threading.Event, wake: threading.Event, timeout: int = 60) -> None:
        """Watch this node's slices of this driver; set ``wake`` when one is deleted or
        changed by someone else (a kubelet restart wipes them), so :meth:`run` republishes
        at once instead of after its interval. Reconnects (with a pause) until stopped.
        """
        while not stop_event.is_set():
            try:
                stream = k8s_watch.Watch().stream(
                    self._api.list_resource_slice,
                    field_selector=self.field_selector,
                    timeout_seconds=timeout,
                )
                for event in stream:
                    if stop_event.is_set():
                        return
                    if event["type"] in ("DELETED", "MODIFIED"):
                        wake.set()
            except Exception as exc:  # API server away: retry after a pause
                log.warning("resource slice watch failed; retrying", error=str(exc))
                stop_event.wait(5.0)

    # --- internals ------------------------------------------------------------------------

    def _wait(self, delay: float) -> None:
        if self._sleep is not None:
            self._sleep(delay)
        elif self._stop.wait(delay):
            raise PublishError("publishing stopped")

    def _check_desired(self, desired: Sequence[Mapping[str, Any]]) -> None:
        names: set[str] = set()
        for body in desired:
            spec = body.get("spec", {})
            if spec.get("driver") != self.driver or spec.get("nodeName") != self.node:
                raise ValueError(
                    f"slice {body.get('metadata', {}).get('name')!r} is not for node "
                    f"{self.node!r} and driver {self.driver!r}"
                )
            name = _name(body)
            if name in names:
                raise ValueError(f"duplicate slice name {name!r}")
            names.add(name)

    def _to_dict(self, obj: Any) -> dict[str, Any]:
        if isinstance(obj, Mapping):
            return copy.deepcopy(dict(obj))
        if self._serializer is None:
            serializer = getattr(self._api, "api_client", None)
            if serializer is None:
                from kubernetes.client import ApiClient

                serializer = ApiClient()
            self._serializer = serializer
        result: dict[str, Any] = self._serializer.sanitize_for_serialization(obj)
        return result

    @staticmethod
    def _to_model(body: Mapping[str, Any]) -> Any:
        from kubernetes.client import V1ResourceSlice

        return V1ResourceSlice.from_dict(dict(body))

    def _list(self) -> dict[str, dict[str, Any]]:
        response = self._api.list_resource_slice(field_selector=self.field_selector)
        items = response.get("items") if isinstance(response, Mapping) else response.items
        existing: dict[str, dict[str, Any]] = {}
        for item in items or []:
            obj = self._to_dict(item)
            spec = obj.get("spec", {})
            # Defensive: a server (or fake) ignoring the field selector must not make us
            # touch other nodes' or drivers' slices.
            if spec.get("nodeName") == self.node and spec.get("driver") == self.driver:
                existing[_name(obj)] = obj
        return existing

    def _matches(
        self, want: Mapping[str, Any], have: Mapping[str, Any], ignore_generation: bool
    ) -> bool:
        want_meta, have_meta = want.get("metadata", {}), have.get("metadata", {})
        have_labels = have_meta.get("labels") or {}
        if any(have_labels.get(k) != v for k, v in (want_meta.get("labels") or {}).items()):
            return False
        if "ownerReferences" in want_meta and _drop_empty(
            want_meta["ownerReferences"]
        ) != _drop_empty(have_meta.get("ownerReferences")):
            return False
        if not ignore_generation and _generation(want) != _generation(have):
            return False
        want_key, have_key = _key(want["spec"]), _key(have.get("spec", {}))
        return want_key == have_key or self._server_forms.get(_name(want)) == (want_key, have_key)

    def _in_sync(
        self, wanted: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]]
    ) -> int | None:
        """The pool's generation when it needs no write (every desired slice exists with the
        desired content and one generation, and any other slice of the pool is older, so
        consumers already ignore it), else None."""
        by_name = {_name(e): e for e in current}
        have = [by_name.get(_name(w)) for w in wanted]
        if any(h is None for h in have):
            return None
        generations = {_generation(h) for h in have if h is not None}
        if len(generations) != 1:
            return None
        generation = generations.pop()
        if not all(self._matches(w, h, True) for w, h in zip(wanted, have, strict=True) if h):
            return None
        wanted_names = {_name(w) for w in wanted}
        others = [e for e in current if _name(e) not in wanted_names]
        return generation if all(_generation(e) < generation for e in others) else None

    def _remember_server_form(self, sent: Mapping[str, Any], stored: Any) -> None:
        if stored is None:
            return
        try:
            stored_dict = self._to_dict(stored)
            sent_key, stored_key = _key(sent["spec"]), _key(stored_dict["spec"])
        except (KeyError, TypeError, AttributeError):
            return
        name = _name(sent)
        if sent_key == stored_key:
            self._server_forms.pop(name, None)
        elif self._server_forms.get(name) != (sent_key, stored_key):
            self._server_forms[name] = (sent_key, stored_key)
            log.warning(
                "API server stored a ResourceSlice different from the one sent (fields dropped? "
                "check the DRAPartitionableDevices / DRAConsumableCapacity feature gates)",
                slice=name,
            )

    def _reconcile(self, desired: Sequence[Mapping[str, Any]]) -> PublishResult:
        existing = self._list()
        pools: dict[str, list[Mapping[str, Any]]] = {}
        for body in desired:
            pools.setdefault(_pool(body), []).append(body)

        created: list[str] = []
        updated: list[str] = []
        deleted: list[str] = []
        generations: dict[str, int] = {}
        for pool, wanted in pools.items():
            current = [e for e in existing.values() if _pool(e) == pool]
            current_gen = max((_generation(e) for e in current), default=0)
            in_sync = self._in_sync(wanted, current)
            if in_sync is not None:
                generations[pool] = in_sync  # at most stale, older slices left to delete
                continue
            generation = max(current_gen + 1, max(_generation(w) for w in wanted))
            generations[pool] = generation
            for want in wanted:
                body = copy.deepcopy(dict(want))
                body["spec"]["pool"]["generation"] = generation
                name = _name(body)
                have = existing.get(name)
                if have is not None and _pool(have) != pool:
                    # pool name is immutable: replace by delete + create
                    self._delete(name)
                    deleted.append(name)
                    have = None
                if have is None:
                    stored = self._api.create_resource_slice(body=self._to_model(body))
                    created.append(name)
                elif not self._matches(body, have, False):
                    meta = have.get("metadata", {})
                    body["metadata"]["resourceVersion"] = meta.get("resourceVersion")
                    body["metadata"]["labels"] = {
                        **(meta.get("labels") or {}),
                        **(body["metadata"].get("labels") or {}),
                    }
                    for keep in ("annotations", "finalizers"):
                        if meta.get(keep):
                            body["metadata"][keep] = meta[keep]
                    if "ownerReferences" not in body["metadata"] and meta.get("ownerReferences"):
                        body["metadata"]["ownerReferences"] = meta["ownerReferences"]
                    stored = self._api.replace_resource_slice(name=name, body=self._to_model(body))
                    updated.append(name)
                else:
                    continue
                self._remember_server_form(body, stored)

        wanted_names = {_name(b) for b in desired}
        for name in sorted(existing):
            if name not in wanted_names and name not in deleted:
                self._delete(name)
                deleted.append(name)
        return PublishResult(
            created=tuple(created),
            updated=tuple(updated),
            deleted=tuple(deleted),
            generations=generations,
        )

    def _delete(self, name: str) -> None:
        try:
            self._api.delete_resource_slice(name=name)
        except Exception as exc:
            if _status(exc) != 404:
                raise
        self._server_forms.pop(name, None)
