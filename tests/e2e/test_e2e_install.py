"""Install the plain manifests into the real local control plane and check what the API
server does with them:

- every object is created (not a dry run): Namespace, RBAC, ConfigMap, DaemonSet, the two
  ValidatingAdmissionPolicies and their bindings, the DeviceClasses;
- node-scoped ResourceSlices: acting as the plugin's service account with a token bound to a
  node (impersonated: user ``system:serviceaccount:gpu-fraction-dra:<sa>`` plus the user extra
  ``authentication.kubernetes.io/node-name``), the plugin may create, update and delete the
  slices of its own node and driver only; RBAC denies it everything else;
- claim parameters: each ``manifests/examples/invalid/*.yaml`` is rejected with the message
  its ``# expect:`` line names, every valid example is admitted, and claims the controller
  generates from the examples' templates pass too.

Objects this module created are deleted at the end, so that the policies do not affect the
other e2e modules of the session.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
EXAMPLES = MANIFESTS / "examples"
NAMESPACE = "gpu-fraction-dra"
DRIVER = "gpu-fraction.dra.dev"
PLUGIN_USER = f"system:serviceaccount:{NAMESPACE}:gpu-fraction-dra-kubelet-plugin"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
SLICE_POLICY = "gpu-fraction-dra-node-scoped-slices"
PARAMS_POLICY = "gpu-fraction-dra-claim-parameters"
TENANT_POLICY = "gpu-fraction-dra-tenant-namespaces"
TENANT_QUOTA_POLICY = "gpu-fraction-dra-tenant-quota"
GRANT_QUOTA = "gpu-fraction-dra-gpu-fractions"
"""The ResourceQuota the plain manifests' tenant-quota policy requires in a granted namespace."""
SIZES_POLICY = "gpu-fraction-dra-dev-product-sizes"
PARAMS = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuFractionParameters"}
TENANT_LABEL = f"{DRIVER}/tenant"
T = TypeVar("T")


# --- helpers ----------------------------------------------------------------------------------


def suffix() -> str:
    return uuid.uuid4().hex[:8]


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def install_objects() -> list[dict[str, Any]]:
    """The plain manifests in apply order: namespace, the rest, DeviceClasses."""
    files = [MANIFESTS / "namespace.yaml"]
    files += sorted(p for p in MANIFESTS.glob("*.yaml") if p.name != "namespace.yaml")
    files += sorted((MANIFESTS / "deviceclasses").glob("*.yaml"))
    return [obj for f in files for obj in load(f)]


def resource(dc: dynamic.DynamicClient, obj: dict[str, Any]) -> Any:
    return dc.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])


def where(dc: dynamic.DynamicClient, obj: dict[str, Any], namespace: str | None) -> dict[str, str]:
    if not resource(dc, obj).namespaced:
        return {}
    return {"namespace": namespace or obj["metadata"].get("namespace") or "default"}


def create(dc: dynamic.DynamicClient, obj: dict[str, Any], namespace: str | None = None) -> Any:
    """Create ``obj``; a 409 from quota admission racing the quota controller's own update of
    the namespace's ResourceQuota status ("the object has been modified") is retried, as
    kubectl's users would."""
    for attempt in range(5):
        try:
            return resource(dc, obj).create(body=obj, **where(dc, obj, namespace))
        except ApiException as exc:
            if exc.status != 409 or "resourcequotas" not in str(exc.body) or attempt == 4:
                raise
            time.sleep(0.2)


def delete(dc: dynamic.DynamicClient, obj: dict[str, Any], namespace: str | None = None) -> None:
    with contextlib.suppress(ApiException):
        resource(dc, obj).delete(name=obj["metadata"]["name"], **where(dc, obj, namespace))


def status_message(exc: ApiException) -> str:
    try:
        message: str = json.loads(exc.body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(exc.body)
    return message


def rejected(fn: Callable[[], Any]) -> ApiException:
    """Run fn, which must fail; return the API error."""
    try:
        fn()
    except ApiException as exc:
        return exc
    pytest.fail("the API server accepted a request it should have rejected", pytrace=True)


def expected_message(path: Path) -> str:
    m = re.search(r"^# expect: (.+)$", path.read_text(), flags=re.M)
    assert m, f"{path.name}: no '# expect:' line"
    return m.group(1).strip()


def resource_slice(name: str, node: str, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0-quarter-0", "attributes": {"index": {"int": 0}}}],
        },
    }


def claim(name: str, params: dict[str, Any], **spec: Any) -> dict[str, Any]:
    requests = spec.pop(
        "requests", [{"name": "gpu", "exactly": {"deviceClassName": "gpu-quarter"}}]
    )
    config: dict[str, Any] = {
        "opaque": {"driver": spec.pop("driver", DRIVER), "parameters": params}
    }
    if "config_requests" in spec:
        config["requests"] = spec.pop("config_requests")
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": requests, "config": [config]}},
    }


# --- fixtures ---------------------------------------------------------------------------------


def dynamic_client(control_plane: Any, user: str | None = None, node: str | None = None) -> Any:
    """A dynamic client as cluster admin, or impersonating ``user`` (with the node extra a
    pod-bound service-account token carries, when ``node`` is given)."""
    api: client.ApiClient = control_plane.api_client()
    if user:
        api.set_default_header("Impersonate-User", user)
    if node:
        # Header names cannot hold "/": the extra's key is percent-encoded.
        api.set_default_header("Impersonate-Extra-" + NODE_NAME_EXTRA.replace("/", "%2F"), node)
    return dynamic.DynamicClient(api)


@pytest.fixture(scope="module")
def admin(control_plane: Any) -> Any:
    return dynamic_client(control_plane)


def plain_classes() -> list[str]:
    """The DeviceClasses of the plain manifests (the chart's defaults)."""
    return [
        obj["metadata"]["name"]
        for f in sorted((MANIFESTS / "deviceclasses").glob("*.yaml"))
        for obj in load(f)
        if obj["kind"] == "DeviceClass"
    ]


def grant_quotas(admin: Any) -> set[str]:
    """The ResourceQuotas a granted namespace needs: the plain manifests' (installed by this
    module after its namespaces exist) and those the tenant-quota policies already installed
    require (the session's chart's)."""
    bindings = admin.resources.get(
        api_version="admissionregistration.k8s.io/v1", kind="ValidatingAdmissionPolicyBinding"
    )
    required = {b.spec.paramRef.name for b in bindings.get().items if b.spec.get("paramRef")}
    return {GRANT_QUOTA, *required}


@contextlib.contextmanager
def fresh_namespace(admin: Any, prefix: str) -> Iterator[str]:
    """A new namespace (with its default ServiceAccount), granted this driver's devices as an
    admin grants them (docs/admin-guide.md, "Tenants"): the tenant label, Pod Security
    baseline (the examples' pods run as root) and the quotas of :func:`grant_quotas`, each
    listing every class of the plain manifests; its pods and itself are deleted on exit."""
    name = f"{prefix}-{suffix()}"
    labels = {TENANT_LABEL: "true", "pod-security.kubernetes.io/enforce": "baseline"}
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    create(admin, ns)
    classes = plain_classes()
    hard = {f"{c}.deviceclass.resource.k8s.io/devices": "1000" for c in classes}
    for quota in grant_quotas(admin):
        body = {"metadata": {"name": quota}, "spec": {"hard": hard}}
        create(admin, {"apiVersion": "v1", "kind": "ResourceQuota", **body}, name)
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
    wait_for(
        f"ServiceAccount {name}/default",
        lambda: _exists(admin, sa, name),
        timeout=30,
    )
    try:
        yield name
    finally:
        pods = admin.resources.get(api_version="v1", kind="Pod")
        for pod in pods.get(namespace=name).items:
            with contextlib.suppress(ApiException):
                pods.delete(name=pod.metadata.name, namespace=name, grace_period_seconds=0)
        delete(admin, ns)


@pytest.fixture(scope="module")
def test_ns(admin: Any) -> Iterator[str]:
    with fresh_namespace(admin, "e2e-install") as name:
        yield name


def _exists(dc: Any, obj: dict[str, Any], namespace: str | None = None) -> bool:
    try:
        resource(dc, obj).get(name=obj["metadata"]["name"], **where(dc, obj, namespace))
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


@pytest.fixture(scope="module")
def installed(admin: Any, test_ns: str) -> Iterator[list[dict[str, Any]]]:
    """Create every plain manifest; wait until both policies enforce; delete what we made."""
    objects = install_objects()
    created: list[dict[str, Any]] = []
    replaced: list[dict[str, Any]] = []
    try:
        for obj in objects:
            try:
                create(admin, obj)
                created.append(obj)
            except ApiException as exc:
                if exc.status != 409:
                    pytest.fail(
                        f"creating {obj['kind']}/{obj['metadata']['name']} failed: "
                        f"{exc.status} {status_message(exc)}"
                    )
                # Installed by the session's chart (the same names): keep its version to put
                # back, then bring the object to ours.
                current = resource(admin, obj).get(
                    name=obj["metadata"]["name"], **where(admin, obj, None)
                )
                replaced.append(current.to_dict())
                resource(admin, obj).server_side_apply(
                    body=obj,
                    field_manager="e2e-install",
                    force_conflicts=True,
                    **where(admin, obj, None),
                )
        _wait_params_policy(admin, test_ns)
        yield objects
    finally:
        for obj in reversed(created):
            delete(admin, obj)
        _wait_plain_policies_gone(admin)
        # Other modules rely on the chart's version (its DeviceClasses and sizing policy
        # depend on its values, e.g. extended resources): put it back as it was.
        for old in replaced:
            delete(admin, old)
            meta = {
                k: old["metadata"][k]
                for k in ("name", "labels", "annotations")
                if k in old["metadata"]
            }
            if "namespace" in old["metadata"]:
                meta["namespace"] = old["metadata"]["namespace"]
            body = {k: v for k, v in old.items() if k not in ("metadata", "status")}
            _recreate(admin, {**body, "metadata": meta})


def _wait_plain_policies_gone(admin: Any) -> None:
    """Return once the API server's admission no longer enforces the plain manifests' deleted
    policies: its informer drops them a moment after the delete, and until then the plain
    tenant-quota policy refuses every claim of the next module's namespaces (they carry the
    chart's quota, not the plain one; seen as 422 ``no params found`` in the test after this
    module). A dry-run template in a namespace granted as the chart grants it is the probe."""
    name = f"e2e-install-after-{suffix()}"
    labels = {TENANT_LABEL: "true", "pod-security.kubernetes.io/enforce": "baseline"}
    create(
        admin,
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}},
    )
    try:
        hard = {f"{c}.deviceclass.resource.k8s.io/devices": "0" for c in plain_classes()}
        for quota in grant_quotas(admin) - {GRANT_QUOTA}:
            body = {"metadata": {"name": quota}, "spec": {"hard": hard}}
            create(admin, {"apiVersion": "v1", "kind": "ResourceQuota", **body}, name)
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "probe"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu-eighth"}}]
                    }
                }
            },
        }
        templates = resource(admin, template)

        def admitted() -> bool:
            try:
                templates.create(body=template, namespace=name, query_params=[("dryRun", "All")])
            except ApiException as exc:
                if exc.status in (403, 422):
                    return False
                raise
            return True

        wait_for("the plain manifests' policies gone from admission", admitted, timeout=60)
    finally:
        delete(admin, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def _recreate(admin: Any, obj: dict[str, Any]) -> None:
    """Create ``obj`` once its deleted predecessor is gone (409 until then)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            create(admin, obj)
            return
        except ApiException as exc:
            if exc.status != 409 or time.monotonic() > deadline:
                raise
            time.sleep(0.25)


def _wait_params_policy(admin: Any, namespace: str) -> None:
    """Policies take effect when the API server's informers see them: probe until an invalid
    claim is rejected by the policy."""
    bad = claim(f"probe-{suffix()}", {**PARAMS, "computeMode": "mps"})

    def enforced() -> bool:
        try:
            create(admin, bad, namespace)
        except ApiException as exc:
            return exc.status == 422 and PARAMS_POLICY in status_message(exc)
        delete(admin, bad, namespace)
        return False

    wait_for(f"{PARAMS_POLICY} to enforce", enforced, timeout=60)


@pytest.fixture(scope="module")
def plugin_on(control_plane: Any, installed: Any) -> Callable[[str | None], Any]:
    """The plugin's identity on a node (None: a token without node binding)."""
    return lambda node: dynamic_client(control_plane, PLUGIN_USER, node)


def _slices(dc: Any) -> Any:
    return dc.resources.get(api_version="resource.k8s.io/v1", kind="ResourceSlice")


@pytest.fixture(scope="module")
def slice_policy_enforced(admin: Any, plugin_on: Callable[[str | None], Any]) -> None:
    plugin = plugin_on(f"probe-own-{suffix()}")
    probe = resource_slice(f"probe-{suffix()}", f"probe-other-{suffix()}")

    def enforced() -> bool:
        try:
            _slices(plugin).create(body=probe)
        except ApiException as exc:
            return exc.status == 403 and SLICE_POLICY in status_message(exc)
        _slices(admin).delete(name=probe["metadata"]["name"])
        return False

    wait_for(f"{SLICE_POLICY} to enforce", enforced, timeout=60)


# --- install ----------------------------------------------------------------------------------


def test_every_manifest_object_exists(admin: Any, installed: list[dict[str, Any]]) -> None:
    kinds = set()
    for obj in installed:
        assert _exists(admin, obj), f"{obj['kind']}/{obj['metadata']['name']} missing"
        kinds.add(obj["kind"])
    assert kinds == {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
        "DeviceClass",
        "NetworkPolicy",
    }
    # The API server compiled every CEL expression and found no type problems.
    vaps = admin.resources.get(
        api_version="admissionregistration.k8s.io/v1", kind="ValidatingAdmissionPolicy"
    )
    for name in (SLICE_POLICY, PARAMS_POLICY, TENANT_POLICY, TENANT_QUOTA_POLICY, SIZES_POLICY):

        def checked(name: str = name) -> dict[str, Any] | None:
            vap = vaps.get(name=name).to_dict()
            status = vap.get("status") or {}
            done = status.get("observedGeneration") == vap["metadata"]["generation"]
            return status if done else None

        status = wait_for(f"{name} type checking", checked, timeout=30)
        assert not (status.get("typeChecking") or {}).get("expressionWarnings"), status


# --- node-scoped slices -----------------------------------------------------------------------


@pytest.mark.usefixtures("slice_policy_enforced")
def test_plugin_writes_only_its_own_nodes_slices(
    admin: Any, plugin_on: Callable[[str | None], Any]
) -> None:
    own, other = f"e2e-gpu-a-{suffix()}", f"e2e-gpu-b-{suffix()}"
    plugin = _slices(plugin_on(own))
    mine, theirs = resource_slice(f"{own}-0", own), resource_slice(f"{other}-0", other)
    try:
        plugin.create(body=mine)
        merge = "application/merge-patch+json"
        plugin.patch(name=f"{own}-0", body={"metadata": {"labels": {"a": "b"}}}, content_type=merge)
        listed = plugin.get(field_selector=f"spec.nodeName={own}")
        assert [s.metadata.name for s in listed.items] == [f"{own}-0"]

        exc = rejected(lambda: plugin.create(body=theirs))
        assert exc.status == 403
        msg = status_message(exc)
        assert SLICE_POLICY in msg
        assert f"the kubelet plugin on node {own} may only create ResourceSlices" in msg
        assert f"not {other}" in msg

        # An admin's slice for the other node: the plugin may neither change nor delete it.
        _slices(admin).create(body=theirs)
        exc = rejected(
            lambda: plugin.patch(
                name=f"{other}-0", body={"metadata": {"labels": {"a": "b"}}}, content_type=merge
            )
        )
        assert exc.status == 403 and "may only update" in status_message(exc)
        exc = rejected(lambda: plugin.delete(name=f"{other}-0"))
        assert exc.status == 403 and "may only delete" in status_message(exc)

        exc = rejected(
            lambda: plugin.create(body=resource_slice(f"{own}-x", own, "other.example.com"))
        )
        assert exc.status == 403
        assert f"only write ResourceSlices of driver {DRIVER}" in status_message(exc)

        plugin.delete(name=f"{own}-0")
    finally:
        for name in (f"{own}-0", f"{other}-0"):
            with contextlib.suppress(ApiException):
                _slices(admin).delete(name=name)


@pytest.mark.usefixtures("slice_policy_enforced")
def test_plugin_token_without_node_is_refused(plugin_on: Callable[[str | None], Any]) -> None:
    node = f"e2e-gpu-{suffix()}"
    exc = rejected(lambda: _slices(plugin_on(None)).create(body=resource_slice(node, node)))
    assert exc.status == 403
    assert f"no {NODE_NAME_EXTRA}" in status_message(exc)


@pytest.mark.usefixtures("slice_policy_enforced")
def test_policy_leaves_other_identities_alone(admin: Any) -> None:
    node = f"e2e-any-{suffix()}"
    _slices(admin).create(body=resource_slice(node, node))
    _slices(admin).delete(name=node)


def test_plugin_rbac_is_narrow(plugin_on: Callable[[str | None], Any]) -> None:
    plugin = plugin_on(f"e2e-gpu-{suffix()}")
    forbidden: list[tuple[str, Callable[[], Any]]] = [
        (
            "create deviceclasses",
            lambda: plugin.resources.get(
                api_version="resource.k8s.io/v1", kind="DeviceClass"
            ).create(body={"metadata": {"name": f"e2e-{suffix()}"}, "spec": {}}),
        ),
        (
            "list secrets",
            lambda: plugin.resources.get(api_version="v1", kind="Secret").get(namespace=NAMESPACE),
        ),
        ("list pods", lambda: plugin.resources.get(api_version="v1", kind="Pod").get()),
        (
            "list resourceclaims",
            lambda: plugin.resources.get(
                api_version="resource.k8s.io/v1", kind="ResourceClaim"
            ).get(),
        ),
        (
            "delete all resourceslices",
            lambda: _slices(plugin).delete(field_selector=f"spec.driver={DRIVER}"),
        ),
        ("list nodes", lambda: plugin.resources.get(api_version="v1", kind="Node").get()),
    ]
    for what, fn in forbidden:
        exc = rejected(fn)
        assert exc.status == 403, what
        assert "cannot" in status_message(exc), (what, status_message(exc))


# --- claim parameters -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", sorted((EXAMPLES / "invalid").glob("*.yaml")), ids=lambda p: p.stem
)
def test_invalid_example_is_rejected(admin: Any, test_ns: str, installed: Any, path: Path) -> None:
    (obj,) = load(path)
    exc = rejected(lambda: create(admin, obj, test_ns))
    delete(admin, obj, test_ns)
    msg = status_message(exc)
    assert exc.status == 422, msg
    assert PARAMS_POLICY in msg
    assert expected_message(path) in msg


WORKLOADS = {"Pod", "Deployment", "Job", "StatefulSet", "DaemonSet"}


def inert(obj: dict[str, Any]) -> dict[str, Any]:
    """A workload that the real nodes of the session never run: it selects no node, and its
    containers use the local busybox image, never pulled (nothing is fetched from outside).
    Admission sees the same claims and templates as with the shipped workload."""
    if obj["kind"] not in WORKLOADS:
        return obj
    obj = json.loads(json.dumps(obj))
    spec = obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"gpu-fraction.dra.dev/e2e-admission-only": "no-such-node"}
    for c in spec["containers"]:
        c["image"], c["imagePullPolicy"] = "localhost/busybox:1.35.0", "Never"
    return obj


@pytest.fixture
def examples_ns(admin: Any) -> Iterator[str]:
    """The examples' own namespace: their ResourceQuota (8 claims) must not count the claims
    of later tests, whose deletions reach the quota's usage only when its controller catches
    up (CI once saw a later test refused for "exceeded quota")."""
    with fresh_namespace(admin, "e2e-examples") as name:
        yield name


def test_valid_examples_are_admitted(admin: Any, examples_ns: str, installed: Any) -> None:
    cluster_scoped: list[dict[str, Any]] = []
    try:
        for path in sorted(EXAMPLES.glob("*.yaml")):
            for obj in map(inert, load(path)):
                try:
                    create(admin, obj, examples_ns)
                except ApiException as exc:
                    pytest.fail(f"{path.name}: {obj['kind']} rejected: {status_message(exc)}")
                if not resource(admin, obj).namespaced:
                    cluster_scoped.append(obj)
        # The resourceclaim controller makes each pod's claim from its template: those
        # claims pass the policy too.
        pods = admin.resources.get(api_version="v1", kind="Pod")
        status = wait_for(
            "the notebook pod's generated claim",
            lambda: (
                pods.get(name="notebook", namespace=examples_ns).to_dict().get("status") or {}
            ).get("resourceClaimStatuses"),
            timeout=60,
        )
        (entry,) = status
        claims = admin.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")
        generated = claims.get(name=entry["resourceClaimName"], namespace=examples_ns)
        assert generated.spec.devices.requests[0].exactly.deviceClassName == "gpu-eighth"
    finally:
        for obj in cluster_scoped:
            delete(admin, obj)


def test_parameter_edge_cases(admin: Any, test_ns: str, installed: Any) -> None:
    def admitted(obj: dict[str, Any]) -> None:
        create(admin, obj, test_ns)
        delete(admin, obj, test_ns)

    def refused(obj: dict[str, Any], message: str) -> None:
        exc = rejected(lambda: create(admin, obj, test_ns))
        assert exc.status == 422 and message in status_message(exc), status_message(exc)

    n = suffix()
    # Forms the plugin accepts: integer bytes, numeric portions, a percentage whose mode
    # comes from the class, a config without requests (applies to all).
    # (a byte limit on a product depends on the card: Prepare checks it against the cap)
    admitted(claim(f"int-{n}", {**PARAMS, "memoryLimit": 64 * 2**30}))
    admitted(claim(f"num-{n}", {**PARAMS, "memoryLimitPortion": 0.25}))
    admitted(claim(f"strportion-{n}", {**PARAMS, "memoryLimitPortion": "0.25"}))
    admitted(claim(f"pct-{n}", {**PARAMS, "activeThreadPercentage": 30}))
    # No cap set by an admin: a ceiling above the quarter's own size is refused.
    refused(
        claim(f"one-{n}", {**PARAMS, "memoryLimitPortion": "1"}),
        "memoryLimitPortion 1 on request gpu exceeds what DeviceClass gpu-quarter allows "
        "(0.25 of the card; without a cap set by an admin a ceiling is the request)",
    )
    # Every problem at once (a claim with two mistakes showed only the first).
    both = claim(f"two-{n}", {**PARAMS, "memoryLimitPortion": "0.5", "activeThreadPercentage": 150})
    exc = rejected(lambda: create(admin, both, test_ns))
    assert "activeThreadPercentage 150 must be an integer from 1 to 100" in status_message(exc)
    assert "memoryLimitPortion 0.5 on request gpu exceeds" in status_message(exc)
    refused(
        claim(f"all-{n}", {**PARAMS, "memoryLimitPortion": "2"}, config_requests=None),
        "parameters for all requests: memoryLimitPortion 2",
    )
    # Other drivers' parameters are not ours to judge.
    admitted(claim(f"other-{n}", {"anything": True}, driver="other.example.com"))
    refused(claim(f"str-{n}", {**PARAMS, "activeThreadPercentage": "30"}), "integer from 1 to 100")
    admitted(claim(f"shared-{n}", {**PARAMS, "maxConsumers": 3}))
    for bad in (0, 33, "2"):
        refused(
            claim(f"consumers-{n}-{str(bad).lower()}", {**PARAMS, "maxConsumers": bad}),
            f"maxConsumers {bad} must be an integer from 1 to 32",
        )
    # Limits against capacity requests, including firstAvailable subrequests.
    sub = [
        {
            "name": "gpu",
            "firstAvailable": [
                {
                    "name": "big",
                    "deviceClassName": "gpu-memory",
                    "capacity": {"requests": {"memory": "80Gi"}},
                },
                {
                    "name": "small",
                    "deviceClassName": "gpu-memory",
                    "capacity": {"requests": {"memory": "10Gi"}},
                },
            ],
        }
    ]
    limit = {**PARAMS, "memoryLimit": "40Gi"}
    refused(
        claim(f"sub-{n}", limit, requests=sub, config_requests=["gpu"]),
        "memoryLimit 40Gi is below the memory requested by gpu/big (80Gi)",
    )
    # gpu-memory has no cap: a ceiling above the requested memory is refused as well
    refused(
        claim(f"small-{n}", limit, requests=sub, config_requests=["gpu/small"]),
        "memoryLimit 40Gi on request gpu/small exceeds its requested memory 10Gi",
    )
    ten = {**PARAMS, "memoryLimit": "10Gi"}
    admitted(claim(f"ten-{n}", ten, requests=sub, config_requests=["gpu/small"]))
    refused(
        claim(f"big-{n}", limit, requests=sub, config_requests=["gpu/big"]),
        "requested by gpu/big (80Gi)",
    )
    # Metadata updates skip the policy: an admitted claim stays manageable. (A PUT: the API
    # server rejects merge/JSON patches of claims carrying opaque parameters as "spec is
    # immutable" in 1.37, with or without this policy. It compares the parameters byte by
    # byte, and the sizing admission policy stores them compact, as Go clients such as
    # kubectl send them; so the PUT sends compact JSON, not the Python client's spacing.)
    ok = claim(f"meta-{n}", {**PARAMS, "computeMode": "sm-sharing"})
    claims = resource(admin, ok)
    create(admin, ok, test_ns)
    current = claims.get(name=ok["metadata"]["name"], namespace=test_ns).to_dict()
    current["metadata"]["labels"] = {"team": "a"}
    cfg = admin.client.configuration
    path = f"/apis/resource.k8s.io/v1/namespaces/{test_ns}/resourceclaims"
    url = f"{cfg.host}{path}/{current['metadata']['name']}"
    headers = {"Content-Type": "application/json", **admin.client.default_headers}
    if cfg.api_key.get("authorization"):
        headers["Authorization"] = cfg.api_key["authorization"]
    reply = admin.client.rest_client.pool_manager.request(
        "PUT", url, body=json.dumps(current, separators=(",", ":")), headers=headers
    )
    assert reply.status == 200, reply.data[:500]
    delete(admin, ok, test_ns)
