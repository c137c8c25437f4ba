"""A fraction is a boundary: tenant attacks on the real control plane (and the real node where
Prepare is involved), each refused or sized to exactly what quota, class and node allow.

The tenant is a ServiceAccount with the ``edit`` role in its namespace (what a team gets on a
shared cluster), using its own token; the namespace carries the admin's tenant label and the
ResourceQuota the chart renders for ``tenants.namespaces: {<ns>: {gpu-eighth: 1}}`` (every
class of the driver at 0 except one eighth). Scheduling attacks run on kubelet-less nodes
(:class:`VirtualNode`; the real kube-scheduler allocates as on a real node), Prepare attacks
on the session's real nodes. Every attempt is printed with the API server's or the plugin's
answer and the claim's final allocation (``ATTACK | attempt | answer | allocation``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from devtools import localinstall
from devtools.chartrender import sizing_policies
from dra_driver.config.node import GpuConfig, NodeConfig

SCHEDULER_USER = "system:kube-scheduler"
"""Who kube-scheduler is to the API server (the chart value ``policies.schedulerUser``)."""
pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    CLASS_LIMITS,
    DRIVER,
    E2E,
    GRANT_LABELS,
    GRANT_QUOTA,
    POD_SECURITY_LABEL,
    RELEASE,
    RELEASE_NAMESPACE,
    SM_SHARING_PRODUCT_GPUS,
    TENANT_LABEL,
    TIME_SLICING_GPUS,
    VIRTUAL_TAINT,
    VirtualNode,
    grant,
    raw,
    short_id,
    unschedulable,
    wait_for,
    wait_quota_enforced,
)

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

ON_GPU = 'device.attributes["gpu-fraction.dra.dev"].index == {}'
PARAMS = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuFractionParameters"}
SLOTS = {"eighth": 1, "quarter": 2, "half": 4, "full": 8}
ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
SIZES_POLICY = f"{DRIVER.replace('.', '-')}-product-sizes"
FAILED_PREPARE = "FailedPrepareDynamicResources"


_shown: list[pytest.CaptureFixture[str]] = []


@pytest.fixture(autouse=True)
def _attack_table(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    _shown.append(capsys)
    yield
    _shown.pop()


def report(attempt: str, answer: str, allocation: str = "-") -> None:
    """One line of the attack table, shown in the test output even when the test passes."""
    with _shown[-1].disabled():
        print(f"\nATTACK | {attempt} | {answer[:400]} | {allocation}")


def message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.body)


def refused(fn: Callable[[], Any]) -> ApiException:
    try:
        fn()
    except ApiException as exc:
        return exc
    pytest.fail("the API server admitted what it should have refused")


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return list(
        ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
    )


def allocation_text(claim: dict[str, Any]) -> str:
    return (
        ", ".join(
            f"{r['device']} {json.dumps(r.get('consumedCapacity') or {})}" for r in results(claim)
        )
        or "not allocated"
    )


# --- the tenant -------------------------------------------------------------------------------


class Tenant:
    """A namespace a team owns: its ServiceAccount ``tenant`` has the ``edit`` role there."""

    def __init__(self, e2e: E2E, namespace: str, api: k8s.ApiClient) -> None:
        self.e2e = e2e
        self.namespace = namespace
        self.api = api

    @property
    def res(self) -> k8s.ResourceV1Api:
        return k8s.ResourceV1Api(self.api)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    def create_claim(self, body: dict[str, Any]) -> dict[str, Any]:
        return raw(
            self.res.create_namespaced_resource_claim(
                self.namespace,
                k8s.ResourceV1ResourceClaim.from_dict(body),
                _preload_content=False,
            )
        )

    def create_template(self, body: dict[str, Any]) -> None:
        self.res.create_namespaced_resource_claim_template(
            self.namespace, k8s.V1ResourceClaimTemplate.from_dict(body)
        )

    def create_pod(self, name: str, spec: dict[str, Any]) -> None:
        spec = {
            **spec,
            "containers": [
                {**c, "image": "localhost/busybox:1.35.0", "imagePullPolicy": "Never"}
                for c in spec["containers"]
            ],
            "terminationGracePeriodSeconds": 1,
        }
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
        self.core.create_namespaced_pod(self.namespace, k8s.V1Pod.from_dict(body))

    def claim(self, name: str) -> dict[str, Any]:
        return raw(
            k8s.ResourceV1Api(self.e2e.api).read_namespaced_resource_claim(
                name, self.namespace, _preload_content=False
            )
        )

    def pod_claim(self, pod: str) -> dict[str, Any]:
        p = raw(
            k8s.CoreV1Api(self.e2e.api).read_namespaced_pod(
                pod, self.namespace, _preload_content=False
            )
        )
        statuses = p["status"].get("resourceClaimStatuses") or []
        name = statuses[0]["resourceClaimName"] if statuses else None
        if name is None:
            name = (p["status"].get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
        assert name, f"pod {pod} has no claim yet"
        return self.claim(name)


def token_client(e2e: E2E, namespace: str, sa: str) -> k8s.ApiClient:
    """An API client with a token of ServiceAccount ``namespace/sa`` (TokenRequest)."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"}
    request["spec"] = {"expirationSeconds": 1200}
    token = e2e.core.create_namespaced_service_account_token(sa, namespace, request)
    admin = e2e.api.configuration
    cfg = k8s.Configuration()
    cfg.host, cfg.ssl_ca_cert = admin.host, admin.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token.status.token}"}
    return k8s.ApiClient(cfg)


def chart_quota(e2e: E2E, namespace: str, grants: dict[str, int]) -> dict[str, Any]:
    """The ResourceQuota the session's chart renders for ``tenants.namespaces``."""
    rendered = localinstall.helm(
        e2e.driver.control_plane.kubeconfig,
        "template", RELEASE, str(localinstall.CHART), "-n", RELEASE_NAMESPACE,
        "-f", str(e2e.driver.values_file),
        "--set-json", f"tenants.namespaces={json.dumps({namespace: grants})}",
        "--show-only", "templates/tenants.yaml",
    ).stdout  # fmt: skip
    (quota,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ResourceQuota"]
    return quota


@pytest.fixture
def tenant(e2e: E2E) -> Iterator[Tenant]:
    """The e2e namespace (granted: tenant label, Pod Security) as team ``tenant`` with the
    chart's quota: one gpu-eighth, every other class of the driver 0."""
    ns = e2e.namespace
    e2e.core.create_namespaced_service_account(ns, {"metadata": {"name": "tenant"}})
    binding = {
        "metadata": {"name": "tenant-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": ns}],
    }
    k8s.RbacAuthorizationV1Api(e2e.api).create_namespaced_role_binding(ns, binding)
    quota = chart_quota(e2e, ns, {"gpu-eighth": 1})
    assert quota["metadata"]["name"] == GRANT_QUOTA  # the grant's quota, now the chart's
    e2e.core.patch_namespaced_resource_quota(GRANT_QUOTA, ns, {"spec": quota["spec"]})
    wait_quota_enforced(e2e, GRANT_QUOTA, quota["spec"]["hard"])
    api = token_client(e2e, ns, "tenant")
    try:
        yield Tenant(e2e, ns, api)
    finally:
        api.close()


def eighth_claim(name: str, **extra: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu-eighth", **extra.pop("exactly", {})}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, **extra.pop("metadata", {})},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def on_vnode(
    node: VirtualNode, claims: dict[str, str] | None = None, **resources: Any
) -> dict[str, Any]:
    """A pod spec for ``node``: claims (pod claim -> claim or template, by ``kind:name``)."""
    refs = []
    for pod_claim, ref in (claims or {}).items():
        kind, _, target = ref.partition(":")
        key = "resourceClaimName" if kind == "claim" else "resourceClaimTemplateName"
        refs.append({"name": pod_claim, key: target})
    container: dict[str, Any] = {"name": "main", "command": ["sleep", "3600"]}
    container["resources"] = {"claims": [{"name": r["name"]} for r in refs], **resources}
    return {
        "nodeSelector": {"kubernetes.io/hostname": node.name},
        "tolerations": [{"key": VIRTUAL_TAINT, "operator": "Exists"}],
        "containers": [container],
        "resourceClaims": refs,
    }


def scheduled(tenant: Tenant, pod: str) -> bool:
    p = raw(
        k8s.CoreV1Api(tenant.e2e.api).read_namespaced_pod(
            pod, tenant.namespace, _preload_content=False
        )
    )
    return bool(p["spec"].get("nodeName"))


# --- tenants past their quota -------------------------------------------------------------


def test_an_annotation_does_not_skip_the_sizing(tenant: Tenant, vnodes: list[VirtualNode]) -> None:
    """Review item 1: ``resource.kubernetes.io/extended-resource-claim`` on a tenant's claim
    exempted it from the sizing policy; a gpu-eighth claim got the whole card."""
    node = VirtualNode(tenant.e2e, gpus=1)
    vnodes.append(node)
    body = eighth_claim(
        "annotated",
        metadata={"annotations": {ANNOTATION: "true"}},
        exactly={"capacity": {"requests": {"slots": "8"}}},
    )
    tenant.create_claim(body)
    spec = tenant.claim("annotated")["spec"]["devices"]["requests"][0]["exactly"]
    assert spec["capacity"] == {"requests": {"slots": "1"}}
    tenant.create_pod("annotated", on_vnode(node, {"gpu": "claim:annotated"}))
    wait_for("annotated pod scheduled", lambda: scheduled(tenant, "annotated"), timeout=60)
    claim = tenant.claim("annotated")
    (r,) = results(claim)
    assert r["consumedCapacity"] == {"slots": "1"}
    report(
        "gpu-eighth claim with the scheduler's annotation and slots: 8",
        "admitted, sized to slots 1 by the sizing policy",
        allocation_text(claim),
    )


def test_an_annotated_template_does_not_skip_the_sizing(
    tenant: Tenant, vnodes: list[VirtualNode]
) -> None:
    node = VirtualNode(tenant.e2e, gpus=1)
    vnodes.append(node)
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "annotated"},
        "spec": {
            "metadata": {"annotations": {ANNOTATION: "true"}},
            "spec": eighth_claim("x", exactly={"capacity": {"requests": {"slots": "4"}}})["spec"],
        },
    }
    tenant.create_template(template)
    tenant.create_pod("from-template", on_vnode(node, {"gpu": "template:annotated"}))
    wait_for("pod scheduled", lambda: scheduled(tenant, "from-template"), timeout=60)
    claim = tenant.pod_claim("from-template")
    assert claim["metadata"]["annotations"][ANNOTATION] == "true"  # kept, and harmless
    (r,) = results(claim)
    assert r["consumedCapacity"] == {"slots": "1"}
    report(
        "gpu-eighth template with the annotation in spec.metadata and slots: 4",
        "admitted; the controller's claim is sized to slots 1",
        allocation_text(claim),
    )


def test_classes_the_grant_does_not_name_are_refused(tenant: Tenant) -> None:
    """Review item 3: a quota names classes; classes it does not name were unlimited."""
    first_available = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "either"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "firstAvailable": [
                            {"name": "full", "deviceClassName": "gpu-full"},
                            {"name": "eighth", "deviceClassName": "gpu-eighth"},
                        ],
                    }
                ]
            }
        },
    }
    attempts: dict[str, dict[str, Any]] = {
        "gpu-full claim": {**eighth_claim("full"), "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu-full"}}]}}},
        "firstAvailable [gpu-full, gpu-eighth]": first_available,
        "gpu-memory claim without an amount": {**eighth_claim("mem"), "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu-memory"}}]}}},
    }  # fmt: skip
    for what, body in attempts.items():
        exc = refused(lambda b=body: tenant.create_claim(b))
        assert exc.status == 403 and "exceeded quota" in message(exc), message(exc)
        report(what, f"{exc.status}: {message(exc)}")
    tenant.create_claim(eighth_claim("one"))
    exc = refused(lambda: tenant.create_claim(eighth_claim("two")))
    assert exc.status == 403 and "exceeded quota" in message(exc)
    report("a second gpu-eighth (grant: 1)", f"{exc.status}: {message(exc)}")


def test_a_namespace_without_the_grant_gets_nothing(e2e: E2E) -> None:
    ns = f"e2e-nogrant-{short_id()}"
    e2e.core.create_namespace(k8s.V1Namespace.from_dict({"metadata": {"name": ns}}))
    try:
        exc = refused(
            lambda: e2e.res.create_namespaced_resource_claim(
                ns, k8s.ResourceV1ResourceClaim.from_dict(eighth_claim("c"))
            )
        )
        assert exc.status == 403
        assert f"namespace {ns} may not claim devices of {DRIVER}" in message(exc)
        assert f"{TENANT_LABEL}=true" in message(exc)
        report("gpu-eighth claim in a namespace without the tenant label", message(exc))
    finally:
        e2e.core.delete_namespace(ns)


QUOTA_KEY = ".deviceclass.resource.k8s.io/devices"
QUOTA_BINDING = f"{RELEASE}-gpu-fraction-dra-tenant-quota.requires.resourcequota.{GRANT_QUOTA}"
NO_PODSECURITY = "missing: the label pod-security.kubernetes.io/enforce=baseline or restricted"


@pytest.mark.parametrize(
    ("what", "labels", "quota", "expected"),
    [
        (
            "the tenant label and the grant's quota, no Pod Security",
            {TENANT_LABEL: "true"},
            (GRANT_QUOTA, None),
            f"{NO_PODSECURITY} (it is unset)",
        ),
        (
            "the tenant label, Pod Security privileged and the grant's quota",
            {TENANT_LABEL: "true", POD_SECURITY_LABEL: "privileged"},
            (GRANT_QUOTA, None),
            f"{NO_PODSECURITY} (it is privileged)",
        ),
        ("tenant label and Pod Security, no quota", GRANT_LABELS, None, QUOTA_BINDING),
        (
            "tenant label and Pod Security, a hand-written quota of one gpu-eighth",
            GRANT_LABELS,
            ("gpu", "gpu-eighth"),
            QUOTA_BINDING,
        ),
        (
            "tenant label and Pod Security, the grant's quota naming one gpu-eighth only",
            GRANT_LABELS,
            (GRANT_QUOTA, "gpu-eighth"),
            f"missing: gpu-eighth-sm-sharing{QUOTA_KEY}, gpu-quarter{QUOTA_KEY}",
        ),
    ],
)
def test_a_grant_missing_a_part_gets_nothing(
    e2e: E2E,
    device_classes: list[str],
    what: str,
    labels: dict[str, str],
    quota: tuple[str, str | None] | None,
    expected: str,
) -> None:
    """Review: the tenant label alone was a grant (a hostPath pod in such a namespace reached
    the MPS server's sockets), and the quota an admin writes first, one gpu-eighth, let
    gpu-full and gpu-memory claims in. The grant now checks itself; each refusal names what
    is missing."""
    ns = f"e2e-partgrant-{short_id()}"
    e2e.core.create_namespace(
        k8s.V1Namespace.from_dict({"metadata": {"name": ns, "labels": labels}})
    )
    try:
        if quota is not None:
            name, only = quota
            named = [only] if only else device_classes
            hard = {f"{c}{QUOTA_KEY}": "1" for c in named}
            body = {"metadata": {"name": name}, "spec": {"hard": hard}}
            e2e.core.create_namespaced_resource_quota(ns, k8s.V1ResourceQuota.from_dict(body))
        for cls in ("gpu-full", "gpu-memory", "gpu-eighth"):
            body = eighth_claim(f"c-{cls}", exactly={"deviceClassName": cls})
            exc = refused(
                lambda b=body: e2e.res.create_namespaced_resource_claim(
                    ns, k8s.ResourceV1ResourceClaim.from_dict(b)
                )
            )
            assert expected in message(exc), message(exc)
            # the API server's own refusal for a missing quota is Invalid, a policy's Forbidden
            assert exc.status == (422 if expected == QUOTA_BINDING else 403)
            report(f"{cls} claim; namespace with {what}", f"{exc.status}: {message(exc)}")
    finally:
        e2e.core.delete_namespace(ns)


def test_the_capacity_models_default_is_its_minimum(e2e: E2E, vnodes: list[VirtualNode]) -> None:
    """A gpu-memory claim without an amount got 143104Mi (the whole card)."""
    config = NodeConfig(defaults=GpuConfig(fraction_model="capacity"))
    node = VirtualNode(e2e, gpus=1, config=config)
    vnodes.append(node)
    node.pod("mem", "gpu-memory")
    wait_for("pod scheduled", lambda: node.scheduled("mem"), timeout=60)
    (r,) = results(e2e.claim_of("mem"))
    assert r["consumedCapacity"] == {"memory": "1Gi"}
    report(
        "gpu-memory claim without an amount (granted)",
        "admitted",
        allocation_text(e2e.claim_of("mem")),
    )


# --- extended resources -----------------------------------------------------------------------


def extended_pod(node: VirtualNode, resource: str) -> dict[str, Any]:
    return on_vnode(node, limits={resource: "1"}, requests={resource: "1"})


@pytest.mark.parametrize("product", list(SLOTS))
def test_an_extended_resource_pod_gets_exactly_its_product(
    e2e: E2E, vnodes: list[VirtualNode], product: str
) -> None:
    """With the chart value on (the session's), by the extended resource name and by the
    built-in alias of its class: exactly the product's slots, on the product's own device."""
    node = VirtualNode(e2e, gpus=2, config=NodeConfig(extended_resources=True))
    vnodes.append(node)
    tenant = Tenant(e2e, e2e.namespace, e2e.api)
    names = {
        "er": f"{DRIVER}/{product}",
        "alias": f"deviceclass.resource.kubernetes.io/gpu-{product}",
    }
    for pod, resource in names.items():
        tenant.create_pod(pod, extended_pod(node, resource))
    for pod, resource in names.items():
        wait_for(f"{pod} scheduled", lambda p=pod: scheduled(tenant, p), timeout=60)
        claim = tenant.pod_claim(pod)
        (r,) = results(claim)
        assert r["consumedCapacity"] == {"slots": str(SLOTS[product])}, r
        assert r["device"].endswith(f"-{product}"), r
        report(
            f"pod with resources.limits {resource}: 1 (extendedResources on)",
            "scheduled",
            allocation_text(claim),
        )


def test_an_extended_resource_pod_never_takes_a_default_share_of_a_shared_device(
    e2e: E2E, vnodes: list[VirtualNode]
) -> None:
    """With extended resources on, a shared device's default is the largest size: a GPU whose
    shared device holds a quarter cannot give a scheduler-made claim any other size there."""
    node = VirtualNode(e2e, gpus=1, config=NodeConfig(extended_resources=True))
    vnodes.append(node)
    node.pod("user-quarter", "gpu-quarter")
    wait_for("quarter scheduled", lambda: node.scheduled("user-quarter"), timeout=60)
    tenant = Tenant(e2e, e2e.namespace, e2e.api)
    tenant.create_pod("er", extended_pod(node, f"{DRIVER}/quarter"))
    condition = wait_for("er unschedulable", lambda: unschedulable(e2e, "er"), timeout=60)
    report(
        "extended-resource quarter on a GPU whose shared device holds a quarter",
        f"Pending: {condition.get('message', '')}",
        "not allocated",
    )


@contextlib.contextmanager
def extended_resources_off(e2e: E2E) -> Iterator[None]:
    """The sizing guard as the chart renders it with ``extendedResources.enabled=false`` (no
    class has an extended resource name), put back afterwards."""
    vaps = k8s.AdmissionregistrationV1Api(e2e.api)
    session = raw(vaps.read_validating_admission_policy(SIZES_POLICY, _preload_content=False))
    off = next(o for o in sizing_policies() if o["kind"] == "ValidatingAdmissionPolicy")

    def swap(spec: dict[str, Any], admitted: bool) -> None:
        current = raw(vaps.read_validating_admission_policy(SIZES_POLICY, _preload_content=False))
        current["spec"] = spec
        vaps.replace_validating_admission_policy(SIZES_POLICY, current)
        # in effect once the API server's informer has it: probe as the scheduler
        probe = eighth_claim(f"probe-{short_id()}")
        as_scheduler = k8s.ApiClient(e2e.api.configuration)
        as_scheduler.set_default_header("Impersonate-User", SCHEDULER_USER)

        def effective() -> bool:
            try:
                k8s.ResourceV1Api(as_scheduler).create_namespaced_resource_claim(
                    e2e.namespace, k8s.ResourceV1ResourceClaim.from_dict(probe), dry_run="All"
                )
            except ApiException as exc:
                return not admitted and SIZES_POLICY in message(exc)
            return admitted

        wait_for("the sizing guard in effect", effective, timeout=30)

    swap(off["spec"], admitted=False)
    try:
        yield
    finally:
        swap(session["spec"], admitted=True)


def test_without_extended_resources_an_alias_pod_is_refused(
    e2e: E2E, vnodes: list[VirtualNode]
) -> None:
    """Review item 2: the built-in alias ``deviceclass.resource.kubernetes.io/gpu-eighth``
    gave a whole card although the chart's extendedResources was false."""
    node = VirtualNode(e2e, gpus=1)
    vnodes.append(node)
    tenant = Tenant(e2e, e2e.namespace, e2e.api)
    with extended_resources_off(e2e):
        tenant.create_pod(
            "alias", extended_pod(node, "deviceclass.resource.kubernetes.io/gpu-eighth")
        )

        def refusal() -> str | None:
            texts = [str(e.get("message", "")) for e in e2e.events("alias")]
            texts += [
                str(c.get("message", ""))
                for c in e2e.read_pod("alias")["status"].get("conditions") or []
            ]
            return next((t for t in texts if "extended resources are not enabled" in t), None)

        text = wait_for("the scheduler's claim refused", refusal, timeout=60)
        assert not scheduled(tenant, "alias")
        claims = raw(e2e.res.list_namespaced_resource_claim(e2e.namespace, _preload_content=False))
        assert claims["items"] == []
    report(
        "pod with resources.limits deviceclass.resource.kubernetes.io/gpu-eighth: 1 "
        "(extendedResources off)",
        f"Pending; the scheduler's claim refused: {text}",
        "not allocated",
    )


# --- caps -------------------------------------------------------------------------------------


def prepare_refusal(e2e: E2E, pod: str) -> str:
    def event() -> str | None:
        for e in e2e.events(pod):
            if e["reason"] == FAILED_PREPARE:
                return str(e["message"])
        return None

    return wait_for(f"{FAILED_PREPARE} on {pod}", event, timeout=60)


def test_caps_refuse_a_ceiling_or_sm_share_above_the_class(e2e: E2E) -> None:
    """Review item 4: an eighth with memoryLimitPortion "1" got a 143131Mi ceiling; an
    sm-sharing eighth with activeThreadPercentage 100 was accepted. (The session's chart warns
    at admission, so that the plugin's refusal is seen too; the plain manifests refuse at
    admission: test_e2e_install.)"""
    node = e2e.nodes[0]
    gpu_ts, gpu_sm = TIME_SLICING_GPUS[0], SM_SHARING_PRODUCT_GPUS[0]
    cases = {
        "burst": ("gpu-eighth", {"memoryLimitPortion": "1"}, gpu_ts, "no burst without a cap"),
        "threads": (
            "gpu-eighth-sm-sharing",
            {"activeThreadPercentage": 100},
            gpu_sm,
            f"exceeds the cap {CLASS_LIMITS['gpu-eighth-sm-sharing']['maxActiveThreadPercentage']}",
        ),
    }
    for name, (cls, params, gpu, _) in cases.items():
        e2e.template(name, cls, parameters=params, selectors=[ON_GPU.format(gpu)])
        e2e.pod(name, node, templates={"gpu": name})
    for name, (cls, params, _, text) in cases.items():
        got = prepare_refusal(e2e, name)
        assert text in got, got
        report(
            f"{cls} with {params}", f"plugin at Prepare: {got}", allocation_text(e2e.claim_of(name))
        )


# --- a node faking another node's devices ----------------------------------------------------


def test_a_plugin_token_may_not_write_into_another_nodes_pool(e2e: E2E) -> None:
    """Review item 5: with a token bound to the plugin pod of node C, a slice with nodeName C
    in pool B was admitted and took B's shares."""
    own, other = e2e.nodes[1].name, e2e.nodes[0].name
    (pod,) = e2e.driver.plugin_pods(own)
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "boundObjectRef": {
                "apiVersion": "v1", "kind": "Pod",
                "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"],
            },
            "expirationSeconds": 600,
        },
    }  # fmt: skip
    sa = pod["spec"]["serviceAccountName"]
    token = e2e.core.create_namespaced_service_account_token(sa, RELEASE_NAMESPACE, request)
    cfg = k8s.Configuration()
    cfg.host, cfg.ssl_ca_cert = e2e.api.configuration.host, e2e.api.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token.status.token}"}
    plugin = k8s.CustomObjectsApi(k8s.ApiClient(cfg))
    decoy = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"decoy-{short_id()}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": own,
            "pool": {"name": other, "generation": 99, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0-time-slicing"}],
        },
    }
    exc = refused(
        lambda: plugin.create_cluster_custom_object(
            "resource.k8s.io", "v1", "resourceslices", decoy
        )
    )
    assert exc.status == 403, message(exc)
    assert f"may only create ResourceSlices in its own pool {own}, not {other}" in message(exc)
    report(f"plugin token of {own}: slice nodeName {own} in pool {other}", message(exc))


# --- tenants and the node ---------------------------------------------------------------------


def test_a_root_container_on_an_mps_gpu_is_flagged_in_the_claim_status(e2e: E2E) -> None:
    """Review item 6: a tenant container ran as UID 0 with its MPS pipe directory mounted."""
    node = e2e.nodes[0]
    gpu = TIME_SLICING_GPUS[1]
    e2e.template("root", "gpu-eighth", selectors=[ON_GPU.format(gpu)])
    e2e.template("user", "gpu-eighth", selectors=[ON_GPU.format(gpu)])
    e2e.pod("root", node, templates={"gpu": "root"})  # busybox runs as root by default
    e2e.create_pod(
        "user",
        {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000},
            "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "user"}],
        },
    )
    for pod in ("root", "user"):
        e2e.wait_running(pod)

    def conditions(pod: str) -> list[dict[str, Any]]:
        devices = (e2e.claim_of(pod).get("status") or {}).get("devices") or []
        return [c for d in devices for c in d.get("conditions") or []]

    root = wait_for(
        "NonRootClients=False on the root pod's claim",
        lambda: next((c for c in conditions("root") if c["type"] == "NonRootClients"), None),
        timeout=60,
    )
    assert root["status"] == "False" and root["reason"] == "ContainerRunsAsRoot"
    # the non-root pod's claim was checked in the same pass: written, and no such condition
    assert [c["type"] for c in conditions("user")] == ["FractionEnforced"]
    report(
        "pod running as UID 0 on an MPS GPU",
        f"claim status: {root['message']}",
        allocation_text(e2e.claim_of("root")),
    )


def test_the_plugin_mounts_no_host_root(e2e: E2E) -> None:
    """Review item 7: the host's / was mounted at /host (every pod's token, the kubelet's
    credentials)."""
    (pod,) = e2e.driver.plugin_pods(e2e.nodes[0].name)
    paths = {v["hostPath"]["path"] for v in pod["spec"]["volumes"] if "hostPath" in v}
    assert "/" not in paths
    report("what the plugin pod mounts from the host", ", ".join(sorted(paths)))


def test_admin_access_is_monitoring_access_and_not_counted(
    e2e: E2E, device_classes: list[str]
) -> None:
    """Review item 9: an adminAccess claim was prepared as an ordinary fraction the scheduler
    does not count; the next full-card claim on that GPU then failed Prepare."""
    ns = f"e2e-admin-{short_id()}"
    grant(e2e.core, ns, device_classes, {"resource.kubernetes.io/admin-access": "true"})
    admin_env = E2E(e2e.api, ns, e2e.test_name, e2e.driver)
    try:
        wait_for(
            "default ServiceAccount",
            lambda: e2e.core.read_namespaced_service_account("default", ns),
        )
        node = e2e.nodes[1]
        gpu = TIME_SLICING_GPUS[2]
        spec = {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu-full", "adminAccess": True,
            "selectors": [{"cel": {"expression": ON_GPU.format(gpu)}}]}}]}}  # fmt: skip
        admin_env.res.create_namespaced_resource_claim_template(
            ns,
            k8s.V1ResourceClaimTemplate.from_dict(
                {"metadata": {"name": "monitor"}, "spec": {"spec": spec}}
            ),
        )
        admin_env.pod("monitor", node, templates={"gpu": "monitor"})
        admin_env.wait_running("monitor")
        view = admin_env.view("monitor")
        assert view.env.get("GPU_FRACTION_ADMIN_ACCESS") == "true"
        assert "CUDA_MPS_PIPE_DIRECTORY" not in view.env and not view.mounts
        # a whole card on the same GPU is still prepared: the admin share is not counted
        e2e.template("full", "gpu-full", selectors=[ON_GPU.format(gpu)])
        e2e.pod("full", node, templates={"gpu": "full"})
        e2e.wait_running("full")
        report(
            "adminAccess gpu-full next to an ordinary gpu-full on one GPU",
            "both prepared; admin access has device nodes only (no MPS, no memory)",
            allocation_text(admin_env.claim_of("monitor")),
        )
    finally:
        admin_env.cleanup()
