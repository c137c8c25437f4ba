"""Packing with the real kube-scheduler: how full one 8 x H200 node (``--gpus``) gets before a
claim stays Pending.

Per seed: a fresh kubelet-less node with the layout's slices; claims arrive one at a time,
each of a size drawn (seeded, uniform) from ``--sizes`` (portions of a card; a size maps to
the product class ``gpu-eighth``/``-quarter``/``-half``/``-full``, written as the layout's
``claim_spec``), as a ResourceClaim plus a pod using it. The default layout is
``render-slices`` (the driver's published model, with its DeviceClasses and its sizing
MutatingAdmissionPolicy installed: a claim names only the class, the API server writes its
slots); ``file:benchmarks/layouts/products_v1.py`` is the layout before issue 11. Each pod
is waited for until it is bound or the scheduler marks it PodScheduled=False/Unschedulable
(or ``--wait`` seconds pass, counted as Pending). At the first Pending pod the run stops and
reports the share of the node's GPU memory allocated: sum of the sizes of the bound claims /
GPUs (a fraction, 1.0 = every card full).

Measured for the issue-11 note (Kube-DC-like mix, then with eighths; 2 shared cores):
    .venv/bin/python benchmarks/bench_packing.py --sizes 0.25,0.5,1 [--layout L]
    .venv/bin/python benchmarks/bench_packing.py --sizes 0.125,0.25,0.5,1 [--layout L]
with L = render-slices (default) and file:benchmarks/layouts/products_v1.py.

Usage: .venv/bin/python benchmarks/bench_packing.py [--layout render-slices|file:PATH]
    [--config NODE_CONFIG] [--seeds 5] [--sizes 0.25,0.5,1] [--gpus 8] [--kubeconfig PATH]
    [--smoke]

--smoke fills a 1-GPU node for seed 1 only (the integration tests run it against their
control plane with --kubeconfig; numbers not checked). The last line is
``packing_mean_allocated_share: <fraction>`` (mean over the seeds).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

CLASS_OF = {size: f"gpu-{stem}" for stem, size in benchlib.PRODUCT_SIZES.items()}


def place(cluster: benchlib.Cluster, ns: str, name: str, spec: dict[str, Any], wait: float) -> bool:
    """Create claim and pod ``name``; True once bound, False once Unschedulable or timed out."""
    cluster.create_claim(ns, name, spec)
    cluster.create_pod(ns, benchlib.pod_body(name, {"resourceClaimName": name}, False))

    def outcome() -> str | None:
        pod = cluster.read_pod(ns, name)
        if pod["spec"].get("nodeName"):
            return "bound"
        return "pending" if benchlib.unschedulable(pod) else None

    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        result = outcome()
        if result is not None:
            return result == "bound"
        time.sleep(0.05)
    return False


def fill(
    cluster: benchlib.Cluster,
    layout: benchlib.Layout,
    run: str,
    seed: int,
    sizes: list[float],
    wait: float,
    gpus: int,
) -> tuple[float, list[float]]:
    """One seed on a fresh node of ``gpus`` GPUs; returns (allocated share, sizes bound in
    order)."""
    rng = random.Random(seed)
    cluster.put_classes(layout.classes())
    cluster.put_policies(layout)
    cluster.add_nodes(layout, run, 1, gpus)
    cluster.namespace(run)
    bound: list[float] = []
    try:
        while True:
            size = rng.choice(sizes)
            if not place(
                cluster, run, f"c{len(bound):03d}", layout.claim_spec(CLASS_OF[size]), wait
            ):
                return sum(bound) / gpus, bound
            bound.append(size)
    finally:
        cluster.cleanup(run, run)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layout", default="render-slices")
    p.add_argument("--config", default=None, help="node-config file (render-slices layout)")
    p.add_argument("--seeds", type=int, default=5, help="seeds 1..N")
    p.add_argument("--sizes", default="0.25,0.5,1", help="card portions (0.125 adds eighths)")
    p.add_argument("--wait", type=float, default=20.0, help="seconds before a pod counts Pending")
    p.add_argument("--kubeconfig", default=None)
    p.add_argument("--gpus", type=int, default=8, help="GPUs of the node")
    p.add_argument("--keep-cluster", action="store_true")
    p.add_argument("--smoke", action="store_true", help="1 GPU, seed 1 (numbers not checked)")
    args = p.parse_args()
    if args.smoke:
        args.gpus, args.seeds = 1, 1
    sizes = [float(s) for s in args.sizes.split(",")]
    for s in sizes:
        if s not in CLASS_OF:
            p.error(f"--sizes: {s} is not one of {sorted(CLASS_OF)}")
    layout = benchlib.load_layout(args.layout, args.config)
    tag = f"{int(time.time()) % 100000:05d}"
    shares = []
    with benchlib.local_cluster(args.kubeconfig, args.keep_cluster) as (kubeconfig, how):
        print(f"client rate limits: {how}", flush=True)
        cluster = benchlib.Cluster(kubeconfig)
        try:
            for seed in range(1, args.seeds + 1):
                share, bound = fill(
                    cluster, layout, f"bp{tag}-{seed}", seed, sizes, args.wait, args.gpus
                )
                shares.append(share)
                print(f"seed {seed}: {share:6.1%} allocated, {len(bound)} claims bound", flush=True)
        finally:
            cluster.close()
    print(f"layout {args.layout} config {args.config} sizes {args.sizes} GPUs {args.gpus}")
    print(f"mean {statistics.mean(shares):.1%}  min {min(shares):.1%}  max {max(shares):.1%}")
    print(f"packing_mean_allocated_share: {statistics.mean(shares):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
