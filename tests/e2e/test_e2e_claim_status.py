"""End to end, claim device status: after the real kubelet's Prepare, the chart-installed
plugin writes each claim's ``status.devices`` (what ``kubectl get resourceclaim -o yaml``
shows), and the real API server lets a plugin write only claims allocated on its own node
(granular status authorization, ``resourceclaims/driver`` with ``associated-node`` verbs)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    DRIVER,
    E2E,
    RELEASE_NAMESPACE,
    SM_SHARING_PRODUCT_GPUS,
    check_prepared,
    claim_spec,
    wait_for,
)

from dra_driver.observe.claimstatus import CONDITION_TYPE  # noqa: E402
from dra_driver.observe.claimstatuswriter import ApiClaimStatus  # noqa: E402
from dra_driver.prepare.claimwire import with_devices  # noqa: E402
from tests.support.k8sschema import validate  # noqa: E402

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

ON_GPU = 'device.attributes["gpu-fraction.dra.dev"].index == {}'


def our_entries(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in (claim.get("status") or {}).get("devices") or [] if e["driver"] == DRIVER]


def written(e2e: E2E, pod: str) -> dict[str, Any]:
    """The pod's claim once the plugin has written its device status."""
    return wait_for(
        f"the device status of {pod}'s claim",
        lambda: (lambda c: c if our_entries(c) else None)(e2e.claim_of(pod)),
        timeout=30,
    )


def slice_device(e2e: E2E, node: str, name: str) -> dict[str, Any]:
    return next(
        d for s in e2e.slices(node) for d in s["spec"].get("devices") or [] if d["name"] == name
    )


def start(
    e2e: E2E,
    name: str,
    device_class: str,
    gpu: int,
    node: int = 0,
    parameters: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A running pod's claim with its device status written. The pod runs as UID 1000: a
    root container on an MPS GPU gets its claim a second condition (NonRootClients) once the
    plugin's periodic check sees it, which made the one-condition check below depend on
    timing (it failed under load); the root case is tested in test_e2e_tenants."""
    e2e.template(name, device_class, selectors=[ON_GPU.format(gpu)], parameters=parameters)
    e2e.pod(name, e2e.nodes[node], templates={"gpu": name}, run_as_user=1000)
    e2e.wait_running(name)
    check_prepared(e2e, name)
    return written(e2e, name)


def test_prepared_claim_reports_gpu_memory_mode_and_enforcement(e2e: E2E) -> None:
    claim = start(e2e, "q", "gpu-quarter", gpu=1)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    (entry,) = our_entries(claim)
    assert (entry["pool"], entry["device"], entry.get("shareID")) == (
        result["pool"],
        result["device"],
        result.get("shareID"),
    )
    attrs = {
        k: next(iter(v.values()))
        for k, v in slice_device(e2e, result["pool"], result["device"])["attributes"].items()
    }
    data = entry["data"]
    assert data["gpu"] == {
        "uuid": attrs["uuid"],
        "index": 1,
        "productName": attrs["productName"],
    }
    assert data["computeMode"] == "time-slicing" and "activeThreadPercentage" not in data
    assert data["enforcement"] == attrs["memoryEnforcement"]
    quarter = attrs["gpuMemory"] // 4
    assert abs(data["memory"]["limitBytes"] - quarter) < 2**20 * 2
    assert data["memory"]["requestBytes"] <= data["memory"]["limitBytes"]
    (cond,) = entry["conditions"]
    assert cond["type"] == CONDITION_TYPE
    assert cond["status"] == ("True" if data["enforcement"] == "hard" else "False")
    assert data["memory"]["limit"] in cond["message"]
    validate(claim)


def test_sm_sharing_claim_reports_its_active_thread_percentage(e2e: E2E) -> None:
    """The claim's parameters are not in sorted key order (apiVersion, kind,
    activeThreadPercentage): a status write that re-encodes them is refused (make demo's
    inference claim once was)."""
    gpu = SM_SHARING_PRODUCT_GPUS[0]
    claim = start(
        e2e, "s", "gpu-quarter-sm-sharing", gpu=gpu, parameters={"activeThreadPercentage": 40}
    )
    (entry,) = our_entries(claim)
    assert entry["data"]["computeMode"] == "sm-sharing"
    assert entry["data"]["activeThreadPercentage"] == 40
    assert "at most 40% of the GPU's SMs" in entry["conditions"][0]["message"]


GO_ESCAPES = {ord(c): f"\\u{ord(c):04x}" for c in "&<>"}

ENCODINGS = {
    # kubectl and every Go client: compact, & < > escaped as \u0026...
    "go": lambda doc: json.dumps(doc, separators=(",", ":")).translate(GO_ESCAPES),
    # the official Python client: json.dumps' ", " and ": ", nothing escaped
    "python": json.dumps,
}


@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_another_drivers_parameters_survive_the_status_write(e2e: E2E, encoding: str) -> None:
    """A claim template as a Go client or the Python client writes it: another driver's opaque
    parameters with ``&``, ``<`` and ``>``. The API server keeps those bytes as sent (spaces
    and all), serves them compacted and escaped, and compares the status update's allocation
    with the bytes kept: the plugin's JSON writes were refused with 422 ('status.allocation:
    field cannot be modified once set'), first for the Go form, then, for every claim or
    class created by the Python client, for the Python form; protobuf writes keep them."""
    spec = claim_spec("gpu-eighth", None, None, [ON_GPU.format(1)], None, None)
    spec["devices"]["config"] = [
        {
            "requests": ["gpu"],
            "opaque": {"driver": "other.example.com", "parameters": {"cmd": "a && b <x>"}},
        }
    ]
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "o"},
        "spec": {"spec": spec},
    }
    config = e2e.api.configuration
    path = f"/apis/resource.k8s.io/v1/namespaces/{e2e.namespace}/resourceclaimtemplates"
    resp = e2e.api.rest_client.pool_manager.request(
        "POST",
        f"{config.host}{path}",
        body=ENCODINGS[encoding](body).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert resp.status == 201, resp.data
    e2e.pod("o", e2e.nodes[0], templates={"gpu": "o"})
    e2e.wait_running("o")
    claim = written(e2e, "o")
    assert our_entries(claim)[0]["data"]["computeMode"] == "time-slicing"
    (other,) = claim["status"]["allocation"]["devices"]["config"]
    assert other["opaque"]["parameters"] == {"cmd": "a && b <x>"}


def plugin_token_client(e2e: E2E, node: str) -> ApiClaimStatus:
    """Claim status writes with the identity of the plugin pod on ``node``: a token of its
    service account bound to that pod (so it names the node, as the kubelet-mounted token
    does), through the plugin's own writer API."""
    (pod,) = e2e.driver.plugin_pods(node)
    sa = pod["spec"]["serviceAccountName"]
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            },
            "expirationSeconds": 600,
        },
    }
    token = e2e.core.create_namespaced_service_account_token(sa, RELEASE_NAMESPACE, request)
    admin = e2e.api.configuration
    cfg = k8s.Configuration()
    cfg.host, cfg.ssl_ca_cert = admin.host, admin.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token.status.token}"}
    return ApiClaimStatus(k8s.ApiClient(cfg))


def rewrite(api: ApiClaimStatus, claim: dict[str, Any]) -> None:
    """Update the claim's status with its own entries, condition message changed (a change,
    so the API server authorizes it for the driver)."""
    entries = copy.deepcopy(our_entries(claim))
    for e in entries:
        e["conditions"][0]["message"] += " (rewritten)"
    meta = claim["metadata"]
    message = api.read(meta["namespace"], meta["name"], 10)
    api.replace(meta["namespace"], meta["name"], with_devices(message, entries), 10)


def test_a_plugin_may_write_only_claims_allocated_on_its_node(e2e: E2E) -> None:
    start(e2e, "here", "gpu-eighth", gpu=2, node=0)
    there = start(e2e, "there", "gpu-eighth", gpu=2, node=1)
    as_node1_plugin = plugin_token_client(e2e, e2e.nodes[0].name)
    with pytest.raises(ApiException) as refused:
        rewrite(as_node1_plugin, there)
    # The API server answers 422 with a Forbidden cause: the token's node is not the claim's,
    # so only arbitrary-node (never granted) could allow it.
    body = str(refused.value.body)
    assert refused.value.status == 422, body
    assert "changing status.devices requires" in body and "resourceclaims/driver" in body
    assert "arbitrary-node:update" in body
    rewrite(as_node1_plugin, e2e.claim_of("here"))  # its own node's claim: allowed
    after = e2e.claim_of("here")
    assert our_entries(after)[0]["conditions"][0]["message"].endswith("(rewritten)")
    assert not our_entries(e2e.claim_of("there"))[0]["conditions"][0]["message"].endswith(
        "(rewritten)"
    )
