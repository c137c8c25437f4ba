"""The node's configuration: the kubelet's client certificate signed by the cluster CA, the
kubelet, containerd and CNI configuration files, the node's mount table."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from devtools.localnode.cgroups import cgroup_names
from devtools.localnode.common import (
    BIN,
    CLOSED_PORT,
    CLUSTER,
    CNI_PLUGINS,
    CONTAINERD_SOCKET,
    DEFAULT_KUBELET_ROOT,
    NODE_MOUNTS,
    RUNC,
    SANDBOX_IMAGE,
    bridge_name,
    free_port,
    node_index,
    run,
)


def pki(name: str) -> Path:
    return CLUSTER / "pki" / name


def make_kubelet_credentials(name: str, d: Path) -> None:
    key, crt = d / "pki" / "kubelet-client.key", d / "pki" / "kubelet-client.crt"
    key.parent.mkdir(parents=True, exist_ok=True)
    run(
        "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-CA", str(pki("ca.crt")), "-CAkey", str(pki("ca.key")),
        "-keyout", str(key), "-out", str(crt), "-days", "3650",
        "-subj", f"/O=system:nodes/CN=system:node:{name}",
        "-addext", "basicConstraints=critical,CA:FALSE",
        "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
        "-addext", "extendedKeyUsage=clientAuth",
    )  # fmt: skip
    key.chmod(0o600)
    server = json.loads((CLUSTER / "ports.json").read_text())["apiserver"]

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    kubeconfig = d / "kubelet.kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n"
        f"    server: https://127.0.0.1:{server}\n"
        f"    certificate-authority-data: {b64(pki('ca.crt'))}\n"
        f"users:\n- name: kubelet\n  user:\n    client-certificate-data: {b64(crt)}\n"
        f"    client-key-data: {b64(key)}\n"
        "contexts:\n- name: local\n  context: {cluster: local, user: kubelet}\n"
        "current-context: local\n"
    )
    kubeconfig.chmod(0o600)


def write_configs(name: str, d: Path) -> dict[str, int]:
    idx = node_index(name)
    ports = {"kubelet": free_port(), "healthz": free_port()}
    (d / "ports.json").write_text(json.dumps(ports) + "\n")
    cni_conf = d / "cni-conf"
    cni_conf.mkdir(exist_ok=True)
    (cni_conf / "10-dra-node.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": f"dra-node-{name}",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": bridge_name(idx),
                        "isGateway": False,
                        "ipMasq": False,
                        "hairpinMode": False,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": f"10.244.{idx}.0/24"}]],
                            "dataDir": "/var/lib/cni/networks",
                        },
                    }
                ],
            },
            indent=1,
        )
    )
    registry_dir = d / "registry-hosts"
    (registry_dir / "_default").mkdir(parents=True, exist_ok=True)
    (registry_dir / "_default" / "hosts.toml").write_text(
        f'server = "http://127.0.0.1:{CLOSED_PORT}"\n'
    )
    cni_bin = d / "cni-bin"
    cni_bin.mkdir(exist_ok=True)
    for p in CNI_PLUGINS:
        target = cni_bin / p
        if not target.exists():
            target.symlink_to(BIN / p)
    (d / "containerd.toml").write_text(
        f"""version = 4
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{CONTAINERD_SOCKET}"

[plugins.'io.containerd.cri.v1.images']
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{SANDBOX_IMAGE}"
  # Every registry resolves to a closed loopback port: an image that was not imported fails
  # to pull here instead of reaching out of the machine.
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "{registry_dir}"

[plugins.'io.containerd.cri.v1.runtime']
  # The kubelet asks for oom_score_adj -998; without CAP_SYS_RESOURCE runc cannot lower it.
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["/var/run/cdi"]
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "{RUNC}"
      SystemdCgroup = false

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
    )
    pods_cgroup = cgroup_names(name)[0]
    (d / "kubelet.yaml").write_text(
        f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts cgroup v1 controllers plus cgroup2 at /sys/fs/cgroup/unified.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{pods_cgroup}
containerRuntimeEndpoint: unix://{CONTAINERD_SOCKET}
failSwapOn: false
address: 127.0.0.1
port: {ports["kubelet"]}
healthzBindAddress: 127.0.0.1
healthzPort: {ports["healthz"]}
readOnlyPort: 0
resolvConf: ""
podLogsDir: /var/log/pods
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {pki("ca.crt")}}}
authorization: {{mode: AlwaysAllow}}
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"}}
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
fileCheckFrequency: 10s
shutdownGracePeriod: 0s
"""
    )
    return ports


def kubelet_root(d: Path) -> str:
    """The node kubelet's ``--root-dir``, as ``up`` recorded it (LOCAL_NODE_KUBELET_ROOT_DIR)."""
    try:
        return (d / "kubelet-root-dir").read_text().strip()
    except OSError:
        return DEFAULT_KUBELET_ROOT


def node_mounts(root_dir: str) -> dict[str, str]:
    """:data:`NODE_MOUNTS` for a kubelet whose ``--root-dir`` is ``root_dir``: the node's
    kubelet directory goes there, and an empty one of its own over /var/lib/kubelet (what a
    driver writes there by mistake stays in the node, for a test to find)."""
    if root_dir == DEFAULT_KUBELET_ROOT:
        return dict(NODE_MOUNTS)
    return {root_dir: "kubelet", **{**NODE_MOUNTS, DEFAULT_KUBELET_ROOT: "kubelet-default"}}
