"""Log lines stay bounded whatever the claims and requests carry."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator

import pytest
import structlog

from dra_driver.infra import logs
from dra_driver.model.plans import ClaimRef
from tests.support.node import Node


@pytest.fixture
def json_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """The plugin's JSON log set-up writing to a buffer as its stderr; restored afterwards."""
    saved = structlog.get_config()
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    logs.configure("info", "json")
    yield out
    structlog.configure(**saved)


def test_long_values_are_cut_in_log_lines(json_logs: io.StringIO) -> None:
    structlog.get_logger("t").warning(
        "claim prepare failed",
        name="n" * 65_536,
        devices=["d" * 5_000, "gpu-0"],
        detail={"why": "w" * 3_000},
        count=3,
    )
    line = json_logs.getvalue().strip()
    doc = json.loads(line)
    assert len(line) < 4_000
    assert doc["name"] == "n" * logs.MAX_LOG_VALUE_CHARS + "... (65536 characters)"
    assert doc["devices"] == ["d" * logs.MAX_LOG_VALUE_CHARS + "... (5000 characters)", "gpu-0"]
    assert doc["detail"]["why"].endswith("... (3000 characters)")
    assert doc["count"] == 3
    assert doc["event"] == "claim prepare failed"


def test_prepares_of_a_claim_with_a_huge_name_log_little(
    node: Node, json_logs: io.StringIO
) -> None:
    preparation = node.preparation()
    json_logs.truncate(0)
    json_logs.seek(0)
    name = "n" * 65_536
    for i in range(20):
        uid = f"00000000-0000-4000-8000-{i:012d}"
        assert "characters" in preparation.prepare([ClaimRef("default", name, uid)])[uid].error
    preparation.close()
    written = len(json_logs.getvalue())
    assert written < 20 * 4_000, written
