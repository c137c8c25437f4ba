"""The tenant grant checks itself, on a real API server (hack/local-cluster, no node needed):
the chart's tenant policies, as the plain install ships them
(``manifests/policy-tenant-namespaces.yaml``, the chart's default rendering), admit a claim of
this driver's classes only in a namespace with the tenant label, Pod Security ``baseline`` or
``restricted`` enforced and the ResourceQuota that lists every class of the driver; each
refusal names what is missing. The namespaces are set up the way an admin writes a grant first
(the label alone, a quota of one class). Each attempt is printed with the API server's answer
(``GRANT | namespace | claim | answer``)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import dynamic
from kubernetes.client.exceptions import ApiException

from dra_driver import DEFAULT_DRIVER_NAME as DRIVER
from tests.support.nodeless import local_cluster
from tests.support.paths import REPO
from tests.support.waiting import wait_for

POLICIES = REPO / "manifests" / "policy-tenant-namespaces.yaml"
TEAM_A = REPO / "manifests" / "tenants" / "team-a.yaml"
TENANT_LABEL = f"{DRIVER}/tenant"
ENFORCE = "pod-security.kubernetes.io/enforce"
QUOTA_KEY = ".deviceclass.resource.k8s.io/devices"
QUOTA = "gpu-fraction-dra-gpu-fractions"
QUOTA_BINDING = f"gpu-fraction-dra-tenant-quota.requires.resourcequota.{QUOTA}"
NOT_FOUND = "no params found for policy binding with `Deny` parameterNotFoundAction"
MISSING_LABEL = f"the label {TENANT_LABEL}=true"
MISSING_PSA = f"the label {ENFORCE}=baseline or restricted"


def chart_quota() -> dict[str, Any]:
    """The ResourceQuota of ``manifests/tenants/team-a.yaml`` (every class, 0 unless granted)."""
    (quota,) = [d for d in yaml.safe_load_all(TEAM_A.read_text()) if d["kind"] == "ResourceQuota"]
    assert quota["metadata"]["name"] == QUOTA
    return dict(quota["spec"])


CLASSES = [key.removesuffix(QUOTA_KEY) for key in chart_quota()["hard"]]


def claim(name: str, *classes: str) -> dict[str, Any]:
    """A ResourceClaim with one request: ``exactly`` one class, or ``firstAvailable`` of
    several."""
    if len(classes) == 1:
        request: dict[str, Any] = {"name": "gpu", "exactly": {"deviceClassName": classes[0]}}
    else:
        subs = [{"name": f"s{i}", "deviceClassName": c} for i, c in enumerate(classes)]
        request = {"name": "gpu", "firstAvailable": subs}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }


def template(name: str, device_class: str) -> dict[str, Any]:
    body = claim(name, device_class)
    return {**body, "kind": "ResourceClaimTemplate", "spec": {"spec": body["spec"]}}


class Cluster:
    """The control plane with the tenant policies installed; namespaces made as an admin."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self.api = api
        self.dc = dynamic.DynamicClient(api)
        self.core = k8s.CoreV1Api(api)
        self._n = 0

    def create(self, obj: dict[str, Any], namespace: str | None = None) -> None:
        kind = self.dc.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        kind.create(body=obj, namespace=namespace)

    def namespace(
        self,
        labels: dict[str, str],
        quota: dict[str, Any] | None = None,
        quota_name: str = QUOTA,
    ) -> str:
        """A new namespace with ``labels`` and, when given, the ResourceQuota ``quota_name``
        with spec ``quota``."""
        self._n += 1
        name = f"grant-{self._n}"
        self.core.create_namespace({"metadata": {"name": name, "labels": labels}})
        if quota is not None:
            self.core.create_namespaced_resource_quota(
                name, {"metadata": {"name": quota_name}, "spec": quota}
            )
        return name

    def attempt(self, namespace: str, obj: dict[str, Any]) -> str | None:
        """Create ``obj`` in ``namespace``: None when admitted, else the API server's message.
        Prints the attempt as a ``GRANT`` line."""
        try:
            self.create(obj, namespace)
        except ApiException as exc:
            answer: str | None = str(json.loads(exc.body)["message"])
            # a policy's refusal is Forbidden; the API server's own, for a missing quota,
            # Invalid (a binding's configuration error has no reason of its own)
            assert exc.status == (422 if NOT_FOUND in str(answer) else 403), exc.body
        else:
            answer = None
        labels = self.core.read_namespace(namespace).metadata.labels or {}
        shown = {k: v for k, v in labels.items() if k in (TENANT_LABEL, ENFORCE)}
        quotas = {
            q.metadata.name: f"{len(q.spec.hard or {})} classes"
            + (", scoped" if q.spec.scope_selector or q.spec.scopes else "")
            for q in self.core.list_namespaced_resource_quota(namespace).items
        }
        print(
            f"\nGRANT | labels {json.dumps(shown)}, quotas {json.dumps(quotas)} "
            f"| {obj['kind']} {json.dumps(obj['spec'])} | {answer or 'admitted'}"
        )
        return answer


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    state = Path(tempfile.mkdtemp(prefix="tenant-grant-"))
    up = local_cluster(state, "up")
    try:
        if up.returncode != 0:
            pytest.fail(f"hack/local-cluster up failed:\n{up.stderr[-3000:]}")
        api = k8s_config.new_client_from_config(config_file=str(state / "kubeconfig"))
        c = Cluster(api)
        for obj in yaml.safe_load_all(POLICIES.read_text()):
            c.create(obj)
        # in effect once the API server's policy informer has them
        bare = c.namespace({})
        labelled = c.namespace({TENANT_LABEL: "true", ENFORCE: "restricted"})
        probe = claim("probe", "gpu-eighth")

        def refused(namespace: str, policy: str) -> bool:
            try:
                c.create(probe, namespace)
            except ApiException as exc:
                return policy in str(exc.body)
            c.dc.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim").delete(
                name="probe", namespace=namespace
            )
            return False

        wait_for("tenant-namespaces policy", lambda: refused(bare, "tenant-namespaces"), 60)
        wait_for("tenant-quota policy", lambda: refused(labelled, "tenant-quota"), 60)
        vaps = c.dc.resources.get(
            api_version="admissionregistration.k8s.io/v1", kind="ValidatingAdmissionPolicy"
        )
        for name in ("gpu-fraction-dra-tenant-namespaces", "gpu-fraction-dra-tenant-quota"):
            # the API server type-checked every expression (against ResourceQuota for params)
            status = wait_for(f"{name} type checked", lambda n=name: vaps.get(name=n).status, 30)
            assert not (status.get("typeChecking") or {}).get("expressionWarnings"), status
        yield c
        api.close()
    finally:
        local_cluster(state, "down")
        shutil.rmtree(state, ignore_errors=True)


def every_class(value: str = "1") -> dict[str, Any]:
    return {"hard": {f"{c}{QUOTA_KEY}": value for c in CLASSES}}


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_a_namespace_granted_in_full_admits_claims_and_templates(
    cluster: Cluster, level: str
) -> None:
    ns = cluster.namespace({TENANT_LABEL: "true", ENFORCE: level}, chart_quota())
    assert cluster.attempt(ns, claim("eighth", "gpu-eighth")) is None
    assert cluster.attempt(ns, claim("either", "gpu-quarter-sm-sharing", "gpu-eighth")) is None
    assert cluster.attempt(ns, template("quarter", "gpu-quarter-sm-sharing")) is None


def test_without_the_tenant_label_everything_missing_is_named(cluster: Cluster) -> None:
    ns = cluster.namespace({}, every_class())
    answer = cluster.attempt(ns, claim("c", "gpu-eighth"))
    assert answer is not None and f"namespace {ns} may not claim devices of {DRIVER}" in answer
    assert f"missing: {MISSING_LABEL}, {MISSING_PSA} (it is unset)" in answer


@pytest.mark.parametrize(
    ("enforce", "shown"),
    [(None, "unset"), ("privileged", "privileged")],
)
def test_a_labelled_namespace_without_pod_security_gets_nothing(
    cluster: Cluster, enforce: str | None, shown: str
) -> None:
    """Review: the label alone was a grant; a hostPath pod in such a namespace reached the
    MPS server's sockets. Only the admin's Pod Security label makes it one."""
    labels = {TENANT_LABEL: "true"} | ({} if enforce is None else {ENFORCE: enforce})
    ns = cluster.namespace(labels, every_class())
    for obj in (claim("c", "gpu-eighth"), template("t", "gpu-eighth")):
        answer = cluster.attempt(ns, obj)
        assert answer is not None and "tenant-namespaces" in answer
        assert answer.endswith(f"missing: {MISSING_PSA} (it is {shown})"), answer


@pytest.mark.parametrize("quota_name", [None, "gpu"])
def test_without_the_grants_quota_a_labelled_namespace_gets_nothing(
    cluster: Cluster, quota_name: str | None
) -> None:
    """No quota, or the quota an admin writes first (one class, a name of their own): the
    classes it does not name would be unlimited. The API server's refusal names the quota in
    the binding's name."""
    labels = {TENANT_LABEL: "true", ENFORCE: "restricted"}
    if quota_name is None:
        ns = cluster.namespace(labels)
    else:
        ns = cluster.namespace(labels, {"hard": {f"gpu-eighth{QUOTA_KEY}": "1"}}, quota_name)
    for obj in (claim("c", "gpu-full"), claim("e", "gpu-eighth"), template("t", "gpu-memory")):
        answer = cluster.attempt(ns, obj)
        assert answer is not None
        assert f"binding '{QUOTA_BINDING}'" in answer and NOT_FOUND in answer, answer


def test_a_grants_quota_that_names_one_class_is_refused_naming_the_others(
    cluster: Cluster,
) -> None:
    labels = {TENANT_LABEL: "true", ENFORCE: "baseline"}
    ns = cluster.namespace(labels, {"hard": {f"gpu-eighth{QUOTA_KEY}": "1"}})
    for obj in (claim("full", "gpu-full"), claim("e", "gpu-eighth"), claim("m", "gpu-memory")):
        answer = cluster.attempt(ns, obj)
        assert answer is not None and f"its ResourceQuota {QUOTA} must list every" in answer
        named = answer.rpartition("missing: ")[2].split(", ")
        assert named == [f"{c}{QUOTA_KEY}" for c in CLASSES if c != "gpu-eighth"], answer


def test_a_grants_quota_with_scopes_is_refused(cluster: Cluster) -> None:
    """A scoped quota counts only what its scopes select; claims are not among them."""
    scoped = every_class() | {
        "scopeSelector": {
            "matchExpressions": [
                {"scopeName": "PriorityClass", "operator": "In", "values": ["gpu"]}
            ]
        }
    }
    ns = cluster.namespace({TENANT_LABEL: "true", ENFORCE: "restricted"}, scoped)
    answer = cluster.attempt(ns, claim("c", "gpu-eighth"))
    assert answer is not None and answer.endswith("; it has scopes"), answer


def test_claims_of_other_drivers_outside_granted_namespaces_are_untouched(
    cluster: Cluster,
) -> None:
    ns = cluster.namespace({})
    assert cluster.attempt(ns, claim("other", "other-driver-class")) is None
    # Documented: the API server looks the quota up before the policy's matchConditions,
    # so a labelled namespace without its quota refuses every claim.
    labelled = cluster.namespace({TENANT_LABEL: "true", ENFORCE: "restricted"})
    answer = cluster.attempt(labelled, claim("other", "other-driver-class"))
    assert answer is not None and NOT_FOUND in answer
