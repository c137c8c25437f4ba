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

import base64
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = Path(os.environ.get("LOCAL_CLUSTER_DIR", "/tmp/dra-local-cluster")).absolute()
NODES = CLUSTER / "nodes"
CACHE = Path(os.environ.get("DRA_DRIVER_CACHE", str(Path.home() / ".cache" / "dra-driver")))
BIN = CACHE / "bin"
IMAGES = os.environ.get("LOCAL_NODE_IMAGES", str(ROOT / "build" / "images" / "*.oci.tar"))
RUNC = os.environ.get("LOCAL_NODE_RUNC", shutil.which("runc") or "/usr/sbin/runc")
SANDBOX_IMAGE = os.environ.get("LOCAL_NODE_SANDBOX_IMAGE", "localhost/pause:3.10.1")
READY_TIMEOUT = float(os.environ.get("LOCAL_NODE_READY_TIMEOUT", "120"))
CGROUP_FS = Path("/sys/fs/cgroup")
NODE_BINARIES = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr")
CNI_PLUGINS = ("bridge", "host-local", "loopback")

# Standard node paths -> directory under the node's own directory.
NODE_MOUNTS = {
    "/var/lib/kubelet": "kubelet",
    "/var/lib/containerd": "containerd-root",
    "/run/containerd": "containerd-state",
    "/var/run/cdi": "cdi",
    "/var/log/pods": "pod-logs",
    "/var/lib/gpu-fraction-dra": "gpu-fraction-state",
    "/run/gpu-fraction": "gpu-fraction-run",
    "/var/lib/cni": "cni-state",
}
DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
TAG = hashlib.sha256(str(CLUSTER).encode()).hexdigest()[:6]
"""Distinguishes this cluster's node cgroups and bridges from another cluster's."""
CLOSED_PORT = 9  # discard: nothing listens there on loopback
CREATED = Path(os.environ.get("LOCAL_NODE_REGISTRY", "/run/dra-local-node")) / "created-mountpoints"
"""Host directories that some cluster's `up` created as mount points, machine-wide: whichever
cluster's last node goes when no other node mounts them removes them."""


def log(msg: str) -> None:
    print(f"local-node: {msg}", file=sys.stderr, flush=True)


class NodeError(Exception):
    pass


def node_dir(name: str) -> Path:
    return NODES / name


def run(*args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(args), capture_output=capture, text=True, stdin=subprocess.DEVNULL)
    if check and res.returncode != 0:
        raise NodeError(
            f"{' '.join(args[:3])} failed (exit {res.returncode}): {res.stderr.strip()}"
        )
    return res


# ---------------------------------------------------------------- cgroups


def hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, named ones, and the v2 one)."""
    found = []
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if fields[2] in ("cgroup", "cgroup2") and fields[1].startswith(str(CGROUP_FS)):
                found.append(Path(fields[1]))
    return found


def cgroup_names(name: str) -> tuple[str, str]:
    """(pods cgroup root, runtime cgroup) of a node, relative to each hierarchy; unique per
    cluster directory, so two clusters' nodes of the same name never share one."""
    return f"dra-node-{TAG}-{name}", f"dra-node-{TAG}-{name}.runtime"


def make_cgroups(name: str) -> None:
    for h in hierarchies():
        for cg in cgroup_names(name):
            d = h / cg
            d.mkdir(exist_ok=True)
            if (h / "cpuset.cpus").exists():  # cpuset v1: a new cgroup starts empty
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (d / f).write_text((h / f).read_text())


def cgroup_tree(top: Path) -> list[Path]:
    """``top`` and every cgroup below it, parents first. The kubelet, containerd and runc
    remove pod cgroups meanwhile: one that vanishes between listing and reading is skipped
    (``os.walk`` ignores it; ``Path.rglob`` raises FileNotFoundError)."""
    return [Path(d) for d, _, _ in os.walk(top)]


def cgroup_pids(name: str) -> set[int]:
    pids: set[int] = set()
    for h in hierarchies():
        for cg in cgroup_names(name):
            for d in cgroup_tree(h / cg):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(p) for p in (d / "cgroup.procs").read_text().split())
    return pids


def remove_cgroups(name: str) -> list[str]:
    """rmdir the node's cgroup trees, deepest first; returns those that stayed."""
    left = []
    for h in hierarchies():
        for cg in cgroup_names(name):
            for d in sorted(cgroup_tree(h / cg), key=lambda p: -len(p.parts)):
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(str(d))
    return left


def join_cgroup(name: str, pid: int) -> None:
    runtime = cgroup_names(name)[1]
    for h in hierarchies():
        with contextlib.suppress(OSError):
            (h / runtime / "cgroup.procs").write_text(f"{pid}\n")


# ---------------------------------------------------------------- files


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


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_index(name: str) -> int:
    """A small number per node (bridge name, pod subnet), stable while the node exists."""
    f = node_dir(name) / "index"
    if f.exists():
        return int(f.read_text())
    taken = {int(p.read_text()) for p in NODES.glob("*/index") if p.read_text().strip()}
    idx = next(i for i in range(1, 250) if i not in taken)
    f.write_text(f"{idx}\n")
    return idx


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


def bridge_name(idx: int) -> str:
    return f"drn{TAG}{idx}"  # at most 15 characters (IFNAMSIZ)


# ---------------------------------------------------------------- processes


def read_pid(d: Path, comp: str) -> int | None:
    try:
        return int((d / "run" / f"{comp}.pid").read_text())
    except (OSError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def start_holder(name: str, d: Path) -> int:
    """The process that keeps the node's mount namespace open, with its bind mounts."""
    # The host's / may be private (no systemd here), and then `--propagation slave` leaves it
    # private in the node; runc refuses HostToContainer mounts (the chart's host-root mount)
    # from a private mount. Shared inside the node's namespace only: no peer of the host's.
    script = ["set -e", "mount --make-rshared /"]
    created = []
    for target, sub in node_mounts(kubelet_root(d)).items():
        src = d / sub
        src.mkdir(parents=True, exist_ok=True)
        real = Path(os.path.realpath(target))
        if not real.exists():
            real.mkdir(parents=True)
            created.append(str(real))
        script.append(f"mount --bind {shlex.quote(str(src))} {shlex.quote(str(real))}")
    CREATED.parent.mkdir(parents=True, exist_ok=True)
    with open(CREATED, "a") as f:  # removed when the last node of any cluster goes
        f.writelines(p + "\n" for p in created)
    script.append("exec sleep infinity")
    cmd = ["unshare", "--mount", "--propagation", "slave", "--", "/bin/sh", "-c", "\n".join(script)]
    with open(d / "logs" / "holder.log", "ab") as err:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True,
        )  # fmt: skip
    join_cgroup(name, proc.pid)
    (d / "run" / "holder.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the namespace is ready once `sleep` runs in it
        with contextlib.suppress(OSError):
            if Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep":
                return proc.pid
        if proc.poll() is not None:
            raise NodeError(f"node holder exited: {(d / 'logs' / 'holder.log').read_text()}")
        time.sleep(0.02)
    raise NodeError("node holder did not start within 10s")


def in_node(d: Path, argv: list[str]) -> list[str]:
    holder = read_pid(d, "holder")
    if not alive(holder):
        raise NodeError(f"node {d.name} is not running (no holder process)")
    return ["nsenter", f"--mount=/proc/{holder}/ns/mnt", "--", *argv]


def start_component(name: str, d: Path, comp: str, argv: list[str]) -> int:
    with open(d / "logs" / f"{comp}.log", "ab") as out:
        proc = subprocess.Popen(
            in_node(d, argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=d,
        )  # fmt: skip
    join_cgroup(name, proc.pid)
    (d / "run" / f"{comp}.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def containerd_argv(d: Path) -> list[str]:
    return [str(BIN / "containerd"), "--config", str(d / "containerd.toml"), "--log-level", "warn"]


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


def kubelet_argv(name: str, d: Path) -> list[str]:
    labels = os.environ.get("LOCAL_NODE_LABELS", "")
    root = kubelet_root(d)
    return [
        str(BIN / "kubelet"),
        *([f"--root-dir={root}"] if root != DEFAULT_KUBELET_ROOT else []),
        f"--config={d / 'kubelet.yaml'}",
        f"--kubeconfig={d / 'kubelet.kubeconfig'}",
        f"--hostname-override={name}",
        *([f"--node-labels={labels}"] if labels else []),
        "--v=1",
    ]


def ctr(d: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "ctr"), "--address", CONTAINERD_SOCKET, "-n", "k8s.io", *args]
    return run(*in_node(d, argv))


def wait_containerd(d: Path, deadline: float) -> None:
    while True:
        res = subprocess.run(
            in_node(d, [str(BIN / "ctr"), "--address", CONTAINERD_SOCKET, "version"]),
            capture_output=True, text=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if res.returncode == 0:
            return
        if not alive(read_pid(d, "containerd")) or time.monotonic() > deadline:
            raise NodeError(f"containerd did not start:\n{tail(d / 'logs' / 'containerd.log')}")
        time.sleep(0.2)


def import_images(d: Path) -> list[str]:
    import glob

    done = []
    for archive in sorted(glob.glob(IMAGES)):
        ctr(d, "images", "import", "--no-unpack=false", archive)
        done.append(Path(archive).name)
    return done


def node_api(name: str, method: str = "GET") -> dict[str, object]:
    """The Node object through the API as cluster admin (stdlib HTTPS).

    Raises:
        OSError: the API server is unreachable or answered an error (e.g. 404).
    """
    import ssl
    import urllib.request

    port = json.loads((CLUSTER / "ports.json").read_text())["apiserver"]
    ctx = ssl.create_default_context(cafile=str(pki("ca.crt")))
    ctx.load_cert_chain(str(pki("admin.crt")), str(pki("admin.key")))
    url = f"https://127.0.0.1:{port}/api/v1/nodes/{name}"
    req = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
        body: dict[str, object] = json.loads(r.read())
    return body


def kubectl_node_ready(name: str) -> tuple[bool, str]:
    """Whether the Node is Ready, and the condition's message."""
    try:
        node = node_api(name)
    except (OSError, ValueError) as exc:
        return False, str(exc)
    status = node.get("status")
    conditions = status.get("conditions", []) if isinstance(status, dict) else []
    for c in conditions:
        if c.get("type") == "Ready":
            return c.get("status") == "True", c.get("message", "")
    return False, "no Ready condition yet"


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ---------------------------------------------------------------- commands


def check_prerequisites() -> None:
    missing = [b for b in (*NODE_BINARIES, *CNI_PLUGINS) if not os.access(BIN / b, os.X_OK)]
    if missing:
        res = subprocess.run([str(ROOT / "hack" / "build-k8s"), *NODE_BINARIES, *CNI_PLUGINS])
        if res.returncode != 0:
            raise NodeError("hack/build-k8s failed; see its output above")
    if not os.access(RUNC, os.X_OK):
        raise NodeError(f"runc not found at {RUNC} (Debian: apt-get install -y runc)")
    for tool in ("unshare", "nsenter", "ip", "openssl"):
        if shutil.which(tool) is None:
            raise NodeError(f"{tool} is required (Debian: util-linux, iproute2, openssl)")
    if not (CLUSTER / "ports.json").exists():
        raise NodeError(f"no control plane in {CLUSTER}; run 'hack/local-cluster up' first")


def up(name: str) -> None:
    d = node_dir(name)
    if alive(read_pid(d, "kubelet")) and alive(read_pid(d, "containerd")):
        log(f"{name}: already up")
        return
    if d.exists():
        down(name, quiet=True)
    t0 = time.monotonic()
    for sub in ("run", "logs"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    root = os.environ.get("LOCAL_NODE_KUBELET_ROOT_DIR", DEFAULT_KUBELET_ROOT)
    if not root.startswith("/") or os.path.normpath(root) != root:
        raise NodeError(f"LOCAL_NODE_KUBELET_ROOT_DIR {root!r} is not a normalized absolute path")
    (d / "kubelet-root-dir").write_text(root + "\n")
    make_cgroups(name)
    make_kubelet_credentials(name, d)
    ports = write_configs(name, d)
    start_holder(name, d)
    deadline = time.monotonic() + READY_TIMEOUT
    start_component(name, d, "containerd", containerd_argv(d))
    wait_containerd(d, deadline)
    t1 = time.monotonic()
    imported = import_images(d)
    t2 = time.monotonic()
    start_component(name, d, "kubelet", kubelet_argv(name, d))
    wait_ready(name, d, deadline)
    log(
        f"{name}: Ready in {time.monotonic() - t0:.1f}s (containerd {t1 - t0:.1f}s, images "
        f"{t2 - t1:.1f}s [{', '.join(imported) or 'none'}], kubelet "
        f"{time.monotonic() - t2:.1f}s); kubelet port {ports['kubelet']}; dir {d}"
    )


def wait_ready(name: str, d: Path, deadline: float) -> None:
    detail = ""
    while True:
        ok, detail = kubectl_node_ready(name)
        if ok:
            return
        for comp in ("containerd", "kubelet"):
            if not alive(read_pid(d, comp)):
                raise NodeError(f"{name}: {comp} exited:\n{tail(d / 'logs' / f'{comp}.log')}")
        if time.monotonic() > deadline:
            raise NodeError(
                f"{name}: not Ready after {READY_TIMEOUT:.0f}s ({detail});"
                f" kubelet log:\n{tail(d / 'logs' / 'kubelet.log')}"
            )
        time.sleep(0.3)


def restart_kubelet(name: str) -> None:
    d = node_dir(name)
    pid = read_pid(d, "kubelet")
    if alive(pid):
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    start_component(name, d, "kubelet", kubelet_argv(name, d))
    wait_ready(name, d, time.monotonic() + READY_TIMEOUT)
    log(f"{name}: kubelet restarted")


def kill_node_processes(name: str, d: Path) -> int:
    """SIGKILL every process of the node: its cgroups, then the recorded PIDs. Returns count."""
    killed: set[int] = set()
    for _ in range(50):
        pids = cgroup_pids(name)
        for comp in ("holder", "containerd", "kubelet"):
            pid = read_pid(d, comp)
            if pid is not None and alive(pid) and pid_in_node(pid, name):
                pids.add(pid)
        pids = {p for p in pids if alive(p)}
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        time.sleep(0.1)
    return len(killed)


def describe(pid: int) -> str:
    """``comm`` and state of a process, e.g. ``sleep Z`` (a zombie its parent never reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    return f"{comm} {stat.rsplit(')', 1)[-1].split()[0]}"


def pid_in_node(pid: int, name: str) -> bool:
    """Whether a recorded PID still belongs to the node (guards against PID reuse)."""
    try:
        cgroups = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    return f"/{cgroup_names(name)[1]}" in cgroups or f"/{cgroup_names(name)[0]}/" in cgroups


def down(name: str, quiet: bool = False) -> list[str]:
    """Remove the node: processes, cgroups, bridge, mount points, directory. Returns leftovers."""
    d = node_dir(name)
    n = 0
    deadline = time.monotonic() + 20
    while True:  # processes still exiting (or a late child cgroup) keep a cgroup busy a while
        n += kill_node_processes(name, d)
        leftovers = remove_cgroups(name)
        if not leftovers or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    leftovers += [f"process {p} ({describe(p)})" for p in sorted(cgroup_pids(name))]
    with contextlib.suppress(OSError, ValueError):  # control plane gone or Node never made
        node_api(name, "DELETE")
    idx_file = d / "index"
    if idx_file.exists():
        bridge = bridge_name(int(idx_file.read_text()))
        if Path(f"/sys/class/net/{bridge}").exists():
            run("ip", "link", "delete", bridge, check=False)
        if Path(f"/sys/class/net/{bridge}").exists():
            leftovers.append(f"interface {bridge}")
    shutil.rmtree(d, ignore_errors=True)
    if d.exists():
        leftovers.append(str(d))
    if not quiet:
        log(
            f"{name}: removed ({n} processes killed)"
            + (f"; left: {leftovers}" if leftovers else "")
        )
    return leftovers


def mounted_elsewhere() -> set[str]:
    """Mount points of every mount namespace on the machine but ours (other clusters' nodes).

    Removing a directory that is a mount point in another namespace detaches that mount
    there, so such directories are left alone."""
    own = os.readlink("/proc/self/ns/mnt")
    seen, points = {own}, set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ns = os.readlink(proc / "ns" / "mnt")
            if ns in seen:
                continue
            seen.add(ns)
            points |= {line.split()[4] for line in (proc / "mountinfo").read_text().splitlines()}
        except OSError:
            continue
    return points


def remove_mountpoints() -> list[str]:
    """Once this cluster has no node: remove the host directories nodes created as mount
    points, unless a node of another cluster still mounts them (then its last node does)."""
    left = []
    if CREATED.exists():
        busy = mounted_elsewhere()
        keep = []
        for p in sorted(set(CREATED.read_text().split()), key=len, reverse=True):
            if p in busy:
                keep.append(p)
                continue
            try:
                Path(p).rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                left.append(f"{p} ({exc.strerror})")
        if keep:
            CREATED.write_text("".join(p + "\n" for p in keep))
        else:
            CREATED.unlink()
    if NODES.is_dir() and not any(NODES.iterdir()):
        NODES.rmdir()
    return left


def leftovers() -> list[str]:
    """What this cluster's nodes left on the machine (after `down`): processes, cgroups and
    bridges of this cluster, and content in the host directories that nodes mount over."""
    found = []
    prefix = f"dra-node-{TAG}-"
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if f"/{prefix}" in (proc / "cgroup").read_text():
                    found.append(f"process {proc.name} ({(proc / 'comm').read_text().strip()})")
    for h in hierarchies():
        found += [f"cgroup {c}" for c in h.glob(f"{prefix}*")]
    found += [f"interface {i.name}" for i in Path("/sys/class/net").glob(f"drn{TAG}*")]
    busy = mounted_elsewhere()
    for target in NODE_MOUNTS:
        real = os.path.realpath(target)
        if real not in busy and os.path.isdir(real) and os.listdir(real):
            found.append(f"files on the host under {real} (a node wrote outside its directory)")
    return found


def node_names() -> list[str]:
    return sorted(p.name for p in NODES.iterdir() if p.is_dir()) if NODES.is_dir() else []


def status() -> int:
    names = node_names()
    if not names:
        print(f"no nodes in {NODES}")
        return 3
    rc = 0
    for name in names:
        d = node_dir(name)
        parts = []
        for comp in ("holder", "containerd", "kubelet"):
            ok = alive(read_pid(d, comp))
            rc |= 0 if ok else 1
            parts.append(f"{comp} {'running' if ok else 'DOWN'}")
        ready, detail = kubectl_node_ready(name)
        print(f"{name:16} {', '.join(parts)}; Ready={ready} {detail[:80]}")
    return rc


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(__doc__, file=sys.stderr)
        return 0 if len(argv) >= 2 else 2
    cmd, names = argv[1], argv[2:]
    try:
        if cmd == "up" and names:
            for name in names:
                if not NODE_NAME.fullmatch(name):
                    raise NodeError(
                        f"node name {name!r} is not a lower-case DNS label (a-z, 0-9, '-', at "
                        "most 63 characters, starting and ending with a letter or digit)"
                    )
            check_prerequisites()
            for name in names:
                up(name)
        elif cmd == "down":
            left = [x for name in (names or node_names()) for x in down(name)]
            if not node_names():
                left += remove_mountpoints()
            return 1 if left else 0
        elif cmd == "restart-kubelet" and len(names) == 1:
            restart_kubelet(names[0])
        elif cmd == "images" and len(names) == 1:
            log(f"{names[0]}: imported {', '.join(import_images(node_dir(names[0]))) or 'nothing'}")
        elif cmd == "status":
            return status()
        elif cmd == "leftovers":
            found = leftovers()
            print("\n".join(found) or "nothing left")
            return 1 if found else 0
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except NodeError as e:
        log(f"ERROR: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
