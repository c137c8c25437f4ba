"""The plugin over real unix sockets, driven exactly as the kubelet drives it."""

from __future__ import annotations

import json
import time
from fractions import Fraction
from pathlib import Path

import grpc
import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver._proto import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    registration_pb2,
)
from dra_driver.gpus import MIB
from dra_driver.kubelet.server import PluginServer, SocketPaths
from dra_driver.model.devices import product_memory_bytes
from tests.support import claimfactory as cf
from tests.support.cdischema import validator
from tests.support.kubelet import Kubelet, kubelet_connect
from tests.support.node import NODE, Node

Served = tuple[Node, PluginServer, Kubelet]


def ref(pb: object, claim: dict) -> object:
    m = claim["metadata"]
    return pb.Claim(namespace=m["namespace"], name=m["name"], uid=m["uid"])  # type: ignore[attr-defined]


def prepare(kubelet: Kubelet, *claims: dict, version: str = "v1") -> dict:
    pb = dra_v1_pb2 if version == "v1" else dra_v1beta1_pb2
    stub = kubelet.v1 if version == "v1" else kubelet.v1beta1
    reply = stub.NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[ref(pb, c) for c in claims]), timeout=45
    )
    return dict(reply.claims)


def unprepare(kubelet: Kubelet, *claims: dict) -> dict:
    reply = kubelet.v1.NodeUnprepareResources(
        dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[ref(dra_v1_pb2, c) for c in claims]),
        timeout=45,
    )
    return {uid: r.error for uid, r in reply.claims.items()}


def spec_file(node: Node, claim: dict) -> Path:
    return node.cdi_root / f"{DEFAULT_DRIVER_NAME}-claim_{claim['metadata']['uid']}.json"


def test_registration_info(served: Served) -> None:
    node, server, kubelet = served
    assert kubelet.info.type == "DRAPlugin"
    assert kubelet.info.name == DEFAULT_DRIVER_NAME
    assert kubelet.info.endpoint == str(node.plugin_dir / DEFAULT_DRIVER_NAME / "dra.sock")
    assert list(kubelet.info.supported_versions)[0] == "v1.DRAPlugin"
    assert "v1beta1.DRAPlugin" in kubelet.info.supported_versions
    assert server.registration.registered.is_set()


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_prepare_and_unprepare_a_quarter(served: Served, version: str) -> None:
    node, _, kubelet = served
    share = node.share(0, "quarter")
    device, share_id = share["device"], share["shareID"]
    claim = cf.claim([share])
    node.claims.add(claim)
    uid = claim["metadata"]["uid"]

    reply = prepare(kubelet, claim, version=version)[uid]
    assert reply.error == ""
    [dev] = reply.devices
    assert (dev.pool_name, dev.device_name, list(dev.request_names)) == (NODE, device, ["gpu"])
    assert list(dev.cdi_device_ids) == [
        f"{DEFAULT_DRIVER_NAME}/claim=claim-{uid}-{device}-{share_id}"
    ]

    spec = json.loads(spec_file(node, claim).read_text())
    assert not list(validator().iter_errors(spec))
    edits = spec["devices"][0]["containerEdits"]
    gpu = node.devices[device].gpu
    assert [n["path"] for n in edits["deviceNodes"]][0] == gpu.device_node
    quarter = product_memory_bytes(gpu, Fraction(1, 4))
    assert f"NVIDIA_GPU_MEMORY_LIMIT={quarter // MIB}" in edits["env"]
    plan = node.enforcer.applied[uid]
    assert plan.devices[0].memory_request_bytes == quarter
    assert plan.devices[0].memory_limit_bytes == quarter
    assert plan.devices[0].compute_mode == "time-slicing"

    assert unprepare(kubelet, claim) == {uid: ""}
    assert not spec_file(node, claim).exists()
    assert uid not in node.enforcer.applied
    assert json.loads((node.state_dir / "checkpoint.json").read_text())["claims"] == {}


def test_repeated_prepare_is_idempotent_and_cheap(served: Served) -> None:
    node, _, kubelet = served
    claim = cf.claim([node.share(1, "half")])
    node.claims.add(claim)
    uid = claim["metadata"]["uid"]
    first = prepare(kubelet, claim)[uid]
    gets = node.claims.requests
    applies = len(node.enforcer.calls)
    second = prepare(kubelet, claim)[uid]
    assert first == second
    assert node.claims.requests == gets
    assert len(node.enforcer.calls) == applies
    assert unprepare(kubelet, claim) == {uid: ""}
    assert unprepare(kubelet, claim) == {uid: ""}


def test_limit_from_claim_config_and_share_of_card(served: Served) -> None:
    node, _, kubelet = served
    share = node.share(0, "half")
    device = share["device"]
    claim = cf.claim(
        [share],
        [
            # the class lets its claims burst up to the card; the claim's portion wins
            cf.opaque("FromClass", memoryLimit="100Gi", maxMemoryLimitPortion="1"),
            cf.opaque(memoryLimitPortion="0.8"),
        ],
    )
    node.claims.add(claim)
    uid = claim["metadata"]["uid"]
    assert prepare(kubelet, claim)[uid].error == ""
    plan = node.enforcer.applied[uid].devices[0]
    card = node.devices[device].gpu.memory_bytes
    assert (
        plan.memory_limit_bytes == int(card * 0.8)
        or abs(plan.memory_limit_bytes - card * 4 // 5) <= 1
    )
    assert plan.memory_request_bytes == product_memory_bytes(
        node.devices[device].gpu, Fraction(1, 2)
    )


def test_each_bad_claim_fails_alone(served: Served) -> None:
    node, _, kubelet = served
    good = cf.claim([node.share(0, "eighth")])

    def quarter(pool: str = NODE) -> dict:
        return dict(node.share(1, "quarter"), pool=pool)

    bad = {
        "not found": cf.claim([quarter()]),
        "UID": cf.claim([quarter()]),
        "no allocation results for driver": cf.claim([dict(quarter(), driver="other.example.com")]),
        "not a Kubernetes quantity": cf.claim([quarter()], [cf.opaque(memoryLimit="big")]),
        "below the request": cf.claim([quarter()], [cf.opaque(memoryLimit="1Gi")]),
        "exceeds the card": cf.claim([quarter()], [cf.opaque(memoryLimit="1Ti")]),
        "compute mode time-slicing": cf.claim([quarter()], [cf.opaque(computeMode="sm-sharing")]),
        "not on this node": cf.claim([quarter("node-b")]),
        "not on this node any more": cf.claim([dict(quarter(), device="gpu-7-time-slicing")]),
        "has no shareID": cf.claim([cf.result(node.device(1, "quarter"), NODE)]),
        "outside (0, 1]": cf.claim([quarter()], [cf.opaque(memoryLimitPortion="1.5")]),
        "only valid with computeMode sm-sharing": cf.claim(
            [quarter()],
            [cf.opaque(computeMode="time-slicing", activeThreadPercentage=20)],
        ),
    }
    for message, claim in bad.items():
        if message != "not found":
            node.claims.add(claim)
    uid_mismatch = dict(
        bad["UID"],
        metadata=dict(bad["UID"]["metadata"], uid="00000000-0000-4000-8000-000000000000"),
    )
    node.claims.add(uid_mismatch)
    node.claims.add(good)
    replies = prepare(kubelet, good, *bad.values())
    assert replies[good["metadata"]["uid"]].error == ""
    for message, claim in bad.items():
        reply = replies[claim["metadata"]["uid"]]
        assert message in reply.error, (message, reply.error)
        assert not reply.devices
        assert not spec_file(node, claim).exists()
        assert claim["metadata"]["uid"] not in node.enforcer.applied
    assert [p.name for p in node.cdi_root.iterdir()] == [spec_file(node, good).name]


def test_malformed_uid_is_refused_before_any_file(served: Served) -> None:
    _, _, kubelet = served
    reply = kubelet.v1.NodePrepareResources(
        dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace="default", name="x", uid="../../etc/passwd")]
        )
    )
    assert "not a Kubernetes UID" in reply.claims["../../etc/passwd"].error


def test_enforcer_failure_leaves_nothing(served: Served) -> None:
    node, _, kubelet = served
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    node.enforcer.fail_for.add(claim["metadata"]["uid"])
    reply = prepare(kubelet, claim)[claim["metadata"]["uid"]]
    assert "simulated MPS failure" in reply.error
    assert not spec_file(node, claim).exists()


def test_restart_between_prepare_and_unprepare(node: Node) -> None:
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    uid = claim["metadata"]["uid"]
    from dra_driver.model.plans import ClaimRef

    r = ClaimRef("default", claim["metadata"]["name"], uid)
    first = node.preparation()
    assert first.prepare([r])[uid].error == ""
    first.close()
    node.enforcer.applied.clear()  # a new process starts with empty MPS bookkeeping
    second = node.preparation()
    assert uid in node.enforcer.applied  # restored from the checkpoint
    assert second.prepare([r])[uid].devices  # idempotent: served from the checkpoint
    assert second.unprepare([r]) == {uid: ""}
    assert not spec_file(node, claim).exists()
    second.close()


def test_new_boot_discards_checkpoint_and_sweeps_cdi(node: Node) -> None:
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    uid = claim["metadata"]["uid"]
    from dra_driver.model.plans import ClaimRef

    d = node.preparation("boot-1")
    d.prepare([ClaimRef("default", claim["metadata"]["name"], uid)])
    d.close()
    assert spec_file(node, claim).exists()
    d2 = node.preparation("boot-2")
    assert not spec_file(node, claim).exists()
    assert d2.checkpoint.claims == {}
    d2.close()


def test_corrupt_checkpoint_is_kept_aside_and_specs_kept(node: Node) -> None:
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    uid = claim["metadata"]["uid"]
    from dra_driver.model.plans import ClaimRef

    d = node.preparation()
    d.prepare([ClaimRef("default", claim["metadata"]["name"], uid)])
    d.close()
    (node.state_dir / "checkpoint.json").write_text("{garbage")
    d2 = node.preparation()
    kept = list(node.state_dir.glob("checkpoint.json.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_text() == "{garbage"
    assert spec_file(node, claim).exists()  # running containers keep their spec
    assert d2.unprepare([ClaimRef("default", claim["metadata"]["name"], uid)]) == {uid: ""}
    assert not spec_file(node, claim).exists()
    d2.close()


@pytest.mark.parametrize(
    "pb,grpc_mod",
    [(health_v1_pb2, health_v1_pb2_grpc), (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc)],
)
def test_health_stream_lists_every_device(served: Served, pb: object, grpc_mod: object) -> None:
    node, _, kubelet = served
    stub = grpc_mod.DRAResourceHealthStub(kubelet.channel)  # type: ignore[attr-defined]
    stream = stub.NodeWatchResources(pb.NodeWatchResourcesRequest(), timeout=5)  # type: ignore[attr-defined]
    first = next(stream)
    second = next(stream)
    names = sorted(d.device.device_name for d in first.devices)
    assert names == sorted(node.devices)
    assert all(d.health == pb.HEALTHY and d.device.pool_name == NODE for d in second.devices)  # type: ignore[attr-defined]
    stream.cancel()


def test_lost_gpu_and_failed_enforcement_are_reported_unhealthy(served: Served) -> None:
    node, _, kubelet = served
    stub = health_v1_pb2_grpc.DRAResourceHealthStub(kubelet.channel)
    lost = {n for n, d in node.devices.items() if d.gpu.index == 1}
    gpu0 = next(d.gpu for d in node.devices.values() if d.gpu.index == 0)
    node.devices = {n: d for n, d in node.devices.items() if n not in lost}
    node.unhealthy_gpus[gpu0.uuid] = "MPS server gpu_0 vanished"
    stream = stub.NodeWatchResources(health_v1_pb2.NodeWatchResourcesRequest(), timeout=5)
    reply = next(stream)
    stream.cancel()
    by_name = {d.device.device_name: d for d in reply.devices}
    assert set(by_name) == set(node.seen)
    for name in lost:
        assert by_name[name].health == health_v1_pb2.UNHEALTHY
        assert "no longer in the node's GPU inventory" in by_name[name].message
    for name in node.devices:
        assert by_name[name].health == health_v1_pb2.UNHEALTHY
        assert "MPS server gpu_0 vanished" in by_name[name].message


def test_rejected_registration_is_retried(served: Served) -> None:
    node, server, kubelet = served
    kubelet.registration.NotifyRegistrationStatus(
        registration_pb2.RegistrationStatus(plugin_registered=False, error="version mismatch")
    )
    assert not server.registration.registered.is_set()
    assert server.registration.last_error == "version mismatch"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            channel = grpc.insecure_channel(f"unix://{server.paths.registration}")
            from dra_driver._proto import registration_pb2_grpc

            info = registration_pb2_grpc.RegistrationStub(channel).GetInfo(
                registration_pb2.InfoRequest(), timeout=1
            )
            if info.name:
                break
        except grpc.RpcError:
            time.sleep(0.2)
    registration_pb2_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
        registration_pb2.RegistrationStatus(plugin_registered=True)
    )
    assert server.registration.registered.is_set()


def test_capacity_shares_with_share_ids_and_sm_sharing(mixed_node: Node) -> None:
    node = mixed_node
    paths = SocketPaths.for_driver(
        DEFAULT_DRIVER_NAME, str(node.plugin_dir), str(node.registry_dir)
    )
    preparation = node.preparation()
    server = PluginServer(preparation, paths, node.health)
    server.start()
    kubelet = kubelet_connect(paths)
    try:
        device = node.device(1, None)
        share_a, share_b = (
            "3f1c2b9a-0d4e-4c7b-9a51-5e2f8d6c7b10",
            "7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0d",
        )
        claim = cf.claim(
            [
                cf.result(device, NODE, request="a", share_id=share_a, memory="12Gi"),
                cf.result(device, NODE, request="b", share_id=share_b, memory="4Gi"),
            ],
            [
                cf.opaque("FromClass", maxMemoryLimit="40Gi"),
                cf.opaque(requests=["a"], memoryLimit="20Gi", activeThreadPercentage=30),
            ],
        )
        node.claims.add(claim)
        uid = claim["metadata"]["uid"]
        reply = prepare(kubelet, claim)[uid]
        assert reply.error == ""
        assert sorted((d.share_id, list(d.request_names)) for d in reply.devices) == sorted(
            [(share_a, ["a"]), (share_b, ["b"])]
        )
        assert {d.cdi_device_ids[0] for d in reply.devices} == {
            f"{DEFAULT_DRIVER_NAME}/claim=claim-{uid}-{device}-{share_a}",
            f"{DEFAULT_DRIVER_NAME}/claim=claim-{uid}-{device}-{share_b}",
        }
        plans = {d.share_id: d for d in node.enforcer.applied[uid].devices}
        assert plans[share_a].memory_request_bytes == 12 * 1024**3
        assert plans[share_a].memory_limit_bytes == 20 * 1024**3
        assert plans[share_a].active_thread_percentage == 30
        assert plans[share_a].compute_mode == "sm-sharing"
        assert plans[share_b].memory_limit_bytes == 4 * 1024**3
        assert plans[share_b].active_thread_percentage is None
        spec = json.loads(spec_file(node, claim).read_text())
        assert not list(validator().iter_errors(spec))
        assert len(spec["devices"]) == 2

        beta = prepare(kubelet, claim, version="v1beta1")[uid]  # idempotent, no share_id field
        assert sorted(d.device_name for d in beta.devices) == [device, device]
        assert unprepare(kubelet, claim) == {uid: ""}
        assert not spec_file(node, claim).exists()
    finally:
        kubelet.channel.close()
        server.stop(grace=0)
        preparation.close()


def test_time_slicing_claim_on_sm_sharing_gpu_is_refused(mixed_node: Node) -> None:
    node = mixed_node
    preparation = node.preparation()
    claim = cf.claim(
        [
            cf.result(
                node.device(1, None),
                NODE,
                share_id="3f1c2b9a-0d4e-4c7b-9a51-5e2f8d6c7b10",
                memory="8Gi",
            )
        ],
        [cf.opaque(computeMode="time-slicing")],
    )
    node.claims.add(claim)
    from dra_driver.model.plans import ClaimRef

    m = claim["metadata"]
    out = preparation.prepare([ClaimRef(m["namespace"], m["name"], m["uid"])])[m["uid"]]
    assert "runs compute mode sm-sharing; the claim asks for time-slicing" in out.error
    assert not spec_file(node, claim).exists()
    preparation.close()
