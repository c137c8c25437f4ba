"""Extended resources asked by an init container, a native sidecar and an app container of one
pod (kubernetes/kubernetes#134880, kubernetes-sigs/dra-driver-cpu#197), on a real node.

The scheduler makes one ResourceClaim for the pod's extended resources and maps each asking
container to a request of it (``status.extendedResourceClaimStatus.requestMappings``); the
kubelet injects a request's CDI devices into the containers mapped to it, by that mapping and
not by the request's name. So each asking container must see the share of its own request
only, and a container that asks nothing must see no GPU.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    DRIVER,
    E2E,
    GRANT_QUOTA,
    VIEW_SCRIPT,
    WORKLOAD_IMAGE,
    ContainerView,
    raw,
    wait_for,
)

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

EIGHTH = f"{DRIVER}/eighth"
EIGHTH_MIB = 143_131 // 8  # simulated H200: 143131 MiB
QUOTA_KEY = "gpu-eighth.deviceclass.resource.k8s.io/devices"
PRINT_AND_EXIT = VIEW_SCRIPT.split("trap ", 1)[0]


def _container(name: str, script: str, asks: bool, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": WORKLOAD_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        **({"resources": {"limits": {EIGHTH: "1"}}} if asks else {}),
        **extra,
    }


def _used(e2e: E2E) -> int:
    q = raw(
        e2e.core.read_namespaced_resource_quota(GRANT_QUOTA, e2e.namespace, _preload_content=False)
    )
    return int(((q.get("status") or {}).get("used") or {}).get(QUOTA_KEY, "0"))


def test_init_container_sidecar_and_app_each_see_their_own_eighth(e2e: E2E) -> None:
    node = e2e.nodes[0]
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": node.name},
        "terminationGracePeriodSeconds": 2,
        "dnsPolicy": "Default",
        "initContainers": [
            _container("init", PRINT_AND_EXIT, asks=True),
            _container("sidecar", VIEW_SCRIPT, asks=True, restartPolicy="Always"),
        ],
        "containers": [
            _container("app", VIEW_SCRIPT, asks=True),
            _container("plain", VIEW_SCRIPT, asks=False),
        ],
    }
    e2e.create_raw_pod("mixed", spec)
    e2e.wait_running("mixed", timeout=90)
    status = e2e.read_pod("mixed")["status"]["extendedResourceClaimStatus"]
    claim = raw(
        e2e.res.read_namespaced_resource_claim(
            status["resourceClaimName"], e2e.namespace, _preload_content=False
        )
    )
    uid = claim["metadata"]["uid"]
    results = {r["request"]: r for r in claim["status"]["allocation"]["devices"]["results"]}
    mapping = {m["containerName"]: m["requestName"] for m in status["requestMappings"]}
    # Kubernetes 1.37: one request per container that runs beside the others (sidecar, app);
    # the init container, done before the sidecar starts, reuses one of theirs
    # (kubernetes/kubernetes#134882), so the pod holds two eighths, not three.
    assert "plain" not in mapping and mapping["sidecar"] != mapping["app"]
    assert mapping["init"] in (mapping["sidecar"], mapping["app"])
    assert set(results) == {mapping["sidecar"], mapping["app"]}
    assert len({r["shareID"] for r in results.values()}) == 2
    assert _used(e2e) == 2  # the class quota counts the two devices the claim holds

    views = {c: e2e.view("mixed", c) for c in ("init", "sidecar", "app", "plain")}
    for c in ("init", "sidecar", "app"):
        gpus = [d for d in views[c].devices if d.removeprefix("/dev/nvidia").isdigit()]
        assert len(gpus) == 1, (c, views[c].devices)
        assert views[c].env["NVIDIA_GPU_MEMORY_LIMIT"] == str(EIGHTH_MIB), (c, views[c].env)
        assert len(views[c].mounts) == 1, (c, views[c].mounts)
    assert views["plain"] == ContainerView([], {}, [])  # asks nothing, sees no GPU

    # Which share each container got, from the consumer records its createRuntime hook wrote
    # (users/<claim>/<device>-<shareID>/<container ID>): the share of its own request.
    share_of = {}
    for record in (node.run_dir / "users" / uid).glob("*/*"):
        if record.name.startswith("."):
            continue
        who = record.read_text().split()[3]
        share_of[who.rsplit("/", 1)[1]] = record.parent.name
    for c in ("sidecar", "app"):
        r = results[mapping[c]]
        assert share_of.get(c) == f"{r['device']}-{r['shareID']}", (c, share_of)

    e2e.delete_pod("mixed")
    e2e.wait_gone("mixed", timeout=90)
    wait_for("the pod's claim deleted", lambda: not e2e.allocated_claims(), timeout=60)
    assert uid not in node.plugin_checkpoint() and not node.cdi_spec_path(uid).exists()
    assert not (node.run_dir / "users" / uid).exists()
    assert not [p for p in node.pipe_dirs() if uid.replace("-", "_") in p.name]
