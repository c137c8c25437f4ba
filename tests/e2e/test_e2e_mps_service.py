"""MPS that outlives the plugin: disruptions on the real node while tenant probes hold MPS
connections on both compute modes.

The session's chart runs the MPS node service (DaemonSet ``<release>-mps``, the emulator of
``nvidia-cuda-mps-control`` on these simulated nodes) and the kubelet plugin as its client.
Each test starts tenant probes (the tenant image's ``tenant-probe``: it attaches to its claim's
MPS namespace as a CUDA client would and prints once a second which server it is attached to),
one on a time-slicing and one on an sm-sharing GPU, then disrupts:

- ``helm upgrade`` with a changed plugin value (the plugin's pods roll, the service's do not);
- SIGKILL of the plugin's process (the kubelet restarts the container);
- deletion of the plugin's pod (the DaemonSet makes a new one);
- a kubelet restart;

and checks that every probe kept its connection to the same server process, that a new claim
prepares during and after the disruption, and that nothing is left after the pods go. Then the
one disruptive operation: deleting the MPS service's pod ends its daemons and servers: the
probes report the lost server, the plugin reports the node's MPS GPUs unhealthy (health stream
and a NoSchedule taint) within a check interval, and once the DaemonSet's new pod runs the
claims are re-applied, the GPUs are healthy again and the probes attach anew.

Each test prints one line per disruption (``DISRUPTION | what | probes kept/running | seconds
until a new claim prepared``), shown even when the test passes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("plugin_fixtures")
from plugin_fixtures import (  # noqa: E402
    E2E,
    LOCAL_NODE,
    RELEASE_NAMESPACE,
    SM_SHARING_PRODUCT_GPUS,
    TENANT_IMAGE,
    TIME_SLICING_GPUS,
    GpuNode,
    set_node_taint,
    slices_of,
    wait_for,
)

from dra_driver.enforce.mps.control import MpsControl  # noqa: E402
from dra_driver.enforce.rules.names import namespace_name  # noqa: E402
from dra_driver.enforce.rules.rows import ServerRow  # noqa: E402
from dra_driver.infra.runner import SubprocessRunner  # noqa: E402
from dra_driver.mpsemu.paths import emulator_path  # noqa: E402

pytestmark = pytest.mark.e2e
pytest_plugins = ["plugin_fixtures"]

ON_GPU = 'device.attributes["gpu-fraction.dra.dev"].index == {}'
_shown: list[pytest.CaptureFixture[str]] = []


@pytest.fixture(autouse=True)
def _table(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    _shown.append(capsys)
    yield
    _shown.pop()


def report(*columns: object) -> None:
    with _shown[-1].disabled():
        print("\nDISRUPTION | " + " | ".join(str(c) for c in columns))


def probe_lines(e2e: E2E, pod: str) -> list[dict[str, str]]:
    return e2e.probe_lines(pod, "probe")


def start_probe(
    e2e: E2E,
    name: str,
    node: GpuNode,
    device_class: str,
    gpu: int,
    parameters: dict[str, Any] | None = None,
) -> None:
    """A pod whose container is the tenant probe, on a claim of ``device_class`` on ``gpu``."""
    e2e.template(name, device_class, selectors=[ON_GPU.format(gpu)], parameters=parameters)
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": node.name},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000},
        "containers": [
            {
                "name": "probe",
                "image": TENANT_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["tenant-probe"],
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
        "terminationGracePeriodSeconds": 2,
        "dnsPolicy": "Default",
    }
    e2e.create_raw_pod(name, spec)


def attached(e2e: E2E, pod: str) -> dict[str, str] | None:
    return e2e.attached(pod, "probe")


@contextlib.contextmanager
def probes(e2e: E2E) -> Iterator[dict[str, dict[str, str]]]:
    """Two probes, time-slicing and sm-sharing, attached; yields pod -> the line of its attach
    (``state=connected``, with its limits). Not the last line: a probe reports ``same``
    (server and namespace only) every second after it attaches, and the test that compares
    limits after a re-attach once read a ``same`` line (KeyError: 'pinned_memory_limit')."""
    node = e2e.nodes[0]
    start_probe(e2e, "probe-ts", node, "gpu-quarter", TIME_SLICING_GPUS[3])
    start_probe(e2e, "probe-sm", node, "gpu-quarter-sm-sharing", SM_SHARING_PRODUCT_GPUS[3])
    first = {}
    for pod in ("probe-ts", "probe-sm"):
        e2e.wait_running(pod, timeout=90)
        wait_for(f"{pod} attached", lambda p=pod: attached(e2e, p), timeout=60)
        first[pod] = next(
            x for x in reversed(probe_lines(e2e, pod)) if x.get("state") == "connected"
        )
    yield first


def kept(e2e: E2E, first: dict[str, dict[str, str]], since: int) -> int:
    """How many probes kept their server: every line after ``since`` lines attached to the
    server PID of their first line (and at least one such line)."""
    count = 0
    for pod, line in first.items():
        after = probe_lines(e2e, pod)[since:]
        ok = bool(after) and all(
            x.get("state") in ("connected", "same") and x.get("server_pid") == line["server_pid"]
            for x in after
        )
        count += ok
    return count


def new_claim_prepares(e2e: E2E, name: str, gpu: int) -> float:
    """Seconds until a new pod on a new claim runs on the first node (its claim prepared)."""
    t0 = time.monotonic()
    e2e.template(name, "gpu-eighth", selectors=[ON_GPU.format(gpu)])
    e2e.pod(name, e2e.nodes[0], templates={"gpu": name})
    e2e.wait_running(name, timeout=120)
    return time.monotonic() - t0


def lines_so_far(e2e: E2E, first: dict[str, dict[str, str]]) -> int:
    return min(len(probe_lines(e2e, p)) for p in first)


def service_pods(e2e: E2E, node: str) -> list[dict[str, Any]]:
    return e2e.driver.plugin_pods(node, component="mps-service")


def disrupt_and_check(e2e: E2E, what: str, disrupt: Any, gpu: int, links: Path) -> None:
    with probes(e2e) as first:
        since = lines_so_far(e2e, first)
        service_before = [p["metadata"]["uid"] for p in service_pods(e2e, e2e.nodes[0].name)]
        disrupt()
        seconds = new_claim_prepares(e2e, f"new-{gpu}", gpu)
        e2e.driver.wait_rolled_out(timeout=120)
        time.sleep(3)  # three more probe reports after the plugin is back
        n = kept(e2e, first, since)
        service_after = [p["metadata"]["uid"] for p in service_pods(e2e, e2e.nodes[0].name)]
        report(what, f"{n}/{len(first)} probes kept their server", f"{seconds:.1f} s")
        assert n == len(first), {p: probe_lines(e2e, p)[since:] for p in first}
        assert service_after == service_before  # the MPS service was not replaced
    nothing_left_after_the_pods(e2e, links)


def nothing_left_after_the_pods(e2e: E2E, links: Path) -> None:
    """Delete the namespace's pods; then no claim of theirs has a CDI spec, a checkpoint
    record, an MPS namespace pipe directory or a namespace in an MPS server's list."""
    node = e2e.nodes[0]
    pods = [p["metadata"]["name"] for p in e2e.pods()]
    uids = [e2e.claim_of(p)["metadata"]["uid"] for p in pods]
    for pod in pods:
        e2e.delete_pod(pod)
    for pod in pods:
        e2e.wait_gone(pod, timeout=90)
    left = {
        "cdi": [u for u in uids if node.cdi_spec_path(u).exists()],
        "checkpoint": [u for u in uids if u in node.plugin_checkpoint()],
        "pipes": [d for d in node.pipe_dirs() if any(namespace_name(u) == d.name for u in uids)],
        "namespaces": [
            (mode, row.name)
            for mode in MODES
            for server in mps(node, mode, links).server_list()
            for row in mps(node, mode, links).namespace_list(server.name)
            if any(namespace_name(u) == row.name for u in uids)
        ],
    }
    assert not any(left.values()), left


def test_helm_upgrade_keeps_every_tenant_on_its_server(e2e: E2E, links: Path) -> None:
    values = e2e.driver.values()
    level = "info" if values.get("logLevel") == "debug" else "debug"

    def upgrade() -> None:
        e2e.driver.upgrade(logLevel=level)

    try:
        disrupt_and_check(
            e2e, "helm upgrade (plugin logLevel changed)", upgrade, TIME_SLICING_GPUS[0], links
        )
    finally:
        e2e.driver.upgrade(logLevel=values.get("logLevel", "debug"))
        e2e.driver.wait_rolled_out(timeout=120)


def test_plugin_sigkill_keeps_every_tenant_on_its_server(e2e: E2E, links: Path) -> None:
    node = e2e.nodes[0]

    def kill() -> None:
        assert node.kill_plugin()

    disrupt_and_check(e2e, "SIGKILL of the plugin", kill, TIME_SLICING_GPUS[0], links)


def test_plugin_pod_deletion_keeps_every_tenant_on_its_server(e2e: E2E, links: Path) -> None:
    node = e2e.nodes[0]

    def delete() -> None:
        for pod in e2e.driver.plugin_pods(node.name):
            e2e.core.delete_namespaced_pod(pod["metadata"]["name"], RELEASE_NAMESPACE)

    disrupt_and_check(e2e, "deletion of the plugin pod", delete, TIME_SLICING_GPUS[0], links)


def test_kubelet_restart_keeps_every_tenant_on_its_server(e2e: E2E, links: Path) -> None:
    node = e2e.nodes[0]

    def restart() -> None:
        env = {**os.environ, "LOCAL_CLUSTER_DIR": str(e2e.driver.control_plane.state_dir)}
        done = subprocess.run(
            [sys.executable, str(LOCAL_NODE), "restart-kubelet", node.name],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr

    disrupt_and_check(e2e, "kubelet restart", restart, TIME_SLICING_GPUS[0], links)


def node_taints(e2e: E2E, node: str) -> dict[str, list[str]]:
    """Device name -> its taint keys, from the node's slices."""
    return {
        d["name"]: [t["key"] for t in d.get("taints") or []]
        for s in slices_of(e2e.api, node)
        for d in s["spec"].get("devices") or []
    }


PAUSE_TAINT = {"key": "e2e.gpu-fraction.dra.dev/mps-service-paused", "effect": "NoSchedule"}
"""Keeps the DaemonSet from starting a new MPS service pod on the node (its pods tolerate only
``nvidia.com/gpu``) while the test looks at the node without a service."""


def set_pause_taint(e2e: E2E, node: str, on: bool) -> None:
    set_node_taint(e2e, node, PAUSE_TAINT, on)


def test_deleting_the_mps_service_ends_the_servers_and_the_node_recovers(
    e2e: E2E, links: Path
) -> None:
    """The service's pod is deleted while the node is tainted against a new one, so the node
    stays without a service until the test lets it back: the outage does not depend on how
    fast the DaemonSet replaces the pod (the plugin's health check runs every 10 s, and a new
    pod can be ready sooner)."""
    node = e2e.nodes[0]
    with probes(e2e) as first:
        since = lines_so_far(e2e, first)
        (pod,) = service_pods(e2e, node.name)
        set_pause_taint(e2e, node.name, True)
        try:
            t0 = time.monotonic()
            e2e.core.delete_namespaced_pod(pod["metadata"]["name"], RELEASE_NAMESPACE)

            def lost() -> bool:
                return all(
                    any(
                        x.get("state") in ("lost", "terminated")
                        for x in probe_lines(e2e, p)[since:]
                    )
                    for p in first
                )

            wait_for("every probe reports its lost server", lost, timeout=60)
            taint = "gpu-fraction.dra.dev/gpu-unhealthy"

            def tainted() -> bool:
                taints = node_taints(e2e, node.name)
                return all(taint in taints[d] for d in taints)

            wait_for("the node's MPS GPUs tainted", tainted, timeout=45)
            unhealthy_after = time.monotonic() - t0
        finally:
            set_pause_taint(e2e, node.name, False)
        t1 = time.monotonic()
        wait_for(
            "a new MPS service pod running",
            lambda: [
                p
                for p in service_pods(e2e, node.name)
                if p["metadata"]["uid"] != pod["metadata"]["uid"]
                and p["status"].get("phase") == "Running"
            ],
            timeout=90,
        )
        wait_for("taints gone", lambda: not any(node_taints(e2e, node.name).values()), timeout=90)
        healthy_after = time.monotonic() - t1
        # the probes attach again, to the re-created namespaces of new servers, under their
        # limits (an attach between a namespace's creation and its limits is ended by the
        # enforcer, and the probe attaches again)
        for p, line in first.items():

            def reattached(p: str = p, line: dict[str, str] = line) -> bool:
                return any(
                    x.get("state") == "connected"
                    and x.get("server_pid") != line["server_pid"]
                    and x.get("pinned_memory_limit") == line["pinned_memory_limit"]
                    for x in probe_lines(e2e, p)[since:]
                )

            wait_for(f"{p} attached again under its limits", reattached, timeout=60)
        # the outage is not silent: each probe's pod has a MpsServerRestarted Warning event,
        # and its claim MpsClientsConnected=False (its container, created before the outage,
        # still runs)
        for p in first:
            wait_for(f"{p}'s MpsServerRestarted event", lambda p=p: outage_event(e2e, p), 60)
            try:
                wait_for(
                    f"{p}'s claim with MpsClientsConnected=False",
                    lambda p=p: clients_condition(e2e, p) == ("False", "MpsServerRestarted"),
                    60,
                )
            except pytest.fail.Exception:
                uid = e2e.claim_of(p)["metadata"]["uid"]
                lines = e2e.driver.plugin_log(node.name, 3000).splitlines()
                print(f"{p}: condition now {clients_condition(e2e, p)}, claim {uid}")
                print("\n".join(x for x in lines if uid in x or "outage" in x or "status" in x))
                raise
        seconds = new_claim_prepares(e2e, "after-mps", TIME_SLICING_GPUS[0])
        report(
            "deletion of the MPS service pod",
            f"0/{len(first)} probes kept their server (by design)",
            f"unhealthy+tainted after {unhealthy_after:.1f} s; once a new service pod may "
            f"start, healthy after {healthy_after:.1f} s; a new claim prepared in "
            f"{seconds:.1f} s",
        )
    nothing_left_after_the_pods(e2e, links)


def outage_event(e2e: E2E, pod: str) -> str | None:
    """The message of the pod's ``MpsServerRestarted`` Warning event, if it has one."""
    events = e2e.core.list_namespaced_event(
        e2e.namespace, field_selector=f"involvedObject.name={pod}"
    ).items
    return next(
        (e.message for e in events if e.reason == "MpsServerRestarted" and e.type == "Warning"),
        None,
    )


def clients_condition(e2e: E2E, pod: str) -> tuple[str, str] | None:
    """``(status, reason)`` of the ``MpsClientsConnected`` condition of the pod's claim."""
    devices = (e2e.claim_of(pod).get("status") or {}).get("devices") or []
    conditions = [c for d in devices for c in d.get("conditions") or []]
    found = [c for c in conditions if c["type"] == "MpsClientsConnected"]
    return (found[0]["status"], found[0]["reason"]) if found else None


def test_the_plugin_never_starts_a_daemon(e2e: E2E) -> None:
    """The daemons are children of the MPS service, not of the plugin."""
    node = e2e.nodes[0]
    plugin = set(node.plugin_pids())
    for proc in os.listdir("/proc"):
        if not proc.isdigit():
            continue
        try:
            args = Path(f"/proc/{proc}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{proc}/stat").read_text()
        except OSError:
            continue
        if args and args[0].endswith(b"nvidia-cuda-mps-control") and b"-f" in args:
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            assert ppid not in plugin


MODES = ("time-slicing", "sm-sharing")


def mps(node: GpuNode, mode: str, links: Path) -> MpsControl:
    """The node's MPS control daemon of ``mode`` (the emulator's program, from this host),
    reached through a short symlink in ``links``: the node's pipe directory under pytest's
    temporary directory is too long for a unix socket path (the kernel's 107 bytes)."""
    pipe = node.run_dir / "mps" / mode / "pipe"
    link = links / f"{node.name}-{mode}"
    if not link.is_symlink():
        link.symlink_to(pipe)
    return MpsControl(SubprocessRunner(), link, pipe.parent / "log", binary=str(emulator_path()))


@pytest.fixture
def links() -> Iterator[Path]:
    """A short directory for :func:`mps`'s symlinks."""
    path = Path(tempfile.mkdtemp(prefix="mpsl-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def gpu_uuid(e2e: E2E, node: str, index: int) -> str:
    return str(
        next(
            d["attributes"]["uuid"]["string"]
            for s in slices_of(e2e.api, node)
            for d in s["spec"].get("devices") or []
            if d["attributes"]["index"]["int"] == index
        )
    )


def test_the_first_claim_sets_the_compute_mode_and_the_last_retires_the_server(
    e2e: E2E, links: Path
) -> None:
    """An sm-sharing GPU: DEFAULT and no server before; the first claim sets EXCLUSIVE_PROCESS
    and starts the GPU's server (the probe attaches to it, with the thread percentage its claim
    asked); a second claim joins the same server and outlives the first; after the last
    claim the server is gone and the compute mode is DEFAULT again."""
    node, gpu = e2e.nodes[0], SM_SHARING_PRODUCT_GPUS[2]
    uuid = gpu_uuid(e2e, node.name, gpu)
    mode_file = node.state_dir / "simulated" / "nvml" / "compute-mode" / uuid

    def compute_mode() -> str:
        return mode_file.read_text().strip() if mode_file.exists() else "DEFAULT"

    def servers() -> list[ServerRow]:
        return [
            r for r in mps(node, "sm-sharing", links).server_list() if uuid in r.allowed_devices
        ]

    assert compute_mode() == "DEFAULT" and not servers()
    start_probe(e2e, "first", node, "gpu-quarter-sm-sharing", gpu, {"activeThreadPercentage": 30})
    e2e.wait_running("first", timeout=90)
    line = wait_for("first attached", lambda: attached(e2e, "first"), timeout=60)
    (server,) = servers()
    assert compute_mode() == "EXCLUSIVE_PROCESS"
    assert line["server_pid"] == server.pid and line["server"] == server.name
    assert line["active_thread_percentage"] == "30"
    start_probe(e2e, "second", node, "gpu-quarter-sm-sharing", gpu)
    e2e.wait_running("second", timeout=90)
    other = wait_for("second attached", lambda: attached(e2e, "second"), timeout=60)
    assert other["server_pid"] == server.pid and other["namespace"] != line["namespace"]
    e2e.delete_pod("first")
    e2e.wait_gone("first", timeout=90)
    time.sleep(2)  # two more reports of the second probe
    assert attached(e2e, "second") and servers() == [server]
    assert compute_mode() == "EXCLUSIVE_PROCESS"
    e2e.delete_pod("second")
    e2e.wait_gone("second", timeout=90)
    wait_for("the GPU's server retired", lambda: not servers(), timeout=30)
    wait_for("compute mode DEFAULT", lambda: compute_mode() == "DEFAULT", timeout=30)
