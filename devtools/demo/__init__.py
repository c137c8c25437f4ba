"""`make demo`: GPU fractions end to end on a local Kubernetes cluster with a real node.

1. builds the container images (hack/build-image: the plugin, the sandbox image, a busybox and
   the tenant image) and the cluster's binaries (hack/build-k8s, kubectl included), then
   starts kube-apiserver, kube-scheduler, kube-controller-manager and etcd plus one real node,
   gpu-node-1: a kubelet with containerd and runc (hack/local-cluster, hack/local-node). Build
   output goes to the log file; one line per step is shown;
2. installs the driver with its Helm chart (deployments/helm/gpu-fraction-dra, values
   deployments/helm/demo-values.yaml: two simulated H200 GPUs, compute mode auto): the
   DaemonSets run the plugin image on the node, the MPS node service (the MPS emulator on this
   GPU-less node) and the kubelet plugin, which registers with the kubelet and publishes
   ResourceSlices;
3. shows the ResourceSlices and applies the example workloads (demo/*.yaml);
4. shows which pod got which fraction of which GPU and, from inside each container, what it
   sees of it: its /dev/nvidia* nodes, its memory and mode variables, its MPS pipe mount, and
   the tenant probe's own line (the memory limit and SM percentage its MPS namespace gave it,
   the MPS server's PID); and the kubelet's event for the misconfigured pod;
5. restarts the plugin (deletes its pod) and shows that every probe stayed connected to the
   same MPS server;
6. deletes the pods and shows that the kubelet's unprepare removed every CDI spec, checkpoint
   record and pipe directory (with --keep-cluster the pods stay, and the command that removes
   them is printed);
7. tears everything down (also on errors and Ctrl-C). Logs are kept and their path printed.

Usage: .venv/bin/python hack/demo [--keep-cluster]
"""

from __future__ import annotations

from devtools.demo.cli import main
from devtools.demo.cluster import kept_server
from devtools.demo.common import gib, is_progress
from devtools.demo.show import capacity_text, event_source, refusals
from devtools.demo.steps import run_demo

__all__ = [
    "capacity_text",
    "event_source",
    "gib",
    "is_progress",
    "kept_server",
    "main",
    "refusals",
    "run_demo",
]
