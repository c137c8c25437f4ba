"""A DeviceTaintRule that selects everything (kubernetes/kubernetes#141422), on the real node.

The chart's policy (``policies.deviceTaintRuleSelector``, on by default) refuses a rule whose
``spec.deviceSelector`` is empty, naming the field. With the policy turned off such a rule gets
in, and with ``NoExecute`` the eviction controller evicts every pod that uses a device: the
evicted fractions must leave nothing behind on the node (checkpoint records, CDI specs, MPS
namespace pipe directories, consumer records, the GPU's compute mode), no new fraction is
allocated while the rule stands, and one schedules and runs once it is gone.

Prints one line (``TAINT | what | result``) per step, shown even when the test passes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    E2E,
    SM_SHARING_PRODUCT_GPUS,
    TIME_SLICING_GPUS,
    GpuNode,
    slice_devices,
    unschedulable,
    wait_for,
)

from dra_driver.enforce.rules.names import namespace_name  # noqa: E402

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

ON_GPU = 'device.attributes["gpu-fraction.dra.dev"].index == {}'
RULE = "e2e-everything"


def rule_body(selector: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": RULE},
        "spec": {
            "deviceSelector": selector if selector is not None else {},
            "taint": {"key": "example.com/maintenance", "effect": "NoExecute"},
        },
    }


def create_rule(e2e: E2E, dry_run: bool = False) -> str | None:
    """Create the select-everything rule: None when admitted, else the API's message."""
    try:
        e2e.res.create_device_taint_rule(rule_body(), dry_run="All" if dry_run else None)
    except ApiException as exc:
        return str(exc.body)
    return None


def delete_rule(e2e: E2E) -> None:
    try:
        e2e.res.delete_device_taint_rule(RULE)
    except ApiException as exc:
        if exc.status != 404:
            raise


def report(capsys: pytest.CaptureFixture[str], *columns: object) -> None:
    with capsys.disabled():
        print("\nTAINT | " + " | ".join(str(c) for c in columns))


def gpu_uuid(e2e: E2E, node: str, device: str) -> str:
    uuid: str = slice_devices(e2e.slices(node))[device]["attributes"]["uuid"]["string"]
    return uuid


def left_on(node: GpuNode, uids: list[str], uuids: list[str]) -> dict[str, list[str]]:
    """What the node still holds of the claims ``uids`` and of their GPUs ``uuids``."""
    modes = node.state_dir / "simulated" / "nvml" / "compute-mode"
    pipes = {d.name for d in node.pipe_dirs()}
    return {
        "checkpoint": [u for u in uids if u in node.plugin_checkpoint()],
        "cdi": [u for u in uids if node.cdi_spec_path(u).exists()],
        "pipes": [u for u in uids if namespace_name(u) in pipes],
        "consumer records": [u for u in uids if (node.run_dir / "users" / u).exists()],
        "compute mode": [
            u
            for u in uuids
            if (modes / u).exists() and (modes / u).read_text().strip() != "DEFAULT"
        ],
    }


@pytest.fixture
def guard_off(e2e: E2E) -> Iterator[None]:
    """The chart's device-taint-rule policy turned off for the test, back on after it (and no
    select-everything rule left behind, even if the test fails)."""
    policies = e2e.driver.values().get("policies", {})
    e2e.driver.upgrade(policies={**policies, "deviceTaintRuleSelector": False})
    try:
        wait_for("the policy gone from admission", lambda: create_rule(e2e, True) is None, 60)
        yield
    finally:
        delete_rule(e2e)
        policies = e2e.driver.values().get("policies", {})
        e2e.driver.upgrade(policies={**policies, "deviceTaintRuleSelector": True})
        wait_for("the policy back in admission", lambda: create_rule(e2e, True) is not None, 60)


def test_the_chart_refuses_a_rule_that_selects_everything(
    e2e: E2E, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = create_rule(e2e)
    report(capsys, "rule with deviceSelector {} (policy on)", answer or "admitted")
    assert answer is not None
    assert f"spec.deviceSelector of DeviceTaintRule {RULE} is empty" in answer


def test_evicted_fractions_leave_nothing_and_new_ones_schedule_once_the_rule_is_gone(
    e2e: E2E, guard_off: None, capsys: pytest.CaptureFixture[str]
) -> None:
    node = e2e.nodes[0]
    placed = {
        "ts": ("gpu-eighth", TIME_SLICING_GPUS[2]),
        "sm": ("gpu-quarter-sm-sharing", SM_SHARING_PRODUCT_GPUS[1]),
    }
    for pod, (device_class, gpu) in placed.items():
        e2e.template(pod, device_class, selectors=[ON_GPU.format(gpu)])
        e2e.pod(pod, node, templates={"gpu": pod}, run_as_user=1000)
    for pod in placed:
        e2e.wait_running(pod, timeout=90)
    uids = [e2e.claim_of(p)["metadata"]["uid"] for p in placed]
    devices = [
        e2e.claim_of(p)["status"]["allocation"]["devices"]["results"][0]["device"] for p in placed
    ]
    uuids = [gpu_uuid(e2e, node.name, d) for d in devices]
    before = left_on(node, uids, uuids)
    assert all(len(v) == len(uids) for k, v in before.items() if k != "consumer records")
    assert create_rule(e2e) is None
    started = time.monotonic()
    for pod in placed:
        e2e.wait_gone(pod, timeout=120)
    evicted = time.monotonic() - started
    cleared: dict[str, float] = {}

    def nothing_left() -> bool:
        for what, still in left_on(node, uids, uuids).items():
            if not still:
                cleared.setdefault(what, round(time.monotonic() - started, 1))
        return len(cleared) == len(before)

    wait_for("nothing left of the evicted fractions", nothing_left, timeout=60)
    clean = time.monotonic() - started
    report(
        capsys,
        "rule with deviceSelector {} NoExecute (policy off)",
        f"2 fraction pods evicted in {evicted:.1f} s, nothing left after {clean:.1f} s "
        f"(seconds until each was gone: {cleared})",
    )
    e2e.template("after", "gpu-eighth", selectors=[ON_GPU.format(TIME_SLICING_GPUS[2])])
    e2e.pod("after", node, templates={"gpu": "after"}, run_as_user=1000)
    why = wait_for(
        "the new pod unschedulable while the rule stands",
        lambda: unschedulable(e2e, "after"),
        timeout=60,
    )
    assert e2e.read_pod("after")["status"].get("phase") == "Pending"
    delete_rule(e2e)
    deleted = time.monotonic()
    e2e.wait_running("after", timeout=120)
    report(
        capsys,
        "new gpu-eighth while the rule stands, then after it is deleted",
        f"Pending ({why.get('message', '')[:120]}); Running {time.monotonic() - deleted:.1f} s "
        "after the rule was deleted",
    )
