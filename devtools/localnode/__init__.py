"""Real Kubernetes nodes for the local cluster: a kubelet with containerd and runc.

Usage: hack/local-node up NAME... | down [NAME...] | restart-kubelet NAME | status | images NAME
       | leftovers

Each node joins the control plane of hack/local-cluster (same LOCAL_CLUSTER_DIR) and lives
in <cluster dir>/nodes/<NAME>/. It is made of:

- its own mount namespace (`unshare --mount --propagation slave`), held open by a small
  holder process. Inside it, node directories are bind-mounted over the standard paths
  (/var/lib/kubelet, /var/lib/containerd, /run/containerd, /var/run/cdi, /var/log/pods,
  /var/lib/gpu-fraction-dra, /run/gpu-fraction, /var/lib/cni), so the kubelet, containerd
  and everything a pod mounts from the host see a node of their own at the paths a real node
  has, and two nodes on one machine never share a directory. Host mounts propagate into the
  node; nothing mounted inside a node leaks out, and its mounts vanish with its processes.
- containerd (built by hack/build-k8s) with runc (Debian's package), CDI specs read from
  /var/run/cdi, the node's sandbox (pause) image pinned, a bridge CNI network that exists
  only on this machine (no gateway, no masquerading: nothing routes to or from pods).
- a kubelet (v1.37.2, built by hack/build-k8s) with a client certificate for
  system:node:<NAME> signed by the cluster CA, its own ports on 127.0.0.1 and its own cgroup
  root (/dra-node-<TAG>-<NAME> in every cgroup hierarchy, pods under it).

containerd, the kubelet and the holder run in the cgroup /dra-node-<TAG>-<NAME>.runtime (TAG: a
hash of the cluster directory, so clusters never share a cgroup or bridge); shims and
containers end up there or under the node's cgroup root. `down` kills every process in both
cgroup subtrees (which also catches containers whose shim was killed), removes the cgroups,
the bridge interface, the node's directory and every mount point it created on the host;
it works after a crashed run too, from the files under nodes/ alone. `leftovers` lists what
would still be there (the e2e suite runs it after `down`).

Labels: LOCAL_NODE_LABELS (kubelet --node-labels syntax, default none), e.g.
nvidia.com/gpu.present=true to match the chart's default node selector.

Kubelet root directory: LOCAL_NODE_KUBELET_ROOT_DIR (default /var/lib/kubelet) is the
kubelet's --root-dir; the node's kubelet directory is mounted there, and an empty directory
of the node's own over /var/lib/kubelet.

Images: no registry is reachable. `up` imports every OCI archive in LOCAL_NODE_IMAGES
(default: build/images/*.oci.tar of this repository, made by `make image`) into the node's
containerd (namespace k8s.io); `images NAME` re-imports them into a running node.

Only the Python standard library, the openssl CLI and util-linux/iproute2 are used.
"""

from __future__ import annotations

from devtools.localnode.cgroups import cgroup_names, cgroup_pids, remove_cgroups
from devtools.localnode.cli import main
from devtools.localnode.common import free_port

__all__ = ["cgroup_names", "cgroup_pids", "free_port", "main", "remove_cgroups"]
