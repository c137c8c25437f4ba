"""End to end, one claim shared by pods: all its consumers together hold at most its ceiling.

A ResourceClaim referenced (``resourceClaimName``) by several pods is prepared once per node,
and every container that lists it gets its CDI devices. The consumer gate (a createRuntime
hook in the claim's CDI spec) admits at most ``maxConsumers`` running containers (default 1)
and the ``hard`` tier's per-container limit is the ceiling divided among them; the claim's
status lists who runs. Seen on the real node: a refused container's start fails with the
gate's message in the pod's events."""

from __future__ import annotations

from typing import Any

import pytest

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    DRIVER,
    E2E,
    TENANT_IMAGE,
    TIME_SLICING_GPUS,
    wait_for,
)

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

PODS = ("share-a", "share-b", "share-c")
CONTAINERS = ("one", "two")
ON_GPU = 'device.attributes["gpu-fraction.dra.dev"].index == {}'


def our_entries(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in (claim.get("status") or {}).get("devices") or [] if e["driver"] == DRIVER]


def shared_pods(e2e: E2E, claim: str) -> None:
    """3 pods with 2 containers each, every container using ``claim``, as UID 1000."""
    for pod in PODS:
        spec = {
            "containers": [
                {"name": c, "resources": {"claims": [{"name": "gpu"}]}} for c in CONTAINERS
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000},
        }
        e2e.create_pod(pod, spec)


def container_states(e2e: E2E) -> dict[str, dict[str, Any]]:
    """``<pod>/<container>`` -> its state, for every container of :data:`PODS` that has one."""
    out = {}
    for pod in PODS:
        for s in e2e.read_pod(pod)["status"].get("containerStatuses") or []:
            out[f"{pod}/{s['name']}"] = s.get("state") or {}
    return out


def refusals(e2e: E2E, text: str) -> set[str]:
    """The pods with a Warning event whose message carries ``text``."""
    return {
        pod
        for pod in PODS
        if any(text in str(ev.get("message")) for ev in e2e.events(pod) if ev["type"] == "Warning")
    }


def status_consumers(e2e: E2E) -> dict[str, Any]:
    (entry,) = our_entries(e2e.claim_of(PODS[0]))
    consumers: dict[str, Any] = entry["data"]["consumers"]
    return consumers


def test_one_claim_shared_by_six_containers_holds_one_fraction(e2e: E2E) -> None:
    """The review's attack: one gpu-eighth claim, 3 pods x 2 containers. Before: all 6 ran,
    each with the eighth's whole ceiling. Now: one runs; the other five are refused."""
    e2e.claim("shared", "gpu-eighth")
    shared_pods(e2e, "shared")
    text = "allows 1 at once"

    def settled() -> list[str] | None:
        """The running containers, once one runs and every other pod was told why its
        containers cannot start (the kubelet's status lags its events: wait for both)."""
        running = [k for k, st in container_states(e2e).items() if "running" in st]
        told = refusals(e2e, text) | {k.split("/")[0] for k in running}
        return running if running and told == set(PODS) else None

    running = wait_for("one consumer running, every pod told why", settled, timeout=120)
    assert len(running) == 1, "\n".join(e2e.describe(p) for p in PODS)
    pod = running[0].split("/")[0]
    view = e2e.view(pod, running[0].split("/")[1])
    eighth_mib = int(view.env["NVIDIA_GPU_MEMORY_LIMIT"])
    message = next(
        str(ev["message"])
        for p in PODS
        for ev in e2e.events(p)
        if ev["type"] == "Warning" and text in str(ev.get("message"))
    )
    print("ATTACK | shared eighth, 6 containers | refused:", message[-400:])
    assert f"claim {e2e.namespace}/shared already has 1 running consumer(s)" in message
    assert f"each may hold {eighth_mib} MiB of its {eighth_mib} MiB ceiling" in message
    assert "maxConsumers" in message
    consumers = wait_for(
        "the claim's status lists its one consumer",
        lambda: c if len((c := status_consumers(e2e))["running"]) == 1 else None,
    )
    assert consumers["max"] == 1
    assert consumers["running"] == [f"{e2e.namespace}/{running[0]}"]


def test_max_consumers_divides_the_ceiling_among_the_containers(e2e: E2E) -> None:
    e2e.claim("shared6", "gpu-eighth", parameters={"maxConsumers": 6})
    shared_pods(e2e, "shared6")
    for pod in PODS:
        e2e.wait_running(pod, timeout=90)
    limits = []
    for pod in PODS:
        for c in CONTAINERS:
            view = e2e.view(pod, c)
            limits.append(int(view.env["NVIDIA_GPU_MEMORY_LIMIT"]))
            assert int(view.env["NVIDIA_GPU_MEMORY_REQUEST"]) <= limits[-1]
    (entry,) = our_entries(e2e.claim_of(PODS[0]))
    ceiling_mib = entry["data"]["memory"]["limitBytes"] // 2**20
    assert limits == [ceiling_mib // 6] * 6
    assert sum(limits) <= ceiling_mib
    consumers = wait_for(
        "the claim's status lists its six consumers",
        lambda: c if len((c := status_consumers(e2e))["running"]) == 6 else None,
    )
    assert consumers["max"] == 6
    assert consumers["each"]["limit"] == f"{ceiling_mib // 6}Mi"
    print(f"SHARED | maxConsumers 6 | each {ceiling_mib // 6} MiB of {ceiling_mib} MiB")


FLOOD = """
import os, socket, time
held = []
for _ in range(80):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("/tmp/nvidia-mps/control")
        s.sendall(b"HELLO %d flood\\n" % os.getpid())
        print("ANSWER", s.recv(4096).decode().strip(), flush=True)
        held.append(s)
    except OSError as exc:
        print("ERR", exc, flush=True)
print("FLOOD-HELD", len(held), flush=True)
while held:
    for s in list(held):
        s.settimeout(0.2)
        try:
            data = s.recv(4096)
        except socket.timeout:
            continue
        if data:
            print("GOT", data.decode().strip(), flush=True)
        else:
            held.remove(s)
print("FLOOD-ENDED", flush=True)
time.sleep(3600)
"""
"""A tenant that opens 80 MPS clients from one process and holds them, printing what its
server tells them (the review's 300 connections, past the 60-client table)."""


def tenant_pod(e2e: E2E, name: str, gpu: int, command: list[str]) -> None:
    """A non-root pod in the tenant image on an eighth of ``gpu`` running ``command``."""
    e2e.template(name, "gpu-eighth", selectors=[ON_GPU.format(gpu)])
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": e2e.nodes[0].name},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000},
        "containers": [
            {
                "name": "main",
                "image": TENANT_IMAGE,
                "imagePullPolicy": "Never",
                "command": command,
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
        "terminationGracePeriodSeconds": 2,
        "dnsPolicy": "Default",
    }
    e2e.create_raw_pod(name, spec)


def test_a_flooding_tenant_is_cut_to_its_claims_share_and_its_neighbour_gets_in(
    e2e: E2E,
) -> None:
    """Issue 26, item 2. Before: 250 of 300 connections were welcomed and a neighbour on the
    same GPU was rejected until the flood ended. Now: the server's table is 60, the flooding
    claim (an eighth: at most 7 clients) is cut back within the plugin's 2 s client check, its
    pod is told why, and the neighbour attaches."""
    gpu = TIME_SLICING_GPUS[2]
    node = e2e.nodes[0]
    tenant_pod(e2e, "flood", gpu, ["python3", "-c", FLOOD])
    e2e.wait_running("flood", timeout=90)
    log = lambda: node.container_log(e2e.namespace, "flood", "main")  # noqa: E731
    wait_for("the flood to hold its clients", lambda: "FLOOD-HELD" in log(), timeout=30)
    tenant_pod(e2e, "neighbour", gpu, ["tenant-probe"])
    e2e.wait_running("neighbour", timeout=90)
    attached = wait_for(
        "the neighbour attached to its namespace",
        lambda: e2e.attached("neighbour", "main"),
        timeout=60,
    )
    assert attached["pinned_memory_limit"] != "unlimited"
    event = wait_for(
        "the flooding pod told why its clients were ended",
        lambda: next(
            (ev for ev in e2e.events("flood") if ev["reason"] == "MpsClientsOverCap"), None
        ),
        timeout=30,
    )
    text = log()
    welcomed = text.count("ANSWER WELCOME")
    print(
        f"ATTACK | 80 MPS clients from one tenant | {welcomed} welcomed, then terminated: "
        f"{text.count('GOT TERMINATED')}; event: {event['message']} | neighbour: "
        f"state={attached['state']} limit={attached['pinned_memory_limit']}"
    )
    assert welcomed <= 60  # the server's client table
    assert "at most 7 at once" in str(event["message"])
    assert "FLOOD-ENDED" in text
