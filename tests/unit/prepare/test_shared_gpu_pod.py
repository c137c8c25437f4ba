"""Two fraction claims of one pod on one GPU: both CDI specs mount /tmp/nvidia-mps and set
NVIDIA_GPU_MEMORY_*, so a container using both gets one of each, silently. Prepare cannot see
containers; it sees the claims' ``status.reservedFor`` and logs a structured warning naming
both claims on the second claim's Prepare (issue 10, item 17)."""

from __future__ import annotations

from typing import Any

from structlog.testing import capture_logs

from dra_driver.model.plans import ClaimRef
from dra_driver.prepare.preparation import ClaimPreparation
from tests.support import claimfactory as cf
from tests.support.apiserver_stub import ClaimStatusServer
from tests.support.node import NODE, Node

EVENT = "two claims of one pod on one GPU"


def _ref(c: dict[str, Any]) -> ClaimRef:
    m = c["metadata"]
    return ClaimRef(m["namespace"], m["name"], m["uid"])


def _claim(node: Node, gpu: int, *pods: dict[str, Any]) -> dict[str, Any]:
    """A quarter of GPU ``gpu`` (a share of its own) reserved for ``pods``."""
    c = cf.claim([node.share(gpu, "quarter")], reserved_for=list(pods))
    node.claims.add(c)
    return c


def _warnings(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"].startswith(EVENT)]


def _prepare(preparation: ClaimPreparation, *claims: dict[str, Any]) -> list[dict[str, Any]]:
    with capture_logs() as logs:
        out = preparation.prepare(_ref(c) for c in claims)
    assert all(o.error == "" for o in out.values()), out
    return _warnings(logs)


def test_second_claim_of_a_pod_on_the_same_gpu_is_warned(node: Node) -> None:
    web = cf.pod("web")
    first, second = _claim(node, 0, web), _claim(node, 0, web)
    gpu = node.devices[node.device(0, "quarter")].gpu
    preparation = node.preparation()
    try:
        [warning] = _prepare(preparation, first, second)  # one kubelet call for the pod
    finally:
        preparation.close()
    assert warning["log_level"] == "warning"
    assert (warning["claim_uid"], warning["other_claim_uid"]) == (
        second["metadata"]["uid"],
        first["metadata"]["uid"],
    )
    assert warning["name"] == second["metadata"]["name"]
    assert warning["other_name"] == first["metadata"]["name"]
    assert (warning["gpu"], warning["gpu_index"]) == (gpu.uuid, 0)
    assert (warning["pod_uid"], warning["pod"]) == (web["uid"], "web")
    assert "one fraction per GPU per container" in warning["event"]


def test_warned_across_calls_and_forgotten_after_unprepare(node: Node) -> None:
    web = cf.pod("web")
    first, second, third = (_claim(node, 0, web) for _ in range(3))
    preparation = node.preparation()
    try:
        assert _prepare(preparation, first) == []
        assert [w["other_claim_uid"] for w in _prepare(preparation, second)] == [
            first["metadata"]["uid"]
        ]
        preparation.unprepare([_ref(first), _ref(second)])
        assert _prepare(preparation, third) == []
    finally:
        preparation.close()


def test_no_warning_for_other_gpus_or_other_pods(node: Node) -> None:
    web, db = cf.pod("web"), cf.pod("db")
    preparation = node.preparation()
    try:
        assert _prepare(preparation, _claim(node, 0, web), _claim(node, 1, web)) == []
        assert _prepare(preparation, _claim(node, 0, db), _claim(node, 0)) == []
        shared = _claim(node, 1, cf.pod("api-0"), cf.pod("api-1"))  # one claim, two pods
        assert _prepare(preparation, shared) == []
    finally:
        preparation.close()


def test_warned_when_the_claims_are_read_in_protobuf(node: Node) -> None:
    """The real API server answers Prepare's read in protobuf; its view dropped
    ``status.reservedFor`` and this warning never fired there (found by review)."""
    web = cf.pod("web")
    first, second = (
        cf.on_node(cf.claim([node.share(0, "quarter")], reserved_for=[web]), NODE) for _ in range(2)
    )
    with ClaimStatusServer() as server:
        for c in (first, second):
            server.add(c)
        preparation = node.preparation(claims=server)
        try:
            [warning] = _prepare(preparation, first, second)
        finally:
            preparation.close()
    assert warning["other_claim_uid"] == first["metadata"]["uid"]
