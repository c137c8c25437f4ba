"""The device-taint-rule guard on a real API server (hack/local-cluster, no node needed): the
chart's policy as the plain install ships it (``manifests/policy-device-taint-rules.yaml``)
refuses a DeviceTaintRule whose ``spec.deviceSelector`` is present but empty, which selects
every device of every driver (kubernetes/kubernetes#141422: with ``NoExecute`` it evicted
every DRA pod of the cluster), on create and on update, naming the field; rules that select
something, or nothing, are admitted. Each attempt is printed (``TAINT | rule | answer``)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import config as k8s_config
from kubernetes import dynamic
from kubernetes.client.exceptions import ApiException

from dra_driver import DEFAULT_DRIVER_NAME as DRIVER
from tests.support.nodeless import local_cluster
from tests.support.paths import REPO
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

POLICY = REPO / "manifests" / "policy-device-taint-rules.yaml"
FIELD = "spec.deviceSelector of DeviceTaintRule"


def rule(name: str, selector: dict[str, Any] | None, effect: str = "NoExecute") -> dict[str, Any]:
    spec: dict[str, Any] = {"taint": {"key": "example.com/maintenance", "effect": effect}}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": spec,
    }


@pytest.fixture(scope="module")
def rules() -> Iterator[Any]:
    """The DeviceTaintRule resource of a fresh control plane with the policy in effect."""
    state = Path(tempfile.mkdtemp(prefix="taint-rules-"))
    up = local_cluster(state, "up")
    try:
        if up.returncode != 0:
            pytest.fail(f"hack/local-cluster up failed:\n{up.stderr[-3000:]}")
        api = k8s_config.new_client_from_config(config_file=str(state / "kubeconfig"))
        dc = dynamic.DynamicClient(api)
        for obj in yaml.safe_load_all(POLICY.read_text()):
            dc.resources.get(api_version=obj["apiVersion"], kind=obj["kind"]).create(body=obj)
        resource = dc.resources.get(api_version="resource.k8s.io/v1", kind="DeviceTaintRule")

        def enforced() -> bool:
            try:
                resource.create(body=rule("probe", {}), query_params=[("dryRun", "All")])
            except ApiException as exc:
                return FIELD in str(exc.body)
            return False

        wait_for("the device-taint-rules policy in effect", enforced, 60)
        yield resource
        api.close()
    finally:
        local_cluster(state, "down")
        shutil.rmtree(state, ignore_errors=True)


def attempt(resource: Any, body: dict[str, Any], patch: dict[str, Any] | None = None) -> str | None:
    """Create ``body`` (or, with ``patch``, merge-patch the rule of its name): None when
    admitted, else the API server's message."""
    try:
        if patch is not None:
            resource.patch(
                name=body["metadata"]["name"],
                body=patch,
                content_type="application/merge-patch+json",
            )
        else:
            resource.create(body=body)
    except ApiException as exc:
        answer: str | None = str(json.loads(exc.body)["message"])
        assert exc.status == 422, exc.body
    else:
        answer = None
    print(f"\nTAINT | {json.dumps(patch or body['spec'])} | {answer or 'admitted'}")
    return answer


def test_an_empty_selector_is_refused_naming_the_field_and_effect(rules: Any) -> None:
    for effect in ("NoExecute", "NoSchedule"):
        answer = attempt(rules, rule(f"everything-{effect.lower()}", {}, effect))
        assert answer is not None
        assert f"{FIELD} everything-{effect.lower()} is empty" in answer
        assert f"(effect {effect})" in answer
        assert "name a driver, pool or device" in answer


@pytest.mark.parametrize(
    "selector",
    [None, {"driver": DRIVER}, {"pool": "gpu-node-1"}, {"device": "gpu-0-time-slicing"}],
    ids=["no-selector", "driver", "pool", "device"],
)
def test_a_rule_that_selects_something_or_nothing_is_admitted(
    rules: Any, selector: dict[str, Any] | None
) -> None:
    name = f"ok-{len(json.dumps(selector))}-{next(iter(selector or {'none': 0}))}"
    assert attempt(rules, rule(name, selector)) is None
    rules.delete(name=name)


def test_an_update_that_empties_the_selector_is_refused(rules: Any) -> None:
    """A patch, not a read-modify-write: the device-taint controller writes the rule's status
    meanwhile (a replace then conflicts with 409)."""
    body = rule("narrowed", {"driver": DRIVER})
    assert attempt(rules, body) is None
    answer = attempt(rules, body, patch={"spec": {"deviceSelector": {"driver": None}}})
    assert answer is not None and f"{FIELD} narrowed is empty" in answer
    assert rules.get(name="narrowed").to_dict()["spec"]["deviceSelector"] == {"driver": DRIVER}
