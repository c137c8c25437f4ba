"""Checks a mode-per-GPU layout (default: render-slices, the driver's published model with its
classes and sizing policy) against the real kube-scheduler on a kubelet-less node with ONE GPU;
prints what it saw, exit 1 if a check fails:

1. two ``gpu-quarter`` (time-slicing) claims are allocated the same device, as two shares
   (different shareIDs);
2. a ``gpu-quarter-sm-sharing`` claim then stays Pending (PodScheduled=False/Unschedulable);
3. once the two time-slicing pods and claims are deleted, the sm-sharing pod is bound.

Usage: .venv/bin/python benchmarks/check_modes.py [--layout render-slices|file:PATH]
    [--kubeconfig PATH] [--smoke]

The checks are already small (one node, one GPU, three pods): ``--smoke`` runs them unchanged
(the integration tests run it against their control plane with --kubeconfig). The last line
is ``check_modes_failed: <count>`` (0 when every check passed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
from bench_packing import place  # noqa: E402


def check(what: str, ok: bool) -> bool:
    print(f"{'PASS' if ok else 'FAIL'}: {what}", flush=True)
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layout", default="render-slices")
    p.add_argument("--kubeconfig", default=None)
    p.add_argument("--keep-cluster", action="store_true")
    p.add_argument("--smoke", action="store_true", help="the same checks (they are small)")
    args = p.parse_args()
    layout = benchlib.load_layout(args.layout, None)
    run = f"cm{int(time.time()) % 100000:05d}"
    results = []
    with benchlib.local_cluster(args.kubeconfig, args.keep_cluster) as (kubeconfig, _):
        cluster = benchlib.Cluster(kubeconfig)
        cluster.put_classes(layout.classes())
        cluster.put_policies(layout)
        cluster.add_nodes(layout, run, 1, 1)
        cluster.namespace(run)
        try:
            ts = [
                place(cluster, run, n, layout.claim_spec("gpu-quarter"), 20) for n in ("ts1", "ts2")
            ]
            results.append(check("two time-slicing quarter pods bound", all(ts)))
            allocs = [
                cluster.read_claim(run, n)["status"]["allocation"]["devices"]["results"][0]
                for n in ("ts1", "ts2")
            ]
            print(json.dumps(allocs))
            same = allocs[0]["device"] == allocs[1]["device"]
            shares = allocs[0].get("shareID") != allocs[1].get("shareID")
            results.append(check("both on one device as two shares", same and shares))
            sm_bound = place(cluster, run, "sm1", layout.claim_spec("gpu-quarter-sm-sharing"), 20)
            results.append(check("sm-sharing pod stays Pending (Unschedulable)", not sm_bound))
            for n in ("ts1", "ts2"):
                cluster.delete_pod(run, n)
                cluster.delete_claim(run, n)

            def sm_on_node() -> bool:
                return bool(cluster.read_pod(run, "sm1")["spec"].get("nodeName"))

            try:
                benchlib.wait("sm1 bound", sm_on_node, 60, 0.2)
                results.append(check("sm-sharing pod bound after the ts claims went", True))
            except RuntimeError:
                results.append(check("sm-sharing pod bound after the ts claims went", False))
        finally:
            cluster.cleanup(run, run)
            cluster.close()
    print(f"check_modes_failed: {results.count(False)}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
