"""Smoke tests of the real local control plane (hack/local-cluster): version, DRA
scheduling with shared counters through the real scheduler and controller-manager, and
ResourceQuota on DeviceClass device counts. Nothing here is simulated: the assertions
are on what the Kubernetes components did."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, TypeVar

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

DRIVER = "gpu.example.com"
T = TypeVar("T")
M = TypeVar("M")


def suffix() -> str:
    return uuid.uuid4().hex[:8]


def as_dict(api: client.ApiClient, obj: Any) -> dict[str, Any]:
    """API JSON (camelCase, no nulls) of a client model."""
    data: dict[str, Any] = api.sanitize_for_serialization(obj)
    return data


def model(cls: type[M], body: dict[str, Any]) -> M:
    obj = cls.from_dict(body)  # type: ignore[attr-defined]
    assert obj is not None
    return obj  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def api(control_plane: Any) -> client.ApiClient:
    api_client: client.ApiClient = control_plane.api_client()
    return api_client


@pytest.fixture
def namespace(api: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(api)
    name = f"e2e-{suffix()}"
    core.create_namespace(model(client.V1Namespace, {"metadata": {"name": name}}))
    # The serviceaccount controller must have created "default" before pods are admitted.
    wait_for(
        f"ServiceAccount {name}/default",
        lambda: core.read_namespaced_service_account("default", name),
        timeout=30,
    )
    yield name
    # No kubelet: pods bound to a node would wait forever for graceful termination.
    for pod in as_dict(api, core.list_namespaced_pod(name))["items"]:
        core.delete_namespaced_pod(pod["metadata"]["name"], name, grace_period_seconds=0)
    core.delete_namespace(name)


def device_class(api: client.ApiClient, name: str) -> None:
    client.ResourceV1Api(api).create_device_class(
        model(
            client.V1DeviceClass,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            },
        )
    )


def test_apiserver_version(api: client.ApiClient) -> None:
    info = as_dict(api, client.VersionApi(api).get_code())
    assert info["gitVersion"] == "v1.37.2"
    assert (info["major"], info["minor"]) == ("1", "37")
    groups = {
        g["name"]: [v["version"] for v in g["versions"]]
        for g in as_dict(api, client.ApisApi(api).get_api_versions())["groups"]
    }
    assert "v1" in groups["resource.k8s.io"]
    assert "v1" in groups["admissionregistration.k8s.io"]


def test_dra_claim_allocated_from_shared_counters(api: client.ApiClient, namespace: str) -> None:
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    node, cls, tmpl = f"e2e-node-{suffix()}", f"gpu-{suffix()}.example.com", "one-gpu"
    created_slices: list[str] = []
    try:
        core.create_node(
            model(
                client.V1Node,
                {
                    "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
                    "status": {
                        "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                        "conditions": [
                            {
                                "type": "Ready",
                                "status": "True",
                                "reason": "KubeletReady",
                                "message": "stand-in",
                            }
                        ],
                    },
                },
            )
        )
        device_class(api, cls)
        pool = {"name": node, "generation": 1, "resourceSliceCount": 2}
        # From 1.35 on, counters and the devices consuming them live in separate slices
        # of one pool. 2 partitions x 30Gi > 40Gi: only one can be allocated at a time.
        slices: list[dict[str, Any]] = [
            {
                "metadata": {"name": f"{node}-counters"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": node,
                    "pool": pool,
                    "sharedCounters": [
                        {"name": "gpu-0", "counters": {"memory": {"value": "40Gi"}}}
                    ],
                },
            },
            {
                "metadata": {"name": f"{node}-devices"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": node,
                    "pool": pool,
                    "devices": [
                        {
                            "name": f"gpu-0-part-{i}",
                            "attributes": {"index": {"int": i}},
                            "capacity": {"memory": {"value": "30Gi"}},
                            "consumesCounters": [
                                {"counterSet": "gpu-0", "counters": {"memory": {"value": "30Gi"}}}
                            ],
                        }
                        for i in range(2)
                    ],
                },
            },
        ]
        for s in slices:
            res.create_resource_slice(
                model(
                    client.V1ResourceSlice,
                    {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **s},
                )
            )
            created_slices.append(s["metadata"]["name"])
        res.create_namespaced_resource_claim_template(
            namespace,
            model(
                client.V1ResourceClaimTemplate,
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaimTemplate",
                    "metadata": {"name": tmpl},
                    "spec": {
                        "spec": {
                            "devices": {
                                "requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]
                            }
                        }
                    },
                },
            ),
        )

        def pod(name: str) -> client.V1Pod:
            return model(
                client.V1Pod,
                {
                    "metadata": {"name": name},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": node},
                        "containers": [
                            {
                                "name": "c",
                                "image": "pause",
                                "resources": {"claims": [{"name": "gpu"}]},
                            }
                        ],
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": tmpl}],
                    },
                },
            )

        core.create_namespaced_pod(namespace, pod("first"))

        def node_of(pod: str) -> str | None:
            spec = as_dict(api, core.read_namespaced_pod(pod, namespace))["spec"]
            name: str | None = spec.get("nodeName")
            return name

        bound = wait_for(
            "pod 'first' to be bound by kube-scheduler", lambda: node_of("first"), timeout=60
        )
        assert bound == node

        p = as_dict(api, core.read_namespaced_pod("first", namespace))
        [status] = p["status"]["resourceClaimStatuses"]
        assert status["name"] == "gpu"
        claim = as_dict(
            api, res.read_namespaced_resource_claim(status["resourceClaimName"], namespace)
        )
        owner = claim["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("Pod", "first")
        assert "allocation" in claim.get("status", {}), f"claim not allocated: {claim}"
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["request"] == "gpu"
        assert result["driver"] == DRIVER
        assert result["pool"] == node
        assert result["device"] in {"gpu-0-part-0", "gpu-0-part-1"}
        terms = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
        assert node in str(terms)
        assert [r["name"] for r in claim["status"]["reservedFor"]] == ["first"]

        # The other partition exists but the shared counter has only 10Gi left.
        core.create_namespaced_pod(namespace, pod("second"))

        def unschedulable() -> dict[str, Any] | None:
            conds = (
                as_dict(api, core.read_namespaced_pod("second", namespace))
                .get("status", {})
                .get("conditions", [])
            )
            return next(
                (
                    c
                    for c in conds
                    if c["type"] == "PodScheduled"
                    and c["status"] == "False"
                    and c.get("reason") == "Unschedulable"
                ),
                None,
            )

        cond = wait_for("pod 'second' to be reported Unschedulable", unschedulable, timeout=60)
        assert "node" in cond.get("message", "")
        assert node_of("second") is None
    finally:
        for name in created_slices:
            res.delete_resource_slice(name)
        for fn, arg in ((res.delete_device_class, cls), (core.delete_node, node)):
            try:
                fn(arg)
            except ApiException as e:
                if e.status != 404:
                    raise


def test_resource_quota_limits_deviceclass_devices(api: client.ApiClient, namespace: str) -> None:
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    cls = f"gpu-{suffix()}.example.com"
    quota_key = f"{cls}.deviceclass.resource.k8s.io/devices"
    device_class(api, cls)
    try:
        core.create_namespaced_resource_quota(
            namespace,
            model(
                client.V1ResourceQuota,
                {"metadata": {"name": "gpus"}, "spec": {"hard": {quota_key: "1"}}},
            ),
        )

        def quota(field: str) -> Any:
            q = as_dict(api, core.read_namespaced_resource_quota("gpus", namespace))
            return q.get("status", {}).get(field, {}).get(quota_key)

        def claim(name: str, count: int = 1) -> client.ResourceV1ResourceClaim:
            request = {"deviceClassName": cls, "count": count}
            return model(
                client.ResourceV1ResourceClaim,
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": name},
                    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
                },
            )

        wait_for("ResourceQuota status", lambda: quota("hard") == "1", timeout=30)

        # Quota admission ignores a quota whose status.hard it has not seen yet (its informer
        # can lag the GET above by a moment): wait until a dry-run claim for 2 devices is
        # refused, which proves the quota is enforced. Dry runs do not charge the quota.
        def enforced() -> bool:
            try:
                res.create_namespaced_resource_claim(namespace, claim("probe", 2), dry_run="All")
            except ApiException as e:
                return e.status == 403 and "exceeded quota: gpus" in str(e.body)
            return False

        wait_for("quota admission to enforce the new quota", enforced, timeout=30)

        res.create_namespaced_resource_claim(namespace, claim("first"))
        with pytest.raises(ApiException) as err:
            res.create_namespaced_resource_claim(namespace, claim("second"))
        assert err.value.status == 403
        body = str(err.value.body)
        assert "exceeded quota: gpus" in body
        assert quota_key in body
        assert wait_for("quota usage", lambda: quota("used"), timeout=60) == "1"
        names = [
            c["metadata"]["name"]
            for c in as_dict(api, res.list_namespaced_resource_claim(namespace))["items"]
        ]
        assert names == ["first"]
    finally:
        res.delete_device_class(cls)


def test_validating_admission_policy_on_resource_claims(
    api: client.ApiClient, namespace: str
) -> None:
    """admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy is enforced by the apiserver."""
    adm, res = client.AdmissionregistrationV1Api(api), client.ResourceV1Api(api)
    name = f"e2e-max-one-device-{suffix()}"
    adm.create_validating_admission_policy(
        model(
            client.V1ValidatingAdmissionPolicy,
            {
                "metadata": {"name": name},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {
                        "resourceRules": [
                            {
                                "apiGroups": ["resource.k8s.io"],
                                "apiVersions": ["*"],
                                "operations": ["CREATE", "UPDATE"],
                                "resources": ["resourceclaims"],
                            }
                        ]
                    },
                    "validations": [
                        {
                            "expression": "object.spec.devices.requests.all(r, !has(r.exactly)"
                            " || !has(r.exactly.count) || r.exactly.count <= 1)",
                            "message": "at most one device per request",
                            "reason": "Forbidden",
                        }
                    ],
                },
            },
        )
    )
    try:
        adm.create_validating_admission_policy_binding(
            model(
                client.V1ValidatingAdmissionPolicyBinding,
                {
                    "metadata": {"name": name},
                    "spec": {
                        "policyName": name,
                        "validationActions": ["Deny"],
                        "matchResources": {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": namespace}
                            }
                        },
                    },
                },
            )
        )

        def claim(count: int) -> client.ResourceV1ResourceClaim:
            return model(
                client.ResourceV1ResourceClaim,
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"generateName": f"count-{count}-"},
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "gpu",
                                    "exactly": {
                                        "deviceClassName": "any.example.com",
                                        "count": count,
                                    },
                                }
                            ]
                        }
                    },
                },
            )

        # The apiserver compiles and activates a new policy asynchronously: retry until the
        # over-sized claim is rejected (claims admitted before that are simply left behind).
        def denied() -> ApiException | None:
            try:
                res.create_namespaced_resource_claim(namespace, claim(2))
            except ApiException as e:
                return e
            return None

        err = wait_for("the policy to reject a claim for 2 devices", denied, timeout=30)
        assert err.status == 403
        assert "at most one device per request" in str(err.body)
        assert name in str(err.body)
        res.create_namespaced_resource_claim(namespace, claim(1))
    finally:
        for fn in (
            adm.delete_validating_admission_policy_binding,
            adm.delete_validating_admission_policy,
        ):
            try:
                fn(name)
            except ApiException as e:
                if e.status != 404:
                    raise
