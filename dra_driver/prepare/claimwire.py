"""Pure: a ResourceClaim in the API server's protobuf encoding, for status writes.

The API server refuses a claim status update whose ``status.allocation`` differs from the
stored one, comparing the bytes of each opaque configuration's ``parameters``
(``apimachineryvalidation.ValidateImmutableField``, a deep equality on the raw bytes). It
stores those bytes as the claim's or class's creator sent them, but serves JSON compacted with
``<``, ``>`` and ``&`` escaped: a claim created by a Python client (``json.dumps`` puts a space
after ``:`` and ``,``) or with keys in another order cannot be sent back unchanged as JSON, and
every JSON update, merge patch, JSON patch or server-side apply of its status fails with 422
``status.allocation: field cannot be modified once set`` (seen on Kubernetes 1.37.2). The
protobuf encoding carries the bytes as stored, so the writer reads and updates claims in it
(``proto/k8s_resourceclaim.proto``: the few messages and fields needed, with the field numbers
of k8s.io/api v0.37.2; everything else passes through as encoded bytes or unknown fields).

Prepare reads claims in it too (:class:`~dra_driver.prepare.claims.ApiClaimReader`), so that the
writer can update a claim from the message Prepare read, without reading it again.

Shapes: :func:`decode` takes a response body (``k8s\\0`` + ``runtime.Unknown``) and returns the
claim message; :func:`view` gives the JSON-shaped parts Prepare plans from and the writer
decides on (``{"metadata": {"name", "namespace", "uid", "resourceVersion"}, "status":
{"allocation"?: {"devices": {"results": [...], "config": [...]}, "nodeSelector": {...}},
"reservedFor"?: [{"apiGroup"?, "resource", "name", "uid"}], "devices": [AllocatedDeviceStatus
as API JSON]}}``); :func:`with_devices` and :func:`encode`
build the update body.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from dra_driver._proto import k8s_resourceclaim_pb2 as pb
from dra_driver.model.errors import DriverError

MAGIC = b"k8s\x00"
"""The prefix of every protobuf body of the Kubernetes API."""

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
"""The media type of requests and responses in protobuf."""

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceClaim"

_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


class WireError(DriverError, ValueError):
    """A body that is not a protobuf ResourceClaim of the Kubernetes API."""


def decode(body: bytes) -> pb.ResourceClaim:
    """The claim of a protobuf response body.

    Raises:
        WireError: the body lacks the ``k8s\\0`` envelope, holds another kind, or does not
            parse.
    """
    if not body.startswith(MAGIC):
        raise WireError(f"not a Kubernetes protobuf body (starts with {body[:8]!r})")
    try:
        unknown = pb.Unknown.FromString(body[len(MAGIC) :])
        if unknown.typeMeta.kind and unknown.typeMeta.kind != KIND:
            raise WireError(f"a {unknown.typeMeta.kind}, not a {KIND}")
        return pb.ResourceClaim.FromString(unknown.raw)
    except WireError:
        raise
    except Exception as exc:  # the protobuf runtime's DecodeError and friends
        raise WireError(f"protobuf {KIND} does not parse: {exc}") from exc


def status_message(body: bytes) -> str | None:
    """The ``message`` of a protobuf ``Status`` body (a refusal), else None (not protobuf, not
    a Status, or it does not parse)."""
    if not body.startswith(MAGIC):
        return None
    try:
        unknown = pb.Unknown.FromString(body[len(MAGIC) :])
        if unknown.typeMeta.kind != "Status":
            return None
        return pb.Status.FromString(unknown.raw).message
    except Exception:  # the protobuf runtime's DecodeError and friends
        return None


def encode(claim: pb.ResourceClaim) -> bytes:
    """The request body of an update of ``claim`` (envelope included)."""
    unknown = pb.Unknown(
        typeMeta=pb.TypeMeta(apiVersion=API_VERSION, kind=KIND), raw=claim.SerializeToString()
    )
    return MAGIC + unknown.SerializeToString()


def _stamp(t: pb.Time) -> str:
    return datetime.fromtimestamp(t.seconds, UTC).strftime(_TIME_FORMAT)


def _time(text: str) -> pb.Time:
    """An RFC 3339 time of the form the writer uses (``2026-12-01T10:00:00Z``)."""
    moment = datetime.strptime(text, _TIME_FORMAT).replace(tzinfo=UTC)
    return pb.Time(seconds=int(moment.timestamp()))


def condition_json(c: pb.Condition) -> dict[str, Any]:
    """A condition as API JSON (the fields that are set)."""
    out: dict[str, Any] = {"type": c.type, "status": c.status}
    if c.observedGeneration:  # the API server encodes 0, and its JSON omits it
        out["observedGeneration"] = c.observedGeneration
    if c.HasField("lastTransitionTime"):
        out["lastTransitionTime"] = _stamp(c.lastTransitionTime)
    out["reason"] = c.reason
    out["message"] = c.message
    return out


def device_json(d: pb.AllocatedDeviceStatus) -> dict[str, Any]:
    """An ``AllocatedDeviceStatus`` as API JSON (``networkData`` is left out: the plugin
    never writes it, and another driver's entry is passed through as it was read)."""
    out: dict[str, Any] = {"driver": d.driver, "pool": d.pool, "device": d.device}
    if d.HasField("shareID"):
        out["shareID"] = d.shareID
    if d.data.raw:
        out["data"] = json.loads(d.data.raw)
    if d.conditions:
        out["conditions"] = [condition_json(c) for c in d.conditions]
    return out


def device_message(entry: Mapping[str, Any]) -> pb.AllocatedDeviceStatus:
    """An entry of :func:`dra_driver.observe.claimstatus.device_status` as a message.

    Raises:
        KeyError, ValueError: the entry lacks ``driver``, ``pool`` or ``device``, or a
            condition's time is not of the form ``YYYY-MM-DDTHH:MM:SSZ``.
    """
    d = pb.AllocatedDeviceStatus(driver=entry["driver"], pool=entry["pool"], device=entry["device"])
    if entry.get("shareID"):
        d.shareID = entry["shareID"]
    if "data" in entry:
        d.data.raw = json.dumps(entry["data"], separators=(",", ":")).encode()
    for c in entry.get("conditions") or []:
        m = d.conditions.add(type=c["type"], status=c["status"], reason=c["reason"])
        m.message = c["message"]
        if "observedGeneration" in c:
            m.observedGeneration = c["observedGeneration"]
        m.lastTransitionTime.CopyFrom(_time(c["lastTransitionTime"]))
    return d


def _selector_json(s: pb.NodeSelector) -> dict[str, Any]:
    def requirement(r: pb.NodeSelectorRequirement) -> dict[str, Any]:
        return {"key": r.key, "operator": r.operator, "values": list(r.values)}

    return {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [requirement(r) for r in t.matchExpressions],
                "matchFields": [requirement(r) for r in t.matchFields],
            }
            for t in s.nodeSelectorTerms
        ]
    }


def _result_json(r: pb.DeviceRequestAllocationResult) -> dict[str, Any]:
    out: dict[str, Any] = {"request": r.request, "driver": r.driver, "pool": r.pool}
    out["device"] = r.device
    if r.HasField("adminAccess"):
        out["adminAccess"] = r.adminAccess
    if r.HasField("shareID"):
        out["shareID"] = r.shareID
    if r.consumedCapacity:
        out["consumedCapacity"] = {k: q.string for k, q in sorted(r.consumedCapacity.items())}
    return out


def _config_json(c: pb.DeviceAllocationConfiguration) -> dict[str, Any]:
    out: dict[str, Any] = {"source": c.source}
    if c.requests:
        out["requests"] = list(c.requests)
    if c.deviceConfiguration.HasField("opaque"):
        opaque = c.deviceConfiguration.opaque
        out["opaque"] = {"driver": opaque.driver, "parameters": json.loads(opaque.parameters.raw)}
    return out


def _consumer_json(encoded: bytes) -> dict[str, Any]:
    """One ``status.reservedFor`` entry as API JSON (``apiGroup`` only when set, as the API
    server's JSON omits an empty one)."""
    r = pb.ResourceClaimConsumerReference.FromString(encoded)
    out: dict[str, Any] = {"resource": r.resource, "name": r.name, "uid": r.uid}
    if r.apiGroup:
        out["apiGroup"] = r.apiGroup
    return out


def _allocation_json(a: pb.AllocationResult) -> dict[str, Any]:
    """``status.allocation`` as API JSON: the devices' results and configs (the fields
    :mod:`dra_driver.prepare.allocation` reads, each only when set, as the API server's JSON
    omits it) and the node selector."""
    devices = {
        "results": [_result_json(r) for r in a.devices.results],
        "config": [_config_json(c) for c in a.devices.config],
    }
    return {"devices": devices, "nodeSelector": _selector_json(a.nodeSelector)}


def view(claim: pb.ResourceClaim) -> dict[str, Any]:
    """The JSON-shaped parts of ``claim`` that Prepare plans from and the writer decides on
    (see the module).

    Raises:
        WireError: the allocation or a device's ``data`` does not parse, or opaque
            parameters are not JSON.
    """
    try:
        status: dict[str, Any] = {"devices": [device_json(d) for d in claim.status.devices]}
        if claim.status.reservedFor:
            status["reservedFor"] = [_consumer_json(r) for r in claim.status.reservedFor]
        if claim.status.HasField("allocation"):
            allocation = pb.AllocationResult.FromString(claim.status.allocation)
            status["allocation"] = _allocation_json(allocation)
    except Exception as exc:  # DecodeError, or data that is not JSON
        raise WireError(f"{KIND} status does not parse: {exc}") from exc
    meta = claim.metadata
    return {
        "metadata": {
            "name": meta.name,
            "namespace": meta.namespace,
            "uid": meta.uid,
            "resourceVersion": meta.resourceVersion,
        },
        "status": status,
    }


def _key(driver: str, pool: str, device: str, share_id: str) -> tuple[str, str, str, str]:
    return (driver, pool, device, share_id)


def with_devices(claim: pb.ResourceClaim, entries: Sequence[Mapping[str, Any]]) -> pb.ResourceClaim:
    """A copy of ``claim`` with ``entries`` in ``status.devices``: an entry with the same
    driver, pool, device and share ID replaces the one read (in place), others (other
    drivers', other devices') are kept as read, new ones are appended. The rest of the claim,
    ``status.allocation`` above all, is left as read."""
    mine = {
        _key(e["driver"], e["pool"], e["device"], e.get("shareID") or ""): device_message(e)
        for e in entries
    }
    out = pb.ResourceClaim()
    out.CopyFrom(claim)
    del out.status.devices[:]
    for d in claim.status.devices:
        new = mine.pop(_key(d.driver, d.pool, d.device, d.shareID), None)
        out.status.devices.append(new if new is not None else d)
    out.status.devices.extend(mine.values())
    return out
