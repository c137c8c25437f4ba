"""The kubelet stand-in (hack/kubelet_standin.py) without an API server: its pure helpers,
its checkpoint, and its plugin watcher against the real plugin servers on unix sockets."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver._proto import registration_pb2, registration_pb2_grpc
from dra_driver.kubelet.server import PluginServer, SocketPaths
from tests import claimfactory as cf
from tests.conftest import NODE, Node

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hack"))
import kubelet_standin as ks  # noqa: E402


def test_choose_version_follows_the_plugins_order() -> None:
    assert ks.choose_version(["v1.DRAPlugin", "v1beta1.DRAPlugin"]) == "v1.DRAPlugin"
    assert ks.choose_version(["v1beta1.DRAPlugin", "v1.DRAPlugin"]) == "v1beta1.DRAPlugin"
    assert ks.choose_version(["v1.DRAResourceHealth", "v1beta1.DRAPlugin"]) == "v1beta1.DRAPlugin"
    assert ks.choose_version(["v1.DRAPlugin"], known=("v1beta1.DRAPlugin",)) is None
    assert ks.choose_version([]) is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpu-fraction.dra.dev-reg.sock", True),
        ("gpu-fraction.dra.dev-0f3a-reg.sock", True),
        (".gpu-fraction.dra.dev-reg.sock", False),
        ("gpu-fraction.dra.dev.sock", False),
        ("dra.sock", False),
    ],
)
def test_registration_socket_names(name: str, expected: bool) -> None:
    assert ks.is_registration_socket(name) is expected


def test_pod_claims_resolves_direct_and_template_claims() -> None:
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "direct", "resourceClaimName": "shared"},
                {"name": "made", "resourceClaimTemplateName": "t"},
                {"name": "pending", "resourceClaimTemplateName": "t"},
                {"name": "skipped", "resourceClaimTemplateName": "t"},
            ]
        },
        "status": {
            "resourceClaimStatuses": [
                {"name": "made", "resourceClaimName": "pod-made-x1"},
                {"name": "skipped"},
            ]
        },
    }
    assert ks.pod_claims(pod) == [
        ks.PodClaim("direct", "shared"),
        ks.PodClaim("made", "pod-made-x1"),
        ks.PodClaim("pending", None),
        ks.PodClaim("skipped", None, needed=False),
    ]
    assert ks.pod_claims({"spec": {}}) == []


def test_claim_readiness() -> None:
    claim = cf.claim([cf.result("gpu-0-quarter-0", NODE)])
    assert ks.claim_not_ready_reason(claim, "pod-1") == (
        f"claim default/{claim['metadata']['name']} is not reserved for the pod"
    )
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-1"}]
    assert ks.claim_not_ready_reason(claim, "pod-1") is None
    assert "not allocated" in str(ks.claim_not_ready_reason({"metadata": {}}, "pod-1"))
    other = cf.result("x", NODE, driver="other.example.com")
    claim["status"]["allocation"]["devices"]["results"].append(other)
    assert ks.claim_drivers(claim) == ["gpu-fraction.dra.dev", "other.example.com"]


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "standin.json"
    cp = ks.Checkpoint(path)
    cp.claims["u1"] = ks.ClaimRecord("ns", "c", "u1", ["d"], {"p1", "p2"}, prepared=True)
    cp.save()
    again = ks.Checkpoint(path)
    again.load()
    assert again.claims == cp.claims
    path.write_text("{not json")
    broken = ks.Checkpoint(path)
    broken.load()
    assert broken.claims == {}
    ks.Checkpoint(None).save()  # memory only: no file, no error


@pytest.fixture
def plugin(node: Node) -> Iterator[tuple[Node, PluginServer]]:
    paths = SocketPaths.for_driver(
        DEFAULT_DRIVER_NAME, str(node.plugin_dir), str(node.registry_dir)
    )
    driver = node.driver()
    server = PluginServer(driver, paths, node.health, health_interval=0.2)
    server.start()
    yield node, server
    server.stop(grace=0.5)
    driver.close()


def test_registry_registers_prepares_and_forgets(plugin: tuple[Node, PluginServer]) -> None:
    node, server = plugin
    changes = []
    registry = ks.PluginRegistry(node.registry_dir, on_change=lambda: changes.append(1))
    registry.scan()
    found = registry.plugin(DEFAULT_DRIVER_NAME)
    assert found is not None
    assert found.version == "v1.DRAPlugin"
    assert found.endpoint == str(server.paths.dra)
    assert server.registration.registered.is_set()
    assert changes == [1]

    claim = cf.claim([cf.result("gpu-1-quarter-2", NODE)], namespace="ns", name="c1")
    node.claims.claims[("ns", "c1")] = claim
    uid = claim["metadata"]["uid"]
    record = ks.ClaimRecord("ns", "c1", uid, [DEFAULT_DRIVER_NAME])
    reply = found.prepare([record])
    assert reply[uid]["error"] == ""
    [device] = reply[uid]["devices"]
    assert device["device"] == "gpu-1-quarter-2"
    assert device["cdiDeviceIDs"][0].startswith(f"{DEFAULT_DRIVER_NAME}/claim=claim-{uid}")
    assert "shareID" not in device
    assert (node.cdi_root / f"{DEFAULT_DRIVER_NAME}-claim_{uid}.json").exists()
    assert found.unprepare([record]) == {uid: ""}
    assert not (node.cdi_root / f"{DEFAULT_DRIVER_NAME}-claim_{uid}.json").exists()

    registry.scan()  # nothing changed: no new registration
    assert changes == [1]
    os.unlink(server.paths.registration)
    registry.scan()
    assert registry.plugin(DEFAULT_DRIVER_NAME) is None
    assert DEFAULT_DRIVER_NAME in registry.last_gone
    registry.close()


def test_registry_speaks_v1beta1_when_told(plugin: tuple[Node, PluginServer]) -> None:
    node, _ = plugin
    registry = ks.PluginRegistry(node.registry_dir, versions=("v1beta1.DRAPlugin",))
    registry.scan()
    found = registry.plugin(DEFAULT_DRIVER_NAME)
    assert found is not None and found.version == "v1beta1.DRAPlugin"
    claim = cf.claim([cf.result("gpu-0-eighth-0", NODE)], namespace="ns", name="c2")
    node.claims.claims[("ns", "c2")] = claim
    uid = claim["metadata"]["uid"]
    reply = found.prepare([ks.ClaimRecord("ns", "c2", uid, [DEFAULT_DRIVER_NAME])])
    assert reply[uid]["devices"][0]["device"] == "gpu-0-eighth-0"
    registry.close()


class FakeRegistration(registration_pb2_grpc.RegistrationServicer):
    def __init__(self, versions: list[str], kind: str = "DRAPlugin") -> None:
        self.versions = versions
        self.kind = kind
        self.status: list[registration_pb2.RegistrationStatus] = []
        self.notified = threading.Event()

    def GetInfo(self, request: object, context: object) -> registration_pb2.PluginInfo:  # noqa: N802
        return registration_pb2.PluginInfo(
            type=self.kind,
            name="fake.example.com",
            endpoint="/nowhere",
            supported_versions=self.versions,
        )

    def NotifyRegistrationStatus(  # noqa: N802
        self, request: registration_pb2.RegistrationStatus, context: object
    ) -> registration_pb2.RegistrationStatusResponse:
        self.status.append(request)
        self.notified.set()
        return registration_pb2.RegistrationStatusResponse()


@pytest.mark.parametrize(
    ("versions", "kind", "error"),
    [
        (["v2.DRAPlugin", "v1.DRAResourceHealth"], "DRAPlugin", "none of the plugin's versions"),
        (["v1.DRAPlugin"], "CSIPlugin", "is not DRAPlugin"),
    ],
)
def test_registry_rejects_what_it_cannot_use(versions: list[str], kind: str, error: str) -> None:
    registry_dir = Path(tempfile.mkdtemp(prefix="ks-"))  # short: unix socket path limit
    fake = FakeRegistration(versions, kind)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    registration_pb2_grpc.add_RegistrationServicer_to_server(fake, server)
    sock = registry_dir / "fake.example.com-reg.sock"
    hidden = registry_dir / ".hidden-reg.sock"
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    hidden.write_text("")  # ignored: not even dialed
    try:
        registry = ks.PluginRegistry(registry_dir)
        registry.scan()
        assert fake.notified.wait(5)
        [status] = fake.status
        assert not status.plugin_registered
        assert error in status.error
        assert registry.plugin("fake.example.com") is None
        assert error in registry.rejected[str(sock)]
        registry.scan()  # the same socket is not retried until it is re-created
        assert len(fake.status) == 1
    finally:
        server.stop(0)
        shutil.rmtree(registry_dir, ignore_errors=True)
