"""The pure decision of what to write: desired ResourceSlices vs stored ones -> ordered writes.

Inputs are API JSON dicts only: the desired bodies as :func:`dra_driver.publish.slices.build_slices`
renders them, and the stored slices as read from the API server (``metadata.resourceVersion``
set). :func:`diff_slices` returns the writes that make the stored set equal the desired one,
in the order :mod:`dra_driver.publish.publisher` must apply them, and the generation of every pool.
No I/O; the inputs are never modified.

The rules (the ResourceSlice API, ``k8s.io/api/resource/v1``, types.go ``ResourcePool``):

- per pool, the stored ``generation`` is kept when every desired slice already exists with the
  desired content, with one generation, and any other stored slice of the pool is older (so
  consumers already ignore it); otherwise *every* desired slice of the pool is written with
  ``stored + 1`` (at least the desired bodies' own generation), as the API requires of a
  changed pool;
- content is compared semantically: quantities by value (``1Gi`` == ``1073741824``), taint
  times by instant (``...Z`` == ``...+00:00``, the client's rendering), empty fields
  dropped, the labels we set (others' labels are kept), owner references when we set them,
  and the spec; a stored form the server is known to produce from what was sent
  (:data:`ServerForms`) counts as equal;
- a slice whose pool name changed is deleted and created again (``spec.pool.name`` is
  immutable); slices no longer desired are deleted last, by name.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from dra_driver.model.quantities import quantity_value

WriteOp = Literal["create", "update", "delete"]

ServerForms = Mapping[str, tuple[str, str]]
"""Slice name -> (key of the spec sent, key of the spec the server stored), where the two
differ (fields of a disabled feature gate dropped); keys come from :func:`spec_key`."""


@dataclass(frozen=True)
class SliceWrite:
    """One write call.

    Attributes:
        op: ``create`` (POST ``body``), ``update`` (PUT ``body``, whose
            ``metadata.resourceVersion`` makes a concurrent change a conflict) or ``delete``.
        name: the slice's ``metadata.name``.
        body: the full ResourceSlice as API JSON for create and update; empty for delete.
    """

    op: WriteOp
    name: str
    body: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SliceDiff:
    """What :func:`diff_slices` decided.

    Attributes:
        writes: the calls to make, in order; empty when everything already matches.
        generations: pool name -> generation published once the writes are done.
    """

    writes: tuple[SliceWrite, ...] = ()
    generations: Mapping[str, int] = field(default_factory=dict)


def _norm_quantity(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return f"q:{quantity_value(value)}"
    except ValueError:
        return value


def _norm_time(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    if moment.tzinfo is None:
        return value
    return f"t:{moment.timestamp()}"


def _drop_empty(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _drop_empty(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None and v != [] and v != {}}
    if isinstance(value, list):
        return [_drop_empty(v) for v in value]
    return value


def normalize_spec(spec: Mapping[str, Any], ignore_generation: bool = False) -> dict[str, Any]:
    """A ResourceSlice spec with quantities replaced by their exact values, taint times by
    their instant and empty fields dropped, for comparison; ``ignore_generation`` removes
    ``pool.generation``."""
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
        for taint in device.get("taints", []):
            if "timeAdded" in taint:
                taint["timeAdded"] = _norm_time(taint["timeAdded"])
    return out


def spec_key(spec: Mapping[str, Any]) -> str:
    """The comparison key of a spec: :func:`normalize_spec` without generation, as JSON."""
    return json.dumps(normalize_spec(spec, ignore_generation=True), sort_keys=True)


def slice_name(obj: Mapping[str, Any]) -> str:
    """``metadata.name`` of a ResourceSlice (KeyError when absent)."""
    return str(obj["metadata"]["name"])


def _pool(obj: Mapping[str, Any]) -> str:
    return str(obj.get("spec", {}).get("pool", {}).get("name", ""))


def _generation(obj: Mapping[str, Any]) -> int:
    return int(obj.get("spec", {}).get("pool", {}).get("generation", 0))


def check_desired(desired: Sequence[Mapping[str, Any]], driver: str, node: str) -> None:
    """Check that every desired slice is for ``node`` and ``driver`` and names are unique.

    Raises:
        ValueError: a slice of another node or driver, or a duplicate name.
    """
    names: set[str] = set()
    for body in desired:
        spec = body.get("spec", {})
        if spec.get("driver") != driver or spec.get("nodeName") != node:
            raise ValueError(
                f"slice {body.get('metadata', {}).get('name')!r} is not for node "
                f"{node!r} and driver {driver!r}"
            )
        name = slice_name(body)
        if name in names:
            raise ValueError(f"duplicate slice name {name!r}")
        names.add(name)


def owned_slices(
    stored: Sequence[Mapping[str, Any]], driver: str, node: str
) -> list[Mapping[str, Any]]:
    """The stored slices whose ``spec.nodeName`` is ``node`` and ``spec.driver`` ``driver``.

    Defensive: a server ignoring the list's field selector must not make the publisher touch
    other nodes' or drivers' slices.
    """
    return [
        obj
        for obj in stored
        if obj.get("spec", {}).get("nodeName") == node
        and obj.get("spec", {}).get("driver") == driver
    ]


def stored_form(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> tuple[str, str] | None:
    """(sent key, stored key) when the server stored a spec other than ``sent``'s, else None
    (the entry :data:`ServerForms` keeps for the slice)."""
    sent_key, stored_key = spec_key(sent["spec"]), spec_key(stored["spec"])
    return None if sent_key == stored_key else (sent_key, stored_key)


def _matches(
    want: Mapping[str, Any],
    have: Mapping[str, Any],
    ignore_generation: bool,
    server_forms: ServerForms,
) -> bool:
    want_meta, have_meta = want.get("metadata", {}), have.get("metadata", {})
    have_labels = have_meta.get("labels") or {}
    if any(have_labels.get(k) != v for k, v in (want_meta.get("labels") or {}).items()):
        return False
    if "ownerReferences" in want_meta and _drop_empty(want_meta["ownerReferences"]) != _drop_empty(
        have_meta.get("ownerReferences")
    ):
        return False
    if not ignore_generation and _generation(want) != _generation(have):
        return False
    want_key, have_key = spec_key(want["spec"]), spec_key(have.get("spec", {}))
    return want_key == have_key or server_forms.get(slice_name(want)) == (want_key, have_key)


def _in_sync(
    wanted: Sequence[Mapping[str, Any]],
    current: Sequence[Mapping[str, Any]],
    server_forms: ServerForms,
) -> int | None:
    """The pool's generation when it needs no write, else None (see the module's rules)."""
    by_name = {slice_name(e): e for e in current}
    have = [by_name.get(slice_name(w)) for w in wanted]
    if any(h is None for h in have):
        return None
    generations = {_generation(h) for h in have if h is not None}
    if len(generations) != 1:
        return None
    generation = generations.pop()
    pairs = zip(wanted, have, strict=True)
    if not all(_matches(w, h, True, server_forms) for w, h in pairs if h):
        return None
    wanted_names = {slice_name(w) for w in wanted}
    others = [e for e in current if slice_name(e) not in wanted_names]
    return generation if all(_generation(e) < generation for e in others) else None


def _update_body(body: dict[str, Any], have: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` with the stored ``resourceVersion``, the stored labels under ours, and the
    stored annotations, finalizers and (when we set none) owner references kept."""
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
    return body


def _slice_writes(
    want: Mapping[str, Any],
    have: Mapping[str, Any] | None,
    generation: int,
    server_forms: ServerForms,
) -> list[SliceWrite]:
    """The writes that store ``want`` at ``generation`` over ``have`` (None: not stored)."""
    body = copy.deepcopy(dict(want))
    body["spec"]["pool"]["generation"] = generation
    name = slice_name(body)
    if have is not None and _pool(have) != _pool(body):
        return [SliceWrite("delete", name), SliceWrite("create", name, body)]
    if have is None:
        return [SliceWrite("create", name, body)]
    if _matches(body, have, False, server_forms):
        return []
    return [SliceWrite("update", name, _update_body(body, copy.deepcopy(dict(have))))]


def diff_slices(
    desired: Sequence[Mapping[str, Any]],
    stored: Sequence[Mapping[str, Any]],
    server_forms: ServerForms | None = None,
) -> SliceDiff:
    """The writes that make ``stored`` equal ``desired`` (rules in the module docstring).

    Args:
        desired: ResourceSlice bodies (API JSON), names unique (see :func:`check_desired`).
        stored: the stored slices of this node and driver (API JSON, see
            :func:`owned_slices`), with ``metadata.resourceVersion``.
        server_forms: stored forms known to be the server's rendering of what was sent.

    Returns:
        Per pool, in the order pools first appear in ``desired``: for each desired slice a
        create, an update, a delete + create (pool renamed) or nothing; then deletes of
        stored slices no longer desired, sorted by name.
    """
    forms: ServerForms = server_forms or {}
    by_name = {slice_name(obj): obj for obj in stored}
    pools: dict[str, list[Mapping[str, Any]]] = {}
    for body in desired:
        pools.setdefault(_pool(body), []).append(body)
    writes: list[SliceWrite] = []
    generations: dict[str, int] = {}
    for pool, wanted in pools.items():
        current = [obj for obj in by_name.values() if _pool(obj) == pool]
        in_sync = _in_sync(wanted, current, forms)
        if in_sync is not None:
            generations[pool] = in_sync  # at most stale, older slices left to delete
            continue
        current_gen = max((_generation(obj) for obj in current), default=0)
        generation = max(current_gen + 1, max(_generation(w) for w in wanted))
        generations[pool] = generation
        for want in wanted:
            writes += _slice_writes(want, by_name.get(slice_name(want)), generation, forms)
    wanted_names = {slice_name(body) for body in desired}
    writes += [SliceWrite("delete", n) for n in sorted(by_name) if n not in wanted_names]
    return SliceDiff(writes=tuple(writes), generations=generations)
