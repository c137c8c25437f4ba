"""Hostile claims and requests over the real unix socket, each batched with a good claim.

Every case: the good claim is prepared, the hostile one gets an error that names the problem,
and nothing is left on disk for it (no CDI spec, no checkpoint record, no MPS pipe directory).
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver._proto import dra_v1_pb2
from dra_driver.config.load import parse_node_config
from dra_driver.config.params import PARAMS_API_VERSION, PARAMS_KIND
from dra_driver.enforce import RecordingEnforcer
from dra_driver.enforce.rules.targets import MpsOptions
from tests.support import claimfactory as cf
from tests.support.kubelet import Kubelet, serving
from tests.support.node import MIXED_CONFIG, NODE, Node, make_node

MIB_TEXT = "9" * 2**20
"""A 1 MiB value."""
SHARE = "3f1c2b9a-0d4e-4c7b-9a51-5e2f8d6c7b10"
GOOD_DEVICE = "gpu-0-time-slicing"
GOOD_SHARE = "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a"
PRODUCT = "gpu-0-time-slicing"
CAPACITY = "gpu-1-sm-sharing"


@dataclass(frozen=True)
class Sent:
    """What the kubelet sends for one hostile claim and what the API stand-in serves."""

    namespace: str
    name: str
    uid: str
    body: Any = None
    served: bool = True
    also_named: str = ""
    """Send the UID a second time under this name (a duplicated claim)."""


def product_claim(**params: Any) -> dict[str, Any]:
    configs = [cf.opaque(**params)] if params else []
    share = str(uuid.uuid4())
    return cf.claim([cf.result(PRODUCT, NODE, share_id=share, slots="2")], configs)


def share_claim(**params: Any) -> dict[str, Any]:
    configs = [cf.opaque(**params)] if params else []
    return cf.claim([cf.result(CAPACITY, NODE, share_id=SHARE, memory="8Gi")], configs)


def edited(edit: Callable[[dict[str, Any]], None], base: dict[str, Any] | None = None) -> Sent:
    """A product claim (or ``base``) changed by ``edit``, served under its own identity."""
    claim = copy.deepcopy(base or product_claim())
    meta = claim["metadata"]
    identity = (meta["namespace"], meta["name"], meta["uid"])
    edit(claim)
    return Sent(*identity, body=claim)


def body(value: Any) -> Sent:
    """A claim whose whole body is ``value``."""
    uid = str(uuid.uuid4())
    return Sent("default", f"claim-{uid[:8]}", uid, body=value)


def request_only(namespace: str = "default", name: str = "x", uid: str | None = None) -> Sent:
    """A claim the API server does not have (request-level hostility)."""
    return Sent(namespace, name, uid if uid is not None else str(uuid.uuid4()), served=False)


def alloc(claim: dict[str, Any]) -> dict[str, Any]:
    devices: dict[str, Any] = claim["status"]["allocation"]["devices"]
    return devices


def result0(claim: dict[str, Any]) -> dict[str, Any]:
    first: dict[str, Any] = alloc(claim)["results"][0]
    return first


def set_in(path: tuple[str | int, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(claim: dict[str, Any]) -> None:
        target: Any = claim
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def drop(path: tuple[str | int, ...]) -> Callable[[dict[str, Any]], None]:
    def edit(claim: dict[str, Any]) -> None:
        target: Any = claim
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return edit


R0 = ("status", "allocation", "devices", "results", 0)
C0 = ("status", "allocation", "devices", "config", 0)
RP = "status.allocation.devices.results[0]"
CP = "status.allocation.devices.config[0]"


def with_config(config: Any) -> Sent:
    claim = product_claim()
    alloc(claim)["config"] = [config]
    return edited(lambda c: None, claim)


def with_parameters(parameters: Any) -> Sent:
    return with_config(
        {"source": "FromClaim", "opaque": {"driver": cf.DRIVER, "parameters": parameters}}
    )


def params(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": PARAMS_API_VERSION, "kind": PARAMS_KIND, **fields}


def share_with(share_id: Any, device: str = CAPACITY) -> Sent:
    claim = share_claim()
    result0(claim)["shareID"] = share_id
    result0(claim)["device"] = device
    return edited(lambda c: None, claim)


def capacity_with(memory: Any) -> Sent:
    claim = share_claim()
    result0(claim)["consumedCapacity"] = {"memory": memory}
    return edited(lambda c: None, claim)


def many_results() -> Sent:
    claim = product_claim()
    alloc(claim)["results"] = [cf.result(f"gpu-9-x-{i}", NODE) for i in range(10_000)]
    return edited(lambda c: None, claim)


CASES: dict[str, tuple[Callable[[], Sent], str]] = {
    # the whole body of the wrong JSON type
    "body null": (lambda: body(None), "ResourceClaim: expected an object, got null"),
    "body list": (lambda: body([]), "ResourceClaim: expected an object, got a list"),
    "body string": (lambda: body("claim"), "ResourceClaim: expected an object, got a string"),
    "body number": (lambda: body(7), "ResourceClaim: expected an object, got a number"),
    # wrong types at every level
    "metadata string": (
        lambda: edited(set_in(("metadata",), "m")),
        "metadata: expected an object, got a string",
    ),
    "metadata missing": (lambda: edited(drop(("metadata",))), "metadata.uid: missing"),
    "uid number": (
        lambda: edited(set_in(("metadata", "uid"), 5)),
        "metadata.uid: expected a string, got a number",
    ),
    "uid of another claim": (
        lambda: edited(set_in(("metadata", "uid"), str(uuid.uuid4()))),
        "deleted and recreated",
    ),
    "status list": (
        lambda: edited(set_in(("status",), [])),
        "status: expected an object, got a list",
    ),
    "status missing": (lambda: edited(drop(("status",))), "is not allocated"),
    "allocation string": (
        lambda: edited(set_in(("status", "allocation"), "yes")),
        "status.allocation: expected an object, got a string",
    ),
    "allocation devices list": (
        lambda: edited(set_in(("status", "allocation", "devices"), [])),
        "status.allocation.devices: expected an object, got a list",
    ),
    "results object": (
        lambda: edited(set_in(("status", "allocation", "devices", "results"), {})),
        "status.allocation.devices.results: expected a list, got an object",
    ),
    "results empty": (
        lambda: edited(set_in(("status", "allocation", "devices", "results"), [])),
        "no allocation results for driver",
    ),
    "result string": (lambda: edited(set_in(R0, "gpu")), f"{RP}: expected an object, got a string"),
    "result request missing": (lambda: edited(drop((*R0, "request"))), f"{RP}.request: missing"),
    "result request number": (
        lambda: edited(set_in((*R0, "request"), 1)),
        f"{RP}.request: expected a string, got a number",
    ),
    "result driver list": (
        lambda: edited(set_in((*R0, "driver"), [])),
        f"{RP}.driver: expected a string, got a list",
    ),
    "result pool null": (
        lambda: edited(set_in((*R0, "pool"), None)),
        f"{RP}.pool: expected a string, got null",
    ),
    "result device boolean": (
        lambda: edited(set_in((*R0, "device"), True)),
        f"{RP}.device: expected a string, got a boolean",
    ),
    "consumedCapacity list": (
        lambda: edited(set_in((*R0, "consumedCapacity"), []), share_claim()),
        f"{RP}.consumedCapacity: expected an object, got a list",
    ),
    "consumedCapacity memory object": (
        lambda: capacity_with({}),
        f"{RP}.consumedCapacity.memory: expected a string, got an object",
    ),
    "config object": (
        lambda: edited(set_in(("status", "allocation", "devices", "config"), {})),
        "status.allocation.devices.config: expected a list, got an object",
    ),
    "config entry string": (lambda: with_config("cfg"), f"{CP}: expected an object, got a string"),
    "config opaque number": (
        lambda: with_config({"source": "FromClaim", "opaque": 7}),
        f"{CP}.opaque: expected an object, got a number",
    ),
    "config requests string": (
        lambda: with_config({"source": "FromClaim", "requests": "gpu", "opaque": {}}),
        f"{CP}.requests: expected a list, got a string",
    ),
    "config requests of numbers": (
        lambda: with_config({"source": "FromClaim", "requests": [1], "opaque": {}}),
        f"{CP}.requests[0]: expected a string, got a number",
    ),
    "config source number": (
        lambda: with_config({"source": 1, "opaque": {}}),
        f"{CP}.source: expected a string, got a number",
    ),
    "config source unknown": (
        lambda: with_config({"source": "FromNowhere", "opaque": {}}),
        "must be FromClass or FromClaim",
    ),
    "config driver number": (
        lambda: with_config({"source": "FromClaim", "opaque": {"driver": 3}}),
        f"{CP}.opaque.driver: expected a string, got a number",
    ),
    # malformed opaque parameters
    "parameters list": (lambda: with_parameters([]), "expected an object, got a list"),
    "parameters missing": (
        lambda: with_config({"source": "FromClaim", "opaque": {"driver": cf.DRIVER}}),
        "expected an object, got null",
    ),
    "parameters wrong kind": (
        lambda: with_parameters({"apiVersion": "v1", "kind": "Pod"}),
        "apiVersion/kind must be",
    ),
    "parameters unknown field": (lambda: with_parameters(params(gpus=2)), "unknown field(s) gpus"),
    "memoryLimit garbage": (
        lambda: with_parameters(params(memoryLimit="big")),
        "not a Kubernetes quantity",
    ),
    "memoryLimit zero": (
        lambda: with_parameters(params(memoryLimit="0")),
        "must be greater than zero",
    ),
    "memoryLimit negative": (
        lambda: with_parameters(params(memoryLimit="-5Gi")),
        "must be greater than zero",
    ),
    "memoryLimit overflow": (
        lambda: with_parameters(params(memoryLimit="1e5000")),
        "larger than any GPU",
    ),
    "memoryLimit boolean": (
        lambda: with_parameters(params(memoryLimit=True)),
        "must be a Kubernetes quantity",
    ),
    "memoryLimit fractional bytes": (
        lambda: with_parameters(params(memoryLimit="1.5")),
        "whole number of bytes",
    ),
    "memoryLimit 1 MiB": (
        lambda: with_parameters(params(memoryLimit=MIB_TEXT)),
        "(1048576 characters)",
    ),
    "memoryLimit below request": (
        lambda: with_parameters(params(memoryLimit="1Gi")),
        "below the request",
    ),
    "memoryLimit above card": (
        lambda: with_parameters(params(memoryLimit="1Ti")),
        "exceeds the card",
    ),
    "portion zero": (lambda: with_parameters(params(memoryLimitPortion="0")), "outside (0, 1]"),
    "portion NaN": (
        lambda: with_parameters(params(memoryLimitPortion="NaN")),
        "must be a number in (0, 1]",
    ),
    "portion infinite": (
        lambda: with_parameters(params(memoryLimitPortion=1e400)),
        "outside (0, 1]",
    ),
    "both limits": (
        lambda: with_parameters(params(memoryLimit="40Gi", memoryLimitPortion="0.5")),
        "not both",
    ),
    "computeMode unknown": (lambda: with_parameters(params(computeMode="turbo")), "must be one of"),
    "computeMode of another GPU": (
        lambda: with_parameters(params(computeMode="sm-sharing")),
        "runs compute mode time-slicing",
    ),
    "threads zero": (lambda: with_parameters(params(activeThreadPercentage=0)), "must be 1..100"),
    "threads 101": (lambda: with_parameters(params(activeThreadPercentage=101)), "must be 1..100"),
    "threads string": (
        lambda: with_parameters(params(activeThreadPercentage="50")),
        "must be 1..100",
    ),
    "threads huge float": (
        lambda: with_parameters(params(activeThreadPercentage=1e20)),
        "must be 1..100",
    ),
    "threads on time-slicing": (
        lambda: with_parameters(params(activeThreadPercentage=50)),
        "needs compute mode sm-sharing",
    ),
    # consumed capacity quantities
    "consumed garbage": (lambda: capacity_with("lots"), "is not a Kubernetes quantity"),
    "consumed zero": (lambda: capacity_with("0"), "must be greater than zero"),
    "consumed negative": (lambda: capacity_with("-1Gi"), "must be greater than zero"),
    "consumed overflow": (lambda: capacity_with("1e30"), "larger than any GPU"),
    "consumed fractional": (lambda: capacity_with("0.5"), "whole number of bytes"),
    # unknown drivers, pools, devices; unicode and control characters; huge values
    "other driver only": (
        lambda: edited(set_in((*R0, "driver"), "other.example.com")),
        "no allocation results for driver",
    ),
    "other pool": (lambda: edited(set_in((*R0, "pool"), "node-b")), "is not on this node (pool"),
    "unknown device": (
        lambda: edited(set_in((*R0, "device"), "gpu-7-quarter-0")),
        "is not on this node any more",
    ),
    "device with NUL": (
        lambda: edited(set_in((*R0, "device"), "gpu-0-quarter-0\x00")),
        "'gpu-0-quarter-0\\x00' is not on this node any more",
    ),
    "device 1 MiB": (lambda: edited(set_in((*R0, "device"), MIB_TEXT)), "(1048576 characters)"),
    "pool 1 MiB": (lambda: edited(set_in((*R0, "pool"), MIB_TEXT)), "(1048576 characters)"),
    "request lone surrogate": (
        lambda: edited(set_in((*R0, "request"), "gpu\ud800")),
        f"{RP}.request: 'gpu\\ud800' is not a request name",
    ),
    "request with newline": (
        lambda: edited(set_in((*R0, "request"), "gpu\n")),
        f"{RP}.request: 'gpu\\n' is not a request name",
    ),
    "ten thousand unknown devices": (many_results, "'gpu-9-x-0' is not on this node any more"),
    # shareIDs
    "shareID number": (lambda: share_with(42), f"{RP}.shareID: expected a string, got a number"),
    "shareID trailing newline": (lambda: share_with(SHARE + "\n"), "is not a DNS label"),
    "shareID empty": (lambda: share_with(""), "is not a DNS label"),
    "shareID upper case": (lambda: share_with(SHARE.upper()), "is not a DNS label"),
    "shareID too long": (lambda: share_with("a" * 64), "is not a DNS label"),
    "no shareID on a shared device": (
        lambda: edited(lambda c: result0(c).pop("shareID")),
        "has no shareID",
    ),
    "share of the good claim": (
        lambda: edited(set_in((*R0, "shareID"), GOOD_SHARE)),
        "is already prepared for claim",
    ),
    # request-level hostility: identities the kubelet would never send
    "uid path": (lambda: request_only(uid="../../etc/passwd"), "is not a Kubernetes UID"),
    "uid upper case": (
        lambda: request_only(uid=str(uuid.uuid4()).upper()),
        "is not a Kubernetes UID",
    ),
    "uid trailing newline": (
        lambda: request_only(uid=str(uuid.uuid4()) + "\n"),
        "is not a Kubernetes UID",
    ),
    "uid empty": (lambda: request_only(uid=""), "is not a Kubernetes UID"),
    "uid 100 KiB": (lambda: request_only(uid="u" * 102_400), "(102400 characters)"),
    "uid unicode": (lambda: request_only(uid="ünïcødé"), "is not a Kubernetes UID"),
    "namespace empty": (lambda: request_only(namespace=""), "namespace '' is not a DNS label"),
    "namespace with slash": (
        lambda: request_only(namespace="a/b"),
        "namespace 'a/b' is not a DNS label",
    ),
    "name with slash": (lambda: request_only(name="../x"), "name '../x' is not a DNS subdomain"),
    "name 64 KiB": (lambda: request_only(name="n" * 65_536), "(65536 characters)"),
    "name with control character": (
        lambda: request_only(name="x\x1b[2J"),
        "name 'x\\x1b[2J' is not a DNS subdomain",
    ),
    "claim not found": (lambda: request_only(), "not found"),
    "one UID under two names": (
        lambda: replace(edited(lambda c: None), also_named="other"),
        "is listed with two names",
    ),
}


def claims_of(sent: Sent) -> list[dra_v1_pb2.Claim]:
    names = [sent.name, sent.also_named] if sent.also_named else [sent.name]
    return [dra_v1_pb2.Claim(namespace=sent.namespace, name=n, uid=sent.uid) for n in names]


def send(kubelet: Kubelet, *sent: Sent) -> dict[str, Any]:
    request = dra_v1_pb2.NodePrepareResourcesRequest(claims=[c for s in sent for c in claims_of(s)])
    return dict(kubelet.v1.NodePrepareResources(request, timeout=45).claims)


def serve(node: Node, *sent: Sent) -> None:
    for s in sent:
        if s.served:
            node.claims.add_body(s.namespace, s.name, s.body)


def good_claim(node: Node) -> Sent:
    claim = cf.claim([cf.result(GOOD_DEVICE, NODE, share_id=GOOD_SHARE, slots="2")])
    node.claims.add(claim)
    m = claim["metadata"]
    return Sent(m["namespace"], m["name"], m["uid"], body=claim)


def pipe_dirs(node: Node) -> set[str]:
    return {p.name for p in (node.root / "mps").rglob("c_*") if p.is_dir()}


def namespace_dir(uid: str) -> str:
    return "c_" + uid.replace("-", "_")


def assert_only(node: Node, *good: Sent) -> None:
    """Nothing on disk but the good claims' CDI specs, records and pipe directories."""
    uids = {g.uid for g in good}
    specs = {p.name for p in node.cdi_root.iterdir()} if node.cdi_root.exists() else set()
    assert specs == {f"{DEFAULT_DRIVER_NAME}-claim_{u}.json" for u in uids}
    records = json.loads((node.state_dir / "checkpoint.json").read_text())["claims"]
    assert set(records) == uids
    assert pipe_dirs(node) == {namespace_dir(u) for u in uids}
    assert set(node.enforcer.applied) == uids


@pytest.fixture(scope="module")
def served_mixed() -> Iterator[tuple[Node, Kubelet]]:
    """The mixed node (GPU 0 products, GPU 1 capacity) served once for the module, its
    enforcer making pipe directories."""
    for node in make_node(parse_node_config(MIXED_CONFIG)):
        node.enforcer = RecordingEnforcer(
            make_dirs=True, options=MpsOptions(root=str(node.root / "mps"))
        )
        with serving(node) as (_, kubelet):
            yield node, kubelet


@pytest.fixture
def hostile(served_mixed: tuple[Node, Kubelet]) -> Iterator[tuple[Node, Kubelet]]:
    """The served node, left with no prepared claim by each test."""
    node, kubelet = served_mixed
    yield node, kubelet
    checkpoint = node.state_dir / "checkpoint.json"
    records = json.loads(checkpoint.read_text())["claims"] if checkpoint.exists() else {}
    prepared = [Sent(r["namespace"], r["name"], uid) for uid, r in records.items()]
    request = dra_v1_pb2.NodeUnprepareResourcesRequest(
        claims=[c for s in prepared for c in claims_of(s)]
    )
    kubelet.v1.NodeUnprepareResources(request, timeout=45)
    assert_only(node)


def test_there_are_at_least_sixty_distinct_hostile_cases() -> None:
    assert len(CASES) >= 60
    assert len({expect for _, expect in CASES.values()}) >= 45


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_claim_fails_alone(hostile: tuple[Node, Kubelet], case: str) -> None:
    node, kubelet = hostile
    build, expect = CASES[case]
    bad = build()
    serve(node, bad)
    good = good_claim(node)
    replies = send(kubelet, good, bad)
    assert replies[good.uid].error == ""
    assert [d.device_name for d in replies[good.uid].devices] == [GOOD_DEVICE]
    error = replies[bad.uid].error
    assert expect in error, error
    assert len(error) <= 1_000
    assert not replies[bad.uid].devices
    assert_only(node, good)


def test_all_hostile_claims_in_one_batch(hostile: tuple[Node, Kubelet]) -> None:
    node, kubelet = hostile
    sent = {case: build() for case, (build, _) in CASES.items()}
    serve(node, *sent.values())
    good = good_claim(node)
    replies = send(kubelet, good, *sent.values())
    assert replies[good.uid].error == ""
    for case, s in sent.items():
        expect = CASES[case][1]
        if case == "device of the good claim":
            expect = "is already prepared for claim"
        assert expect in replies[s.uid].error, (case, replies[s.uid].error)
    assert_only(node, good)


def test_numeric_share_id_fails_its_claim_alone_and_leaves_nothing(
    hostile: tuple[Node, Kubelet],
) -> None:
    node, kubelet = hostile
    bad = share_with(42)
    serve(node, bad)
    good = good_claim(node)
    for _ in range(2):  # the kubelet's retry gets the same answer, not a stale record
        replies = send(kubelet, good, bad)
        assert replies[good.uid].error == ""
        assert "shareID: expected a string, got a number" in replies[bad.uid].error
        assert_only(node, good)


def test_a_share_is_never_prepared_for_a_second_claim(
    hostile: tuple[Node, Kubelet],
) -> None:
    node, kubelet = hostile
    good = good_claim(node)
    assert send(kubelet, good)[good.uid].error == ""
    for share_id in (None, GOOD_SHARE):
        second = cf.claim([cf.result(GOOD_DEVICE, NODE, share_id=share_id, slots="2")])
        node.claims.add(second)
        [sent] = [Sent("default", second["metadata"]["name"], second["metadata"]["uid"])]
        error = send(kubelet, sent)[sent.uid].error
        assert error, share_id
        assert_only(node, good)


def test_many_claims_with_huge_values_get_a_reply_under_the_grpc_limit(
    hostile: tuple[Node, Kubelet],
) -> None:
    node, kubelet = hostile
    huge: list[Sent] = []
    for i in range(8):
        huge += [
            with_parameters(params(memoryLimit=MIB_TEXT + str(i))),
            edited(set_in((*R0, "device"), MIB_TEXT + str(i))),
            edited(set_in((*R0, "pool"), MIB_TEXT + str(i))),
            edited(set_in((*R0, "request"), MIB_TEXT + str(i))),
            share_with(MIB_TEXT + str(i)),
        ]
    serve(node, *huge)
    good = good_claim(node)
    request = dra_v1_pb2.NodePrepareResourcesRequest(
        claims=[
            dra_v1_pb2.Claim(namespace=s.namespace, name=s.name, uid=s.uid) for s in (good, *huge)
        ]
    )
    reply = kubelet.v1.NodePrepareResources(request, timeout=45)
    assert reply.ByteSize() < 4 * 2**20
    assert reply.claims[good.uid].error == ""
    assert [d.device_name for d in reply.claims[good.uid].devices] == [GOOD_DEVICE]
    for s in huge:
        assert "characters)" in reply.claims[s.uid].error
        assert len(reply.claims[s.uid].error) <= 1_000
    assert_only(node, good)


def test_thousands_of_long_uids_get_a_bounded_reply_with_the_good_claim(
    hostile: tuple[Node, Kubelet],
) -> None:
    node, kubelet = hostile
    good = good_claim(node)
    junk = [request_only(uid=f"{i:04d}" + "u" * 896) for i in range(4_000)]
    replies = send(kubelet, good, *junk)
    assert replies[good.uid].error == ""
    assert [d.device_name for d in replies[good.uid].devices] == [GOOD_DEVICE]
    answered = [s for s in junk if s.uid in replies]
    assert len(answered) > 3_000
    assert all("is not a Kubernetes UID" in replies[s.uid].error for s in answered)
    assert_only(node, good)
