"""How often a new ResourceQuota on a DeviceClass is not yet enforced when a test uses it.

Each trial makes a namespace, a quota of 2 ``gpu-quarter`` devices, waits for it the way a
test does, then creates three one-device ``gpu-quarter`` claims one after another and counts
the trials in which the third was admitted (the quota was not enforced yet). Two waits,
interleaved trial by trial so machine noise hits both alike:

- ``status``: until a GET shows the quota's ``status.hard`` (what the e2e tests did before);
- ``enforced``: until a dry-run claim for 3 devices is refused with ``exceeded quota``
  (``tests/e2e/plugin_fixtures.wait_quota_enforced``; dry runs are checked, never charged).

Why ``status`` is not enough: kube-apiserver's quota admission reads quotas from its informer
(k8s.io/apiserver, admission/plugin/resourcequota, ``GetQuotas``), which can lag a GET, and a
quota whose ``status.hard`` it has not seen restricts nothing. The lag shows under CPU load:
run with a load beside it (e.g. ``stress-ng --cpu 2``) to see the difference.

Needs a control plane: ``--kubeconfig``, else a kubelet-less local one (hack/local-cluster).
Run: ``.venv/bin/python benchmarks/check_quota_admission.py [--trials 40]``; ``--smoke``: 2
trials. The last line is ``quota_status_wait_over_admitted: <count>``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchlib  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

KEY = "gpu-quarter.deviceclass.resource.k8s.io/devices"
QUOTA = "gpus"
LIMIT = 2


def quota_body() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": QUOTA},
            "spec": {"hard": {KEY: str(LIMIT)}}}  # fmt: skip


def claim_spec(count: int) -> dict[str, Any]:
    exactly = {"deviceClassName": "gpu-quarter", "allocationMode": "ExactCount", "count": count}
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def status_set(cluster: benchlib.Cluster, ns: str) -> bool:
    quota = cluster.call("GET", f"/api/v1/namespaces/{ns}/resourcequotas/{QUOTA}")
    return KEY in ((quota.get("status") or {}).get("hard") or {})


def enforced(cluster: benchlib.Cluster, ns: str) -> bool:
    body = benchlib.claim_body("probe", claim_spec(LIMIT + 1))
    try:
        cluster.call("POST", benchlib.claims_path(ns), body, {"dryRun": "All"})
    except ApiException as exc:
        return exc.status == 403 and f"exceeded quota: {QUOTA}" in str(exc.body)
    return False


def trial(cluster: benchlib.Cluster, ns: str, wait: str) -> tuple[int, float]:
    """One trial; returns (claims admitted of 3, seconds the wait took)."""
    cluster.namespace(ns)
    cluster.call("POST", f"/api/v1/namespaces/{ns}/resourcequotas", quota_body())
    t0 = time.monotonic()
    check = status_set if wait == "status" else enforced
    benchlib.wait(f"quota {wait}", lambda: check(cluster, ns), 60, 0.05)
    waited = time.monotonic() - t0

    def create(i: int) -> bool:
        try:
            cluster.create_claim(ns, f"c{i}", claim_spec(1))
        except ApiException:
            return False
        return True

    admitted = sum(create(i) for i in range(LIMIT + 1))  # one after another, as a test does
    cluster.call("DELETE", f"/api/v1/namespaces/{ns}")
    return admitted, waited


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trials", type=int, default=40, help="trials per wait")
    p.add_argument("--kubeconfig", default=None)
    p.add_argument("--keep-cluster", action="store_true")
    p.add_argument("--smoke", action="store_true", help="2 trials per wait")
    args = p.parse_args()
    trials = 2 if args.smoke else args.trials
    layout = benchlib.load_layout("render-slices", None)
    run = f"qa{int(time.time()) % 100000:05d}"
    over = {"status": 0, "enforced": 0}
    waits: dict[str, list[float]] = {"status": [], "enforced": []}
    with benchlib.local_cluster(args.kubeconfig, args.keep_cluster) as (kubeconfig, _):
        cluster = benchlib.Cluster(kubeconfig)
        cluster.put_classes(layout.classes())
        cluster.put_policies(layout)
        for i in range(trials):
            for wait in ("status", "enforced"):
                admitted, seconds = trial(cluster, f"{run}-{wait[0]}{i}", wait)
                over[wait] += admitted > LIMIT
                waits[wait].append(seconds)
        cluster.close()
    for wait in ("status", "enforced"):
        mean = sum(waits[wait]) / len(waits[wait])
        print(f"wait {wait:<8}: {over[wait]}/{trials} trials admitted a claim over the quota "
              f"(mean wait {mean * 1000:.0f} ms)")  # fmt: skip
    print(f"quota_enforced_wait_over_admitted: {over['enforced']}")
    print(f"quota_status_wait_over_admitted: {over['status']}")
    return 1 if over["enforced"] else 0


if __name__ == "__main__":
    sys.exit(main())
