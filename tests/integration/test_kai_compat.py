"""Pods written for the KAI scheduler's fractions, on a real API server (hack/local-cluster, no
node needed; the chart installed by helm with ``kaiCompat.enabled``): each annotation
combination either gets, from the resourceclaim controller, the claim a user would write by
hand (class, count, capacity, ceiling, constraints, on the named container), or is refused at
admission with a message that names the annotation and what to write. Quota and tenant grants
hold for the translated claims. Each case is printed (``KAI | annotations | result``): the
table of docs/coming-from-kai.md."""

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
from kubernetes.client.exceptions import ApiException

from devtools import localinstall
from dra_driver import DEFAULT_DRIVER_NAME as DRIVER
from tests.support.nodeless import local_cluster
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

NS = "kai-team"
QUOTA_NS = "kai-small"
NO_TEMPLATE_NS = "kai-elsewhere"
RELEASE = "gfd"
TENANT_LABEL = f"{DRIVER}/tenant"
GRANT = {"gpu-half": 4, "gpu-quarter": 4, "gpu-eighth-sm-sharing": 4, "gpu-memory": 8}
GRANT["gpu-memory-sm-sharing"] = 8
VALUES: dict[str, Any] = {
    "kaiCompat": {"enabled": True, "namespaces": [NS, QUOTA_NS]},
    "tenants": {
        "namespaces": {NS: GRANT, QUOTA_NS: {"gpu-half": 1}, NO_TEMPLATE_NS: GRANT},
        "createNamespaces": True,
        "podSecurity": "baseline",
    },
    # The burst NVIDIA's examples ask for (a limit above the request), allowed by an admin.
    "classLimits": {
        "gpu-half": {"maxMemoryLimitPortion": "0.8"},
        "gpu-memory-sm-sharing": {"maxMemoryLimitPortion": "1"},
    },
}
POLICY = f"{RELEASE}-gpu-fraction-dra-kai-pods"


def pod(
    name: str, annotations: dict[str, str], containers: tuple[str, ...] = ("main",), **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "containers": [{"name": c, "image": "busybox"} for c in containers],
            **spec,
        },
    }


class Cluster:
    def __init__(self, api: k8s.ApiClient) -> None:
        self.core = k8s.CoreV1Api(api)
        self.res = k8s.ResourceV1Api(api)
        self._n = 0

    def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | str:
        """Create the pod: its stored form, or the API server's refusal."""
        try:
            got = self.core.create_namespaced_pod(namespace, body, _preload_content=False)
        except ApiException as exc:
            return str(json.loads(exc.body)["message"])
        stored: dict[str, Any] = json.loads(got.data)
        return stored

    def claim_of(self, namespace: str, pod_name: str) -> dict[str, Any]:
        """The claim the resourceclaim controller made for the pod (waits for it)."""

        def made() -> dict[str, Any] | None:
            items = json.loads(
                self.res.list_namespaced_resource_claim(namespace, _preload_content=False).data
            )["items"]
            for c in items:
                owners = c["metadata"].get("ownerReferences") or []
                if any(o["name"] == pod_name for o in owners):
                    return dict(c)
            return None

        return wait_for(f"the claim of {namespace}/{pod_name}", made, timeout=30)

    def events(self, namespace: str, pod_name: str, reason: str) -> list[str]:
        items = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={pod_name},reason={reason}"
        ).items
        return [e.message for e in items]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    state = Path(tempfile.mkdtemp(prefix="kai-compat-"))
    # not in the cluster's state directory: hack/local-cluster down refuses a directory with
    # files of others in it, and the control plane then outlived the test
    values = Path(tempfile.mkdtemp(prefix="kai-values-")) / "values.yaml"
    up = local_cluster(state, "up")
    try:
        if up.returncode != 0:
            pytest.fail(f"hack/local-cluster up failed:\n{up.stderr[-3000:]}")
        values.write_text(yaml.safe_dump(VALUES))
        try:
            localinstall.install(state / "kubeconfig", RELEASE, "gpu-fraction", values)
        except RuntimeError as exc:
            pytest.fail(str(exc))
        api = k8s_config.new_client_from_config(config_file=str(state / "kubeconfig"))
        c = Cluster(api)
        probe = pod("probe", {"gpu-fraction": "0.125"})
        wrong = pod("probe-refused", {"gpu-fraction": "0.3"})

        def in_effect() -> bool:
            """Both policies: the mutating one translates a good pod and the validating one
            refuses a bad one (each API server informer picks its policy up on its own; with
            only the first checked, a loaded machine admitted the first refused pods)."""
            answer = c.create(NS, probe)
            if isinstance(answer, str):
                return False  # the validating policy in effect before the mutating one
            c.core.delete_namespaced_pod("probe", NS, grace_period_seconds=0)
            if not answer["spec"].get("resourceClaims"):
                return False
            refused = c.create(NS, wrong)
            if not isinstance(refused, str):
                c.core.delete_namespaced_pod("probe-refused", NS, grace_period_seconds=0)
                return False
            return True

        # in effect once the API server's policy informers have them
        wait_for("the KAI pod policies", in_effect, timeout=60)
        yield c
        api.close()
    finally:
        down = local_cluster(state, "down")
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(values.parent, ignore_errors=True)
        assert down.returncode == 0, down.stderr[-2000:]


def summary(claim: dict[str, Any]) -> dict[str, Any]:
    """What a translated claim gives: class, GPUs, request, ceiling, constraints."""
    (request,) = claim["spec"]["devices"]["requests"]
    exactly = request["exactly"]
    params = [c["opaque"]["parameters"] for c in claim["spec"]["devices"].get("config") or []]
    limit = {k: v for p in params for k, v in p.items() if k.startswith("memoryLimit")}
    return {
        "class": exactly["deviceClassName"],
        "count": exactly["count"],
        "capacity": exactly.get("capacity", {}).get("requests"),
        "limit": limit,
        "constraints": sorted(
            c.get("distinctAttribute") or "=" + c["matchAttribute"]
            for c in claim["spec"]["devices"].get("constraints") or []
        ),
    }


def show(annotations: dict[str, str], result: Any) -> None:
    print(f"\nKAI | {json.dumps(annotations)} | {json.dumps(result)}")


MULTI = sorted([f"{DRIVER}/uuid", f"={DRIVER}/memoryEnforcement"])

TRANSLATED = [
    pytest.param(
        # NVIDIA's inference example: 40Gi guaranteed, 60Gi ceiling, sm-sharing, 4 GPUs
        {
            "nvidia.com/container.server.gpu-memory.request": "40Gi",
            "nvidia.com/container.server.gpu-memory.limit": "60Gi",
            "nvidia.com/container.server.gpu-compute.mode": "sm-sharing",
            "gpu-fraction-num-devices": "4",
        },
        ("server", "sidecar"),
        {
            "class": "gpu-memory-sm-sharing",
            "count": 4,
            "capacity": {"memory": "40Gi"},
            "limit": {"memoryLimit": "60Gi"},
            "constraints": MULTI,
        },
        id="nvfractions-inference-4-gpus",
    ),
    pytest.param(
        # NVIDIA's job example: half a card, ceiling 0.8, 2 GPUs
        {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.8", "gpu-fraction-num-devices": "2"},
        ("train",),
        {
            "class": "gpu-half",
            "count": 2,
            "capacity": {"slots": "4"},
            "limit": {"memoryLimitPortion": "0.8"},
            "constraints": sorted([*MULTI, f"={DRIVER}/gpuMemory"]),
        },
        id="gpu-fraction-job-2-gpus",
    ),
    pytest.param(
        {"gpu-fraction": "0.25"},
        ("main", "logger"),
        {
            "class": "gpu-quarter",
            "count": 1,
            "capacity": {"slots": "2"},
            "limit": {},
            "constraints": [],
        },
        id="gpu-fraction-first-container",
    ),
    pytest.param(
        {
            "gpu-fraction": "0.125",
            "gpu-fraction-container-name": "worker",
            "nvidia.com/container.worker.gpu-compute.mode": "sm-sharing",
        },
        ("main", "worker"),
        {
            "class": "gpu-eighth-sm-sharing",
            "count": 1,
            "capacity": {"slots": "1"},
            "limit": {},
            "constraints": [],
        },
        id="gpu-fraction-named-container-sm-sharing",
    ),
    pytest.param(
        {"gpu-fraction": "0.5", "kai.scheduler/container.main.gpu-memory.portion.limit": "0.75"},
        ("main",),
        {
            "class": "gpu-half",
            "count": 1,
            "capacity": {"slots": "4"},
            "limit": {"memoryLimitPortion": "0.75"},
            "constraints": [],
        },
        id="kai-portion-limit",
    ),
    pytest.param(
        {"gpu-memory": "20480"},
        ("main",),
        {
            "class": "gpu-memory",
            "count": 1,
            "capacity": {"memory": "20Gi"},
            "limit": {},
            "constraints": [],
        },
        id="gpu-memory-mib",
    ),
    pytest.param(
        {
            "nvidia.com/container.main.gpu-memory.request": "1536Mi",
            "nvidia.com/container.main.gpu-memory.limit": "1536Mi",
        },
        ("main",),
        {
            "class": "gpu-memory",
            "count": 1,
            "capacity": {"memory": "1536Mi"},
            "limit": {"memoryLimit": "1536Mi"},
            "constraints": [],
        },
        id="nvfractions-limit-equal-to-request",
    ),
    pytest.param(
        {"nvidia.com/container.main.gpu-memory.request": "1.5Gi"},
        ("main",),
        {
            "class": "gpu-memory",
            "count": 1,
            "capacity": {"memory": "1536Mi"},
            "limit": {},
            "constraints": [],
        },
        id="nvfractions-decimal-quantity",
    ),
]


@pytest.mark.parametrize(("annotations", "containers", "expected"), TRANSLATED)
def test_annotated_pod_gets_the_claim_a_user_would_write(
    cluster: Cluster,
    annotations: dict[str, str],
    containers: tuple[str, ...],
    expected: dict[str, Any],
    request: pytest.FixtureRequest,
) -> None:
    name = request.node.callspec.id
    # a claim of the user's own named like a translated one does not stop the translation
    own = {"name": "kai-cache", "resourceClaimName": "cache"}
    body = pod(name, annotations, containers, schedulerName="kai-scheduler", resourceClaims=[own])
    stored = cluster.create(NS, body)
    assert isinstance(stored, dict), stored
    spec = stored["spec"]
    mine, ref = spec["resourceClaims"]
    assert mine == own
    assert ref["resourceClaimTemplateName"] == "gpu-fraction-kai"
    target = annotations.get("gpu-fraction-container-name") or (
        containers[0] if "server" not in containers else "server"
    )
    # only the named container uses the claim; KAI's scheduler name is replaced
    uses = {c["name"]: c.get("resources", {}).get("claims") for c in spec["containers"]}
    assert uses == {c: ([{"name": ref["name"]}] if c == target else None) for c in containers}
    assert spec["schedulerName"] == "default-scheduler"
    got = summary(cluster.claim_of(NS, name))
    show(annotations, {"container": target, **got})
    assert got == expected


REFUSED = [
    pytest.param(
        {"gpu-fraction": "0.3"},
        "gpu-fraction 0.3 is no product of this cluster; "
        "write the portion of one of eighth (1/8), quarter (1/4), half (1/2), full (1)",
        id="portion-no-product",
    ),
    pytest.param(
        {
            "nvidia.com/container.main.gpu-memory.request": "40Gi",
            "nvidia.com/container.main.gpu-memory.limit": "20Gi",
        },
        "nvidia.com/container.main.gpu-memory.limit 20Gi is below "
        "nvidia.com/container.main.gpu-memory.request 40Gi",
        id="limit-below-request",
    ),
    pytest.param(
        {
            "nvidia.com/container.main.gpu-memory.request": "4Gi",
            "nvidia.com/container.main.gpu-memory.limit": "8Gi",
        },
        "DeviceClass gpu-memory allows no memory above the request",
        id="burst-not-allowed-by-class",
    ),
    pytest.param(
        {"gpu-fraction": "0.25", "gpu-fraction.limit": "0.5"},
        "gpu-fraction.limit 0.5 exceeds what DeviceClass gpu-quarter allows (0.25 of a card",
        id="portion-limit-above-class-cap",
    ),
    pytest.param(
        {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.5"},
        "gpu-fraction.limit 0.5 must be greater than gpu-fraction 0.5",
        id="portion-limit-not-above",
    ),
    pytest.param(
        {"nvidia.com/container.sidecar.gpu-memory.request": "4Gi"},
        "container sidecar (named by nvidia.com/container.sidecar.gpu-memory.request) is not "
        "a container of this pod",
        id="unknown-container",
    ),
    pytest.param(
        {
            "nvidia.com/container.main.gpu-memory.request": "4Gi",
            "nvidia.com/container.other.gpu-memory.request": "4Gi",
        },
        # which of the two is named first depends on the annotations' order
        "one container of a pod takes a fraction through annotations",
        id="two-containers",
    ),
    pytest.param(
        {"gpu-fraction": "0.5", "gpu-memory": "2048"},
        "both ask for a share of a GPU: keep one",
        id="fraction-and-memory",
    ),
    pytest.param(
        {"nvidia.com/container.main.gpu-compute.mode": "sm-sharing"},
        "ask for no GPU memory: add nvidia.com/container.main.gpu-memory.request",
        id="mode-only",
    ),
    pytest.param(
        {
            "nvidia.com/container.main.gpu-memory.request": "4Gi",
            "nvidia.com/container.main.gpu-compute.mode": "mps",
        },
        "gpu-compute.mode mps must be time-slicing or sm-sharing",
        id="bad-mode",
    ),
    pytest.param(
        {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "zero"},
        "gpu-fraction-num-devices zero must be a whole number from 1 to 64",
        id="bad-count",
    ),
    pytest.param(
        {"gpu-memory": "2Gi"},
        "gpu-memory 2Gi must be a whole number of MiB",
        id="gpu-memory-not-mib",
    ),
    pytest.param(
        {"nvidia.com/container.main.gpu-memory.request": "1.5"},
        "gpu-memory.request 1.5 must be a Kubernetes quantity of whole bytes",
        id="request-not-whole-bytes",
    ),
    pytest.param(
        {
            "nvidia.com/container.main.gpu-memory.request": "4Gi",
            "nvidia.com/container.main.gpus.devices": "GPU-1234",
        },
        "gpus.devices is written by KAI's binder",
        id="binder-devices",
    ),
    pytest.param(
        {"gpu-fraction.limit": "0.8"},
        "gpu-fraction.limit needs gpu-fraction",
        id="limit-without-fraction",
    ),
    pytest.param(
        {"gpu-memory": "100000000"},
        "gpu-memory 100000000 must be a whole number of MiB (KAI's unit) from 1 to 9999999",
        id="gpu-memory-too-large",
    ),
    pytest.param(
        {"gpu-fraction": "0.5", "nvidia.com/container.other.gpu-compute.mode": "sm-sharing"},
        "names container other, but the fraction is for container main",
        id="mode-for-another-container",
    ),
    pytest.param(
        {
            "gpu-fraction": "0.5",
            "gpu-fraction.limit": "0.6",
            "kai.scheduler/container.main.gpu-memory.portion.limit": "0.7",
        },
        "gpu-fraction.limit and kai.scheduler/container.main.gpu-memory.portion.limit differ",
        id="two-portion-limits",
    ),
    pytest.param(
        {
            "gpu-memory": "4096",
            "gpu-memory.limit": "16Gi",
            "nvidia.com/container.main.gpu-memory.limit": "2Gi",
        },
        "nvidia.com/container.main.gpu-memory.limit and gpu-memory.limit differ",
        id="two-memory-limits",
    ),
]


@pytest.mark.parametrize(("annotations", "message"), REFUSED)
def test_untranslatable_pod_is_refused_naming_the_annotation(
    cluster: Cluster, annotations: dict[str, str], message: str, request: pytest.FixtureRequest
) -> None:
    answer = cluster.create(NS, pod(request.node.callspec.id, annotations))
    show(annotations, answer if isinstance(answer, str) else "admitted")
    assert isinstance(answer, str), "admitted"
    assert POLICY in answer and message in answer, answer


@pytest.mark.parametrize("where", ["containers", "initContainers"])
def test_whole_gpus_and_a_fraction_are_refused(cluster: Cluster, where: str) -> None:
    body = pod(f"both-{where.lower()}", {"gpu-fraction": "0.5"})
    gpu = {"name": "g", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    body["spec"][where] = [*body["spec"].get(where, []), gpu]
    answer = cluster.create(NS, body)
    assert isinstance(answer, str) and "asks for nvidia.com/gpu as well" in answer, answer


def test_an_init_container_named_by_gpu_fraction_container_name_gets_the_claim(
    cluster: Cluster,
) -> None:
    """KAI's own example of a fraction for an init container."""
    annotations = {"gpu-fraction": "0.5", "gpu-fraction-container-name": "gpu-init"}
    body = pod("init", annotations, ("main",))
    body["spec"]["initContainers"] = [{"name": "gpu-init", "image": "busybox"}]
    stored = cluster.create(NS, body)
    assert isinstance(stored, dict), stored
    (ref,) = stored["spec"]["resourceClaims"]
    (init,) = stored["spec"]["initContainers"]
    assert init["resources"]["claims"] == [{"name": ref["name"]}]
    assert not stored["spec"]["containers"][0].get("resources", {}).get("claims")
    got = summary(cluster.claim_of(NS, "init"))
    show(annotations, {"container": "gpu-init (init)", **got})
    assert (got["class"], got["count"]) == ("gpu-half", 1)


def test_a_pod_without_kai_annotations_is_left_alone(cluster: Cluster) -> None:
    stored = cluster.create(NS, pod("plain", {"example.com/team": "a"}))
    assert isinstance(stored, dict), stored
    assert "resourceClaims" not in stored["spec"]


def test_quota_holds_for_a_translated_claim(cluster: Cluster) -> None:
    """The namespace may hold one gpu-half: a pod asking for halves of 2 GPUs is admitted
    (admission cannot see the quota), its claim is refused by quota, and the pod says so."""
    annotations = {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}
    assert isinstance(cluster.create(QUOTA_NS, pod("two-halves", annotations)), dict)
    events = wait_for(
        "the pod's FailedResourceClaimCreation event",
        lambda: cluster.events(QUOTA_NS, "two-halves", "FailedResourceClaimCreation"),
        timeout=30,
    )
    show(annotations, f"quota gpu-half: 1 -> event: {events[0]}")
    assert (
        "exceeded quota" in events[0]
        and "gpu-half.deviceclass.resource.k8s.io/devices" in (events[0])
    )
    claims = cluster.res.list_namespaced_resource_claim(QUOTA_NS).items
    assert claims == []
    # one half fits
    assert isinstance(cluster.create(QUOTA_NS, pod("one-half", {"gpu-fraction": "0.5"})), dict)
    assert summary(cluster.claim_of(QUOTA_NS, "one-half"))["class"] == "gpu-half"


def test_without_the_template_the_pod_says_what_is_missing(cluster: Cluster) -> None:
    annotations = {"gpu-fraction": "0.25"}
    assert isinstance(cluster.create(NO_TEMPLATE_NS, pod("orphan", annotations)), dict)
    events = wait_for(
        "the pod's FailedResourceClaimCreation event",
        lambda: cluster.events(NO_TEMPLATE_NS, "orphan", "FailedResourceClaimCreation"),
        timeout=30,
    )
    assert 'resource claim template "gpu-fraction-kai"' in events[0], events


def test_pods_of_namespaces_not_granted_are_left_alone(cluster: Cluster) -> None:
    """The policies act in granted namespaces only (kaiCompat.namespaceSelector's default):
    elsewhere, e.g. where KAI itself still runs, a pod keeps its annotations and gets no claim."""
    cluster.core.create_namespace({"metadata": {"name": "kai-stranger"}})
    stored = cluster.create("kai-stranger", pod("p", {"gpu-fraction": "0.3"}))
    assert isinstance(stored, dict), stored
    assert "resourceClaims" not in stored["spec"]
    assert stored["metadata"]["annotations"] == {"gpu-fraction": "0.3"}


def test_a_hand_written_claim_cannot_borrow_the_translation_to_exceed_its_class(
    cluster: Cluster,
) -> None:
    """A tenant who writes a claim like the template's, named like a translated one, gets the
    same checks as any claim: a portion ceiling above the class's cap is refused by the
    claim-parameters policy after the translation."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "crafted",
            "annotations": {"resource.kubernetes.io/pod-claim-name": "kai-ts-x1-p1-pquarter"},
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": "kai-annotations-not-translated"},
                    }
                ]
            }
        },
    }
    with pytest.raises(ApiException) as refused:
        cluster.res.create_namespaced_resource_claim(NS, body)
    message = json.loads(refused.value.body)["message"]
    assert "memoryLimitPortion 1 on request gpu exceeds what DeviceClass gpu-quarter allows" in (
        message
    ), message
