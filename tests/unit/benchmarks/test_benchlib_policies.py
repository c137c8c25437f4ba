"""``benchlib.Cluster.put_policies`` waits for the sizing policies to be in effect, and a
validating policy in effect before its mutating twin is part of that wait: the API server
refuses the unsized probe claim for a moment (CI once failed ``check_quota_admission --smoke``
with that 422 instead of waiting)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.support.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import benchlib  # noqa: E402


class Layout:
    def claim_spec(self, class_name: str) -> dict[str, Any]:
        return {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class_name}}]}
        }


def refusal(status: int, body: str) -> ApiException:
    exc = ApiException(status=status, reason="refused")
    exc.body = body
    return exc


def cluster_answering(answers: list[Any]) -> tuple[benchlib.Cluster, list[str]]:
    """A Cluster whose dry-run claim POSTs answer ``answers`` in turn (an exception is raised);
    other calls succeed."""
    cluster = object.__new__(benchlib.Cluster)
    calls: list[str] = []

    def call(method: str, path: str, body: Any = None, query: Any = None) -> dict[str, Any]:
        calls.append(f"{method} {path}")
        if query == {"dryRun": "All"}:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return {"spec": answer}
        return {}

    cluster.call = call  # type: ignore[method-assign]
    return cluster, calls


SIZED = {"devices": {"requests": [{"exactly": {"capacity": {"requests": {"slots": "2"}}}}]}}
VAP = "ValidatingAdmissionPolicy 'gpu-fraction-dra-dev-product-sizes' ... denied request"


def test_a_refusal_by_the_validating_twin_is_waited_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchlib, "layout_policies", lambda layout: [])
    monkeypatch.setattr(benchlib, "layout_sized_slots", lambda layout, name: "2")
    cluster, calls = cluster_answering([refusal(422, VAP), refusal(403, VAP), SIZED])
    cluster.put_policies(Layout())
    assert sum(1 for c in calls if c.startswith("POST")) == 3


def test_another_error_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchlib, "layout_policies", lambda layout: [])
    monkeypatch.setattr(benchlib, "layout_sized_slots", lambda layout, name: "2")
    cluster, _ = cluster_answering([refusal(500, "etcd timeout")])
    with pytest.raises(ApiException):
        cluster.put_policies(Layout())
