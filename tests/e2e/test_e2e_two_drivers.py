"""One claim, two drivers, on the real node (kubernetes-sigs/dra-driver-nvidia-gpu#1327, #435):
the kubelet hands the whole claim to every driver that holds one of its results.

The second driver is :class:`tests.support.otherdriver.OtherDriver`, a minimal kubelet plugin
registered on the node (real gRPC over the node's sockets). No scheduler allocates across two
drivers' ResourceSlices for a test, so the claim is allocated by hand through the status
subresource, as the scheduler would write it: a ``gpu-eighth`` share of ours (request ``gpu``)
and a result of the other driver for a device named like ours in a pool named like ours
(request ``nic``), with the other driver's opaque config. Our Prepare, CDI spec, checkpoint and
claim status touch our result only; the other driver's result is neither refused nor recorded,
and its status entry stays.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    DRIVER,
    E2E,
    TIME_SLICING_GPUS,
    raw,
    slice_devices,
    wait_for,
)

from tests.support.otherdriver import OtherDriver  # noqa: E402

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

OTHER = "other.example.com"


@pytest.fixture
def other(e2e: E2E) -> Iterator[OtherDriver]:
    """The other driver, registered with the first node's kubelet."""
    node = e2e.nodes[0]

    def read(namespace: str, name: str) -> dict[str, Any]:
        return raw(e2e.res.read_namespaced_resource_claim(name, namespace, _preload_content=False))

    driver = OtherDriver(OTHER, node.root / "kubelet", read)
    driver.start()
    try:
        assert driver.registered.wait(30), "the kubelet did not register the other driver"
        yield driver
    finally:
        for pod in e2e.pods():  # the kubelet needs both drivers to unprepare their claims
            e2e.delete_pod(pod["metadata"]["name"])
        wait_for("the test's pods gone", lambda: not e2e.pods(), timeout=90)
        driver.stop()


def test_our_prepare_touches_only_our_result_of_a_claim_shared_with_another_driver(
    e2e: E2E, other: OtherDriver
) -> None:
    node = e2e.nodes[0]
    gpu = TIME_SLICING_GPUS[1]
    device = f"gpu-{gpu}-time-slicing"
    assert device in slice_devices(e2e.slices(node.name))
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "two"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu-eighth"}},
                    {"name": "nic", "exactly": {"deviceClassName": "other-nic"}},
                ],
                "config": [
                    {
                        "requests": ["nic"],
                        "opaque": {"driver": OTHER, "parameters": {"kind": "Nic", "mtu": 9000}},
                    }
                ],
            }
        },
    }
    claim = raw(
        e2e.res.create_namespaced_resource_claim(e2e.namespace, body, _preload_content=False)
    )
    uid = claim["metadata"]["uid"]
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": DRIVER,
                        "pool": node.name,
                        "device": device,
                        "shareID": str(uuid.uuid4()),
                        "consumedCapacity": {"slots": "1"},
                    },
                    {"request": "nic", "driver": OTHER, "pool": node.name, "device": device},
                ],
                "config": [
                    {
                        "source": "FromClaim",
                        "requests": ["nic"],
                        "opaque": {"driver": OTHER, "parameters": {"kind": "Nic", "mtu": 9000}},
                    }
                ],
            },
            # The scheduler sets it when it is missing (DRADeviceBindingConditions), which
            # would change the immutable allocation: 422 on its reservation.
            "allocationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [node.name]}
                        ]
                    }
                ]
            },
        },
        "devices": [{"driver": OTHER, "pool": node.name, "device": device, "data": {"mtu": 9000}}],
    }
    # Sent compact, with sorted keys, as YAML (which JSON is): the API server keeps opaque
    # parameters as their bytes and later compares them with its own compact rendering, so
    # the Python client's JSON (a space after ':' and ',') would make every later update of
    # the claim, the scheduler's reservation included, fail with 422 "status.allocation:
    # field cannot be modified once set".
    request = e2e.api.param_serialize(
        "PUT",
        f"/apis/resource.k8s.io/v1/namespaces/{e2e.namespace}/resourceclaims/two/status",
        header_params={"Content-Type": "application/yaml", "Accept": "application/json"},
        body=json.dumps(claim, separators=(",", ":"), sort_keys=True),
        auth_settings=["BearerToken"],
    )
    answer = e2e.api.call_api(*request[:4])
    answer.read()
    assert answer.status == 200, answer.data
    e2e.pod("p", node, claims={"gpu": "two"}, run_as_user=1000)
    e2e.wait_running("p", timeout=90)

    assert uid in other.prepared  # the kubelet gave the claim to both drivers
    spec = json.loads(node.cdi_spec_path(uid).read_text())
    assert len(spec["devices"]) == 1 and OTHER not in json.dumps(spec)
    record = node.plugin_checkpoint()[uid]
    assert [d["request_names"] for d in record["devices"]] == [["gpu"]]
    assert [d["request_names"] for d in record["plan"]["devices"]] == [["gpu"]]
    assert f"/dev/nvidia{gpu}" in e2e.view("p").devices

    def statuses() -> dict[str, Any] | None:
        got = raw(
            e2e.res.read_namespaced_resource_claim("two", e2e.namespace, _preload_content=False)
        )
        entries = {d["driver"]: d for d in got["status"].get("devices") or []}
        return entries if DRIVER in entries else None

    entries = wait_for("our status entry", statuses, timeout=30)
    assert entries[OTHER]["data"] == {"mtu": 9000}  # the other driver's entry kept
    assert entries[DRIVER]["device"] == device

    e2e.delete_pod("p")
    e2e.wait_gone("p", timeout=90)
    assert uid in other.unprepared
    assert uid not in node.plugin_checkpoint() and not node.cdi_spec_path(uid).exists()
    e2e.res.delete_namespaced_resource_claim("two", e2e.namespace)
