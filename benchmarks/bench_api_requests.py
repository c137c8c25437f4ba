"""Count the API requests one kubelet plugin makes: idle, and per prepared claim, read from the
API server's audit log (what the server saw, not what the plugin thinks it sent).

A local control plane (hack/local-cluster, no kubelet) with an audit policy logging every
request's metadata; a kubelet-less Node; ``dra-driver kubelet-plugin`` run as a process for it
(2 simulated H200s, ``--simulated-enforcer=recording``: the API traffic is the same as with
MPS); the driver's DeviceClasses. Requests are the plugin's when their user agent is the
plugin's (``dra-driver/...``; ``OpenAPI-Generator/...`` and ``python-urllib3/...`` for plugins
before it set its own), and the benchmark's own client uses another.

1. **Idle**: once the plugin has published its slices and the first round's requests are done,
   the plugin's requests in ``--idle-s`` seconds, per minute, by verb and resource. A watch
   counts once, when it starts. The baseline in the same run: the requests the kube-scheduler
   and kube-controller-manager made in the same window (user agents ``kube-scheduler/...``,
   ``kube-controller-manager/...``), for scale.
2. **Per claim**: ``--claims`` pods, each with a ``gpu-eighth`` claim from a template,
   scheduled by the real kube-scheduler onto the Node; each claim prepared by a
   NodePrepareResources call (kubelet protocol, over the plugin's socket) and, once the
   plugin wrote its ``status.devices``, unprepared; the plugin's requests from the first
   Prepare to the last status write, divided by the claims.

Fleet cost: the idle figure times 5,000 nodes, in requests per second. Memory: the plugin's
resident set (``VmRSS``) after the idle window and after the claims, against a bare interpreter
of the same virtualenv measured in the same run.

Run: ``.venv/bin/python benchmarks/bench_api_requests.py [--idle-s 600] [--claims 20]``;
``--smoke`` uses 15 s and 2 claims (``make test`` does, numbers not checked). The last line is
``idle_requests_per_minute: <number>``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (  # noqa: E402
    RESOURCE,
    Cluster,
    load_layout,
    node_body,
    pod_body,
    wait,
)

from dra_driver import DEFAULT_DRIVER_NAME  # noqa: E402
from dra_driver._proto import dra_v1_pb2  # noqa: E402
from dra_driver.kubelet import SocketPaths  # noqa: E402
from tests.support.audit import (  # noqa: E402
    PLUGIN_AGENTS,
    audit_events,
    audited_cluster,
    requests_of,
)
from tests.support.kubelet import kubelet_connect  # noqa: E402

NODE = "bench-api-node"
NS = "bench-api"
RUN = "bench-api"
GPUS = "simulated:H200x2"
CLASS = "gpu-eighth"
BENCH_AGENT = "dra-bench/1"
OLD_AGENTS = ("OpenAPI-Generator/", "python-urllib3/")
"""User-Agents of a plugin from before it named itself (for a baseline of an older commit)."""
FLEET = 5000


@contextmanager
def running_plugin(root: Path, kubeconfig: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``dra-driver kubelet-plugin`` for :data:`NODE`, logging to ``root/plugin.log``; stopped
    (SIGTERM) at the end."""
    with (root / "plugin.log").open("ab") as log:
        plugin = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dra_driver",
                "kubelet-plugin",
                f"--node-name={NODE}",
                f"--gpus={GPUS}",
                f"--kubeconfig={kubeconfig}",
                f"--plugin-dir={root}/p",
                f"--registry-dir={root}/r",
                f"--cdi-root={root}/cdi",
                f"--state-dir={root}/s",
                f"--mps-root={root}/run",
                "--simulated-enforcer=recording",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        yield plugin
    finally:
        plugin.terminate()
        plugin.wait(30)


def template() -> dict[str, Any]:
    spec = load_layout("render-slices", None).claim_spec(CLASS)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "eighth"},
        "spec": {"spec": spec},
    }


def rss_mib(pid: int) -> float:
    """``VmRSS`` of process ``pid``, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def bare_interpreter_mib() -> float:
    """The RSS of a Python of this virtualenv that imports nothing."""
    bare = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
    try:
        time.sleep(0.5)
        return rss_mib(bare.pid)
    finally:
        bare.communicate(b"\n", timeout=10)


def show(title: str, counts: Counter[str], minutes: float) -> None:
    total = sum(counts.values())
    print(f"{title}: {total} requests in {minutes * 60:.0f} s = {total / minutes:.2f}/min")
    for what, n in sorted(counts.items()):
        print(f"  {what}: {n}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-s", type=float, default=600.0, help="idle window, seconds")
    parser.add_argument(
        "--claims", type=int, default=12, help="claims prepared (at most 16: eighths of 2 GPUs)"
    )
    parser.add_argument("--smoke", action="store_true", help="15 s idle, 2 claims")
    args = parser.parse_args()
    idle_s, claims = (15.0, 2) if args.smoke else (args.idle_s, args.claims)
    root = Path(tempfile.mkdtemp(prefix="dba", dir="/tmp"))
    try:
        with audited_cluster(root) as kubeconfig:
            cluster = Cluster(str(kubeconfig))
            cluster.api.user_agent = BENCH_AGENT
            cluster.call("POST", "/api/v1/nodes", node_body(NODE, RUN))
            cluster.put_classes(load_layout("render-slices", None).classes())
            cluster.namespace(NS)
            cluster.call("POST", f"{RESOURCE}/namespaces/{NS}/resourceclaimtemplates", template())
            with running_plugin(root, kubeconfig) as plugin:
                measure(cluster, plugin, root, idle_s, claims)
    finally:
        if os.environ.get("BENCH_KEEP") != "1":
            shutil.rmtree(root, ignore_errors=True)
    return 0


def measure(
    cluster: Cluster, plugin: subprocess.Popen[bytes], root: Path, idle_s: float, claims: int
) -> None:
    """The two windows, measured and printed (see the module's docstring)."""
    selector = {"fieldSelector": f"spec.nodeName={NODE}"}

    def published() -> bool:
        if plugin.poll() is not None:
            raise SystemExit(f"the plugin exited: {(root / 'plugin.log').read_text()[-2000:]}")
        return bool(cluster.call("GET", f"{RESOURCE}/resourceslices", query=selector)["items"])

    wait("the plugin's slices", published, 120, 0.2)
    time.sleep(5)  # the first round's requests (the slice watch starting) are done
    start = time.time()
    time.sleep(idle_s)
    end = time.time()
    rss_started = rss_mib(plugin.pid)
    paths = SocketPaths.for_driver(DEFAULT_DRIVER_NAME, f"{root}/p", f"{root}/r")
    kubelet = kubelet_connect(paths)
    names = [f"pod-{i}" for i in range(claims)]
    for name in names:
        cluster.create_pod(NS, pod_body(name, {"resourceClaimTemplateName": "eighth"}, False))
    wait(
        "pods scheduled",
        lambda: (
            all(p["spec"].get("nodeName") for p in cluster.list_pods(NS))
            and len(cluster.list_pods(NS)) == claims
        ),
        120,
        0.2,
    )
    refs = [
        dra_v1_pb2.Claim(namespace=NS, name=c["metadata"]["name"], uid=c["metadata"]["uid"])
        for c in cluster.list_claims(NS)
    ]
    claim_start = time.time()
    for ref in refs:
        reply = kubelet.v1.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=60
        )
        errors = [r.error for r in reply.claims.values() if r.error]
        if errors:
            raise SystemExit(f"prepare failed: {errors}")
    wait(
        "device status written",
        lambda: all((c.get("status") or {}).get("devices") for c in cluster.list_claims(NS)),
        60,
        0.2,
    )
    for ref in refs:
        kubelet.v1.NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[ref]), timeout=60
        )
    time.sleep(2)
    claim_end = time.time()
    rss_claims = rss_mib(plugin.pid)
    kubelet.channel.close()
    events = audit_events(root / "audit.log")
    minutes = (end - start) / 60
    idle = requests_of(events, PLUGIN_AGENTS + OLD_AGENTS, start, end)
    others = requests_of(events, ("kube-scheduler/", "kube-controller-manager/"), start, end)
    per_claim = requests_of(events, PLUGIN_AGENTS + OLD_AGENTS, claim_start, claim_end)
    show("plugin idle", idle, minutes)
    show("baseline: scheduler + controller-manager idle", others, minutes)
    show(
        f"plugin with {claims} claims prepared and unprepared",
        per_claim,
        (claim_end - claim_start) / 60,
    )
    rate = sum(idle.values()) / minutes
    bare = bare_interpreter_mib()
    print(
        f"plugin RSS: {rss_started:.1f} MiB after start, {rss_claims:.1f} MiB after {claims} "
        f"claims (a bare interpreter: {bare:.1f} MiB)"
    )
    print(f"api_requests_per_claim: {sum(per_claim.values()) / claims:.2f}")
    print(f"fleet_idle_requests_per_second ({FLEET} nodes): {rate * FLEET / 60:.1f}")
    print(f"idle_requests_per_minute: {rate:.2f}")


if __name__ == "__main__":
    sys.exit(main())
