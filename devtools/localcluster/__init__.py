"""A real, kubelet-less Kubernetes control plane on loopback, for tests and the demo.

Usage: hack/local-cluster up|down|env|status

Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built by
hack/build-k8s, which `up` runs first; it is a no-op when the binaries are current).

State lives in ${LOCAL_CLUSTER_DIR:-/tmp/dra-local-cluster}: pki/, kubeconfigs, etcd data,
one PID file per process in run/, and component logs in logs/. Ports are free loopback
ports chosen at `up`, so several clusters (different LOCAL_CLUSTER_DIR) can coexist.

Real nodes: LOCAL_CLUSTER_NODES (comma-separated names, default none) makes `up` also start
that many real nodes with hack/local-node (a kubelet with containerd and runc each), and
`down` removes every node first. Without them, Nodes are created through the API by whoever
needs them (kubelet-less nodes, e.g. for scheduler benchmarks). The node-lifecycle
controller's grace periods are set to LOCAL_CLUSTER_NODE_GRACE (default 1h), so a Node
created with a Ready condition is not marked Unknown, tainted unreachable or evicted during a
test session even if nothing heartbeats it. The TaintNodesByCondition admission plugin still
adds node.kubernetes.io/not-ready:NoSchedule on create; the controller-manager removes it
within seconds once the Node reports Ready=True.

Extra flags per component: LOCAL_CLUSTER_<COMPONENT>_ARGS (whitespace separated), with
COMPONENT one of ETCD, APISERVER, CONTROLLER_MANAGER, SCHEDULER.

Client rate limits (requests/s and burst of a component's API client; unset keeps the
component's default, which a cluster without these variables gets):
  LOCAL_CLUSTER_SCHEDULER_QPS, LOCAL_CLUSTER_SCHEDULER_BURST
      kube-scheduler --kube-api-qps / --kube-api-burst (defaults 50 / 100)
  LOCAL_CLUSTER_CM_QPS, LOCAL_CLUSTER_CM_BURST
      kube-controller-manager --kube-api-qps / --kube-api-burst (defaults 20 / 30)
Scheduler benchmarks raise them so the scheduler's allocation work, not its client's
throttling, is measured (benchmarks/bench_scheduler.py).

Only the Python standard library and the openssl CLI are used.
"""

from __future__ import annotations

from devtools.localcluster.cli import main
from devtools.localcluster.common import UpError
from devtools.localcluster.components import command

__all__ = ["UpError", "command", "main"]
