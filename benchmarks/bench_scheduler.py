"""Scheduling throughput of the real kube-scheduler with a layout vs. plain whole-GPU devices.

For each node count N: create N kubelet-less 8 x H200 nodes and publish the layout's slices
(``--layout render-slices``, the default: exactly what ``dra-driver render-slices`` prints,
with the driver's DeviceClasses and its sizing MutatingAdmissionPolicy installed, so a claim
names only the class and the API server writes its slots), create P pods (default 4 per node)
each with one claim from a ResourceClaimTemplate of ``--class``, held by a scheduling gate
until the controller-manager has created all P claims, then lift the gates and time from the
first gate lifted until every pod has ``spec.nodeName`` (watch events): pods/s. The first
claim's request as stored is printed (the policy's ``capacity.requests.slots``) and checked.
The same N and P are measured in the same run with the baseline layout (8 plain devices per
node, no counters, no capacity, one device per claim), after a full cleanup (pods, claims,
slices and nodes deleted), so both start from an empty scheduler cache.

The local control plane is started with the scheduler's and controller-manager's client rate
limits raised (``--scheduler-qps/--scheduler-burst``, ``--cm-qps/--cm-burst``, default
500/1000; the component defaults are 50/100 and 20/30), so the scheduler's allocation work,
not its client's throttling, is measured; the flags the running components got are printed.

Measured for the issue-11 note (2 shared cores):
    .venv/bin/python benchmarks/bench_scheduler.py --nodes 50,150 --pods 200,600 \
        --layout render-slices --layout file:benchmarks/layouts/products_v1.py

Usage: .venv/bin/python benchmarks/bench_scheduler.py [--nodes 50,150] [--pods 200,600]
    [--layout render-slices|render-slices:NODE_CONFIG|file:PATH ...] [--config NODE_CONFIG]
    [--class gpu-quarter] [--scheduler-qps 500] [--scheduler-burst 1000] [--cm-qps 500]
    [--cm-burst 1000] [--kubeconfig PATH] [--keep-cluster] [--smoke]

--smoke measures 1 node and 4 pods per layout (the integration tests run it against their
control plane with --kubeconfig; numbers not checked). Rates are pods per second; the last
line is ``scheduler_min_ratio_to_plain: <number>``, the smallest model/baseline ratio of the
rows (0 when a rate is 0). Exit 1 when a pod was left unbound.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

GPUS = 8
BASELINE = Path(__file__).resolve().parent / "layouts" / "plain.py"


@dataclass
class Result:
    pods_per_s: float
    bound: int
    seconds: float
    ungated: float
    unschedulable: int


def measure(
    cluster: benchlib.Cluster, layout: benchlib.Layout, cls: str, run: str, nodes: int, pods: int
) -> Result:
    """One measurement on fresh nodes ``<run>-n*`` in namespace ``<run>``; cleans up after."""
    cluster.put_classes(layout.classes())
    cluster.put_policies(layout)
    try:
        cluster.add_nodes(layout, run, nodes, GPUS)
        cluster.namespace(run)
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "gpu"},
            "spec": {"spec": layout.claim_spec(cls)},
        }
        cluster.call(
            "POST", f"{benchlib.RESOURCE}/namespaces/{run}/resourceclaimtemplates", template
        )
        names = [f"p{i:04d}" for i in range(pods)]
        source = {"resourceClaimTemplateName": "gpu"}
        pod = benchlib.pod_body
        cluster.parallel(lambda n: cluster.create_pod(run, pod(n, source, True)), names)
        benchlib.wait("all claims created", lambda: len(cluster.list_claims(run)) == pods, 600, 0.5)
        check_sized(cluster.list_claims(run)[0], benchlib.layout_sized_slots(layout, cls))
        watch = benchlib.BindWatch(cluster, run, cluster.pods_resource_version(run))
        ungate = [{"op": "remove", "path": "/spec/schedulingGates"}]
        start = time.monotonic()
        cluster.parallel(lambda n: cluster.patch_pod(run, n, ungate), names)
        ungated = time.monotonic() - start
        deadline = start + 300
        while len(watch.bound) < pods and time.monotonic() < deadline and watch.alive:
            time.sleep(0.05)
        watch.close()
        if watch.error is not None or watch.restarts:
            print(f"  watch: {watch.restarts} restarts, last error {watch.error}", flush=True)
        last = max(watch.bound.values(), default=start)
        seconds = last - start
        bound = len(watch.bound)
        rate = bound / seconds if seconds else 0.0
        return Result(rate, bound, seconds, ungated, len(watch.unschedulable))
    finally:
        cluster.cleanup(run, run)


def check_sized(claim: dict[str, Any], expected: str | None) -> None:
    """Print a created claim's first request as stored; raise RuntimeError unless its
    ``capacity.requests.slots`` is ``expected`` (the sizing policy worked, or none applied)."""
    request = claim["spec"]["devices"]["requests"][0]
    print(f"  claim {claim['metadata']['name']}: {json.dumps(request)}", flush=True)
    got = benchlib.requested_slots(claim["spec"])
    if got != expected:
        raise RuntimeError(f"claim sized slots={got}, expected {expected}: is the policy on?")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", default="50,150", help="comma-separated node counts")
    p.add_argument("--pods", default=None, help="comma-separated pod counts (default 4/node)")
    p.add_argument(
        "--layout",
        action="append",
        help="render-slices (default), render-slices:NODE_CONFIG or file:PATH; repeat to"
        " measure several layouts against one baseline per node count",
    )
    p.add_argument("--config", default=None, help="node-config file (render-slices layout)")
    p.add_argument("--class", dest="cls", default="gpu-quarter", help="product class")
    p.add_argument("--scheduler-qps", default="500", help="kube-scheduler --kube-api-qps")
    p.add_argument("--scheduler-burst", default="1000", help="kube-scheduler --kube-api-burst")
    p.add_argument("--cm-qps", default="500", help="kube-controller-manager --kube-api-qps")
    p.add_argument("--cm-burst", default="1000", help="kube-controller-manager --kube-api-burst")
    p.add_argument("--kubeconfig", default=None, help="use this cluster instead of a local one")
    p.add_argument("--keep-cluster", action="store_true")
    p.add_argument("--smoke", action="store_true", help="1 node, 4 pods (numbers not checked)")
    args = p.parse_args()
    if args.smoke:
        args.nodes, args.pods = "1", "4"
    node_counts = [int(n) for n in args.nodes.split(",")]
    pod_counts = (
        [int(n) for n in args.pods.split(",")] if args.pods else [4 * n for n in node_counts]
    )
    if len(pod_counts) != len(node_counts):
        p.error("--pods needs one count per --nodes entry")
    specs = args.layout or ["render-slices"]
    layouts = [benchlib.load_layout(spec, args.config) for spec in specs]
    baseline = benchlib.load_layout(f"file:{BASELINE}", None)
    rows = []
    tag = f"{int(time.time()) % 100000:05d}"
    limits = {
        "LOCAL_CLUSTER_SCHEDULER_QPS": args.scheduler_qps,
        "LOCAL_CLUSTER_SCHEDULER_BURST": args.scheduler_burst,
        "LOCAL_CLUSTER_CM_QPS": args.cm_qps,
        "LOCAL_CLUSTER_CM_BURST": args.cm_burst,
    }
    with benchlib.local_cluster(args.kubeconfig, args.keep_cluster, limits) as (kubeconfig, how):
        print(f"client rate limits: {how}", flush=True)
        cluster = benchlib.Cluster(kubeconfig)
        try:
            for i, (nodes, pods) in enumerate(zip(node_counts, pod_counts, strict=True)):
                base = measure(cluster, baseline, "gpu-full", f"bs{tag}-{i}-base", nodes, pods)
                for j, (spec, layout) in enumerate(zip(specs, layouts, strict=True)):
                    model = measure(cluster, layout, args.cls, f"bs{tag}-{i}-m{j}", nodes, pods)
                    rows.append((spec, nodes, pods, base, model))
                    print_row(spec, nodes, pods, base, model)
        finally:
            cluster.close()
    print(f"\nconfig {args.config} class {args.cls}; client rate limits: {how}")
    print(
        "layout         nodes  pods  baseline pods/s  model pods/s  ratio"
        "  (bound/seconds, gates lifted in, unschedulable)"
    )
    for row in rows:
        print_row(*row)
    print(f"scheduler_min_ratio_to_plain: {min(ratio(b, m) for *_, b, m in rows):.2f}")
    return 0 if all(b.bound == n and m.bound == n for _, _, n, b, m in rows) else 1


def ratio(base: Result, model: Result) -> float:
    """Model pods/s over baseline pods/s (0 when the baseline bound nothing)."""
    return model.pods_per_s / base.pods_per_s if base.pods_per_s else 0.0


def print_row(spec: str, nodes: int, pods: int, base: Result, model: Result) -> None:
    label = Path(spec.removeprefix("file:")).stem if spec.startswith("file:") else spec
    print(
        f"{label:13}  {nodes:5d} {pods:5d}  {base.pods_per_s:15.1f}  {model.pods_per_s:12.1f}"
        f"  {ratio(base, model):5.2f}"
        f"  (base {base.bound}/{base.seconds:.1f}s gates {base.ungated:.1f}s"
        f" u{base.unschedulable}, model {model.bound}/{model.seconds:.1f}s"
        f" gates {model.ungated:.1f}s u{model.unschedulable})",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
