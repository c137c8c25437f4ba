"""``DRAPlugin`` v1 and v1beta1: NodePrepareResources / NodeUnprepareResources.

Both versions have the same messages (v1 adds ``share_id`` on devices), so one servicer
class serves both, parameterized by the version's generated message module.

Replies are bounded: the kubelet's gRPC client refuses a message over gRPC's default
maximum of 4 MiB (``RESOURCE_EXHAUSTED``) and would then get no result at all, not even for
the claims that were prepared. Error texts are cut to :data:`MAX_ERROR_BYTES` each and, all
together, to what :data:`MAX_REPLY_BYTES` leaves after the prepared devices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

import grpc
import structlog

from dra_driver._proto import dra_v1_pb2, dra_v1beta1_pb2
from dra_driver.model.errors import PrepareError
from dra_driver.model.ids import validate_uid
from dra_driver.model.plans import ClaimRef
from dra_driver.model.textlimits import shown, utf8_bounded
from dra_driver.prepare.preparation import ClaimPreparation

log = structlog.get_logger(__name__)

MAX_REPLY_BYTES = 3 * 2**20
"""Budget of one reply: below gRPC's default 4 MiB maximum receive size, which the kubelet's
DRA client keeps."""
MAX_ERROR_BYTES = 1_000
"""Most bytes of one claim's error text."""
MIN_ERROR_BYTES = 64
"""Fewest bytes of an error text cut to fit: a shorter cut says nothing, so the entry is left
out instead."""
ENTRY_OVERHEAD_BYTES = 16
"""Upper bound of the protobuf framing of one ``claims`` map entry with an error: tags and
length varints (the protobuf encoding spec) for the entry, its key, its value and the
value's ``error`` field."""


def _is_uid(uid: str) -> bool:
    try:
        validate_uid(uid)
    except PrepareError:
        return False
    return True


def bounded_errors(
    errors: Mapping[str, str], budget: int, cap: int = MAX_ERROR_BYTES
) -> dict[str, str]:
    """Error texts by claim UID that fit ``budget`` bytes of reply together with their UIDs.

    Each text becomes valid UTF-8 (protobuf strings must be) of at most ``cap`` bytes, cut
    with ``... (<n> characters)``. Entries take the budget in turn, each at most an equal
    share of what is left, claims with well-formed UIDs and short UIDs first; an entry whose
    share cannot hold its UID and :data:`MIN_ERROR_BYTES` of text is left out (the kubelet
    then reports that claim as missing from the reply and retries it).

    Args:
        errors: error text by claim UID (non-empty texts).
        budget: bytes the entries may take, framing included.
        cap: most bytes of one text.
    """
    ordered = sorted(errors.items(), key=lambda item: (not _is_uid(item[0]), len(item[0])))
    out: dict[str, str] = {}
    left = budget
    for done, (uid, text) in enumerate(ordered):
        key_cost = len(uid.encode()) + ENTRY_OVERHEAD_BYTES
        room = min(cap, left // (len(ordered) - done) - key_cost)
        if room < min(MIN_ERROR_BYTES, len(text.encode("utf-8", "backslashreplace"))):
            continue
        out[uid] = utf8_bounded(text, room)
        left -= key_cost + len(out[uid].encode())
    return out


def claim_refs(claims: Iterable[Any]) -> tuple[list[ClaimRef], dict[str, str]]:
    """The request's claims, each UID once, and errors for UIDs listed with different names.

    The kubelet lists a claim once; a UID that comes with two namespace/name pairs cannot be
    resolved, so that claim fails instead of one of the pairs winning silently.
    """
    by_uid: dict[str, ClaimRef] = {}
    conflicts: dict[str, str] = {}
    for c in claims:
        ref = ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid)
        seen = by_uid.setdefault(ref.uid, ref)
        if seen != ref:
            conflicts[ref.uid] = (
                f"claim UID {shown(ref.uid)} is listed with two names, "
                f"{shown(f'{seen.namespace}/{seen.name}')} and "
                f"{shown(f'{ref.namespace}/{ref.name}')}; list each claim once"
            )
    return [r for u, r in by_uid.items() if u not in conflicts], conflicts


class DraServicer:
    """One ``DRAPlugin`` version over a :class:`ClaimPreparation`.

    Args:
        preparation: does the work.
        pb: the version's message module (``dra_v1_pb2`` or ``dra_v1beta1_pb2``); devices
            get a ``share_id`` only where its ``Device`` message has the field (v1).
    """

    def __init__(self, preparation: ClaimPreparation, pb: ModuleType) -> None:
        self.preparation = preparation
        self.pb = pb
        self.with_share_id = "share_id" in pb.Device.DESCRIPTOR.fields_by_name

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Prepare every claim in the request; per-claim errors go in the reply."""
        refs, errors = claim_refs(request.claims)
        reply = self.pb.NodePrepareResourcesResponse()
        for uid, outcome in self.preparation.prepare(refs).items():
            if outcome.error:
                errors[uid] = outcome.error
                continue
            entry = reply.claims[uid]
            for d in outcome.devices:
                device = entry.devices.add(
                    request_names=list(d.request_names),
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=list(d.cdi_device_ids),
                )
                if self.with_share_id and d.share_id:
                    device.share_id = d.share_id
        self._add_errors(reply, errors)
        return reply

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Unprepare every claim in the request; per-claim errors go in the reply."""
        refs, errors = claim_refs(request.claims)
        reply = self.pb.NodeUnprepareResourcesResponse()
        for uid, error in self.preparation.unprepare(refs).items():
            if error:
                errors[uid] = error
            else:
                reply.claims[uid].error = ""
        self._add_errors(reply, errors)
        return reply

    def _add_errors(self, reply: Any, errors: Mapping[str, str]) -> None:
        kept = bounded_errors(errors, MAX_REPLY_BYTES - reply.ByteSize())
        for uid, text in kept.items():
            reply.claims[uid].error = text
        if len(kept) < len(errors):
            log.error(
                "reply size limit reached; claims left out of the reply",
                left_out=len(errors) - len(kept),
                limit_bytes=MAX_REPLY_BYTES,
            )


def v1_servicer(preparation: ClaimPreparation) -> DraServicer:
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``."""
    return DraServicer(preparation, dra_v1_pb2)


def v1beta1_servicer(preparation: ClaimPreparation) -> DraServicer:
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`` (deprecated in 1.34, still served)."""
    return DraServicer(preparation, dra_v1beta1_pb2)
