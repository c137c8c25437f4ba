"""Bounded text: echoed values, log values and whole Prepare replies (gRPC's 4 MiB limit)."""

from __future__ import annotations

import uuid

import pytest

from dra_driver._proto import dra_v1_pb2
from dra_driver.kubelet.dra import MAX_ERROR_BYTES, bounded_errors
from dra_driver.model.apijson import Field, json_kind
from dra_driver.model.errors import PrepareError
from dra_driver.model.textlimits import MAX_VALUE_CHARS, shorten, shown, utf8_bounded


def test_shown_escapes_and_cuts_with_the_original_length() -> None:
    assert shown("gpu\n\x00") == "'gpu\\n\\x00'"
    long = shown("x" * 1_000_000)
    assert long.startswith("'xxx") and long.endswith("... (1000000 characters)")
    assert len(long) < MAX_VALUE_CHARS + 30
    assert shown([1] * 1000).endswith(f"... ({len(repr([1] * 1000))} characters)")
    assert shorten("short") == "short"


def test_utf8_bounded_is_valid_utf8_within_the_budget() -> None:
    text = "\ud800" + "é" * 10_000
    out = utf8_bounded(text, 500)
    assert len(out.encode()) <= 500
    assert out.startswith("\\ud800é") and out.endswith("(10001 characters)")
    assert utf8_bounded("ok", 10) == "ok"
    assert utf8_bounded("x" * 100, 5) == "xxxxx"


def reply_size(errors: dict[str, str]) -> int:
    reply = dra_v1_pb2.NodePrepareResourcesResponse()
    for uid, text in errors.items():
        reply.claims[uid].error = text
    return reply.ByteSize()


def test_many_long_errors_share_the_budget() -> None:
    errors = {str(uuid.uuid4()): "e" * 5_000 for _ in range(10_000)}
    budget = 3 * 2**20
    out = bounded_errors(errors, budget)
    assert set(out) == set(errors)
    assert reply_size(out) <= budget
    assert all(len(t.encode()) <= MAX_ERROR_BYTES for t in out.values())
    assert all(t.endswith("(5000 characters)") for t in out.values())


def test_claims_with_real_uids_come_first_when_not_all_fit() -> None:
    real = {str(uuid.uuid4()): "not found" for _ in range(10)}
    junk = {f"{i}" + "u" * 2**20: "not a Kubernetes UID" for i in range(5)}
    budget = 3 * 2**20
    out = bounded_errors({**junk, **real}, budget)
    assert out.items() >= real.items()
    assert 0 < len(set(out) & set(junk)) < len(junk)
    assert reply_size(out) <= budget


def test_field_paths_and_json_kinds() -> None:
    claim = Field({"status": {"results": [{"shareID": 4}]}}, owner="claim a/b", root="Claim")
    share = claim["status"]["results"].items()[0]["shareID"]
    with pytest.raises(PrepareError, match=r"^claim a/b: status\.results\[0\]\.shareID: expected "):
        share.string()
    assert claim["metadata"]["uid"].absent
    with pytest.raises(PrepareError, match="metadata.uid: missing; expected a string"):
        claim["metadata"]["uid"].string()
    with pytest.raises(PrepareError, match="^Claim: expected an object, got a list"):
        Field([], root="Claim").object()
    assert [json_kind(v) for v in (None, True, 1, 1.5, "s", [], {})] == [
        "null",
        "a boolean",
        "a number",
        "a number",
        "a string",
        "a list",
        "an object",
    ]
