"""End to end, claims the plugin must refuse: the scheduler allocates them (it cannot read
opaque parameters), the plugin's per-claim error reaches the user as the real kubelet's pod
Warning Event, the kubelet retries, the pod never runs, and nothing is left on disk."""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import E2E, check_prepared, wait_for  # noqa: E402

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

FAILED = "FailedPrepareDynamicResources"
ON_GPU = 'device.attributes["gpu-fraction.dra.dev"].index == {}'

BAD = {
    # pod: (class, parameters, text the user must read in the event)
    "limit-below-request": ("gpu-half", {"memoryLimit": "10Gi"}, "is below the request"),
    "wrong-mode": ("gpu-quarter", {"computeMode": "sm-sharing"}, "runs compute mode time-slicing"),
    "threads-on-time-slicing": (
        "gpu-eighth",
        {"activeThreadPercentage": 30},
        "activeThreadPercentage needs compute mode sm-sharing",
    ),
    "unknown-field": ("gpu-eighth", {"memoryLimitt": "1Gi"}, "unknown field(s) memoryLimitt"),
}


def test_invalid_parameters_fail_with_a_readable_event(e2e: E2E) -> None:
    node = e2e.nodes[0]
    for name, (device_class, params, _) in BAD.items():
        e2e.template(name, device_class, parameters=params, selectors=[ON_GPU.format(2)])
        e2e.pod(name, node, templates={"gpu": name})
    # A valid pod on the same node is not held up by its neighbours' failures.
    e2e.template(
        "good",
        "gpu-quarter",
        parameters={"memoryLimitPortion": "0.5"},
        selectors=[ON_GPU.format(3)],
    )
    e2e.pod("good", node, templates={"gpu": "good"})

    def failures(pod: str) -> list[dict[str, object]]:
        return [e for e in e2e.events(pod) if e["reason"] == FAILED]

    claim_uids = {}
    for name, (_, _, text) in BAD.items():
        event = wait_for(f"{FAILED} event on {name}", lambda n=name: failures(n))[0]
        assert event["type"] == "Warning"
        claim = e2e.claim_of(name)
        assert claim["status"]["allocation"]  # the scheduler did its part
        claim_uids[name] = claim["metadata"]["uid"]
        message = str(event["message"])
        assert text in message, message
        assert claim["metadata"]["name"] in message
        assert event["source"]["component"] == "kubelet"  # the real kubelet reported it
        assert event["source"]["host"] == node.name
    # Retried: the same event is counted up.
    wait_for(
        "a retry of limit-below-request",
        lambda: (
            (failures("limit-below-request")[0].get("count") or 0) >= 2
            or len(failures("limit-below-request")) >= 2
        ),
        timeout=40,
    )
    e2e.wait_running("good")
    good = check_prepared(e2e, "good")
    # memoryLimitPortion 0.5 of the card: the ceiling is about twice the quarter's request.
    request = int(good.view.env["NVIDIA_GPU_MEMORY_REQUEST"])
    assert abs(int(good.view.env["NVIDIA_GPU_MEMORY_LIMIT"]) - 2 * request) <= 1

    for name, uid in claim_uids.items():
        pod = e2e.read_pod(name)
        assert pod["status"]["phase"] == "Pending", name
        assert not any(
            c.get("state", {}).get("running") for c in pod["status"].get("containerStatuses") or []
        )
        assert not node.cdi_spec_path(uid).exists()
        assert uid not in node.plugin_checkpoint()
    assert set(e2e.prepared_here()[node.name]) == {good.uid}
