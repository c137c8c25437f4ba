"""A node's life: `up` (prerequisites, cgroups, configs, processes, Ready), `restart-kubelet`,
`down` (everything it made, also after a crash), `status` and `leftovers`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from devtools.localnode.cgroups import cgroup_pids, hierarchies, make_cgroups, remove_cgroups
from devtools.localnode.common import (
    BIN,
    CLUSTER,
    CNI_PLUGINS,
    CREATED,
    DEFAULT_KUBELET_ROOT,
    NODE_BINARIES,
    NODE_MOUNTS,
    NODES,
    READY_TIMEOUT,
    ROOT,
    RUNC,
    TAG,
    NodeError,
    alive,
    bridge_name,
    describe,
    log,
    node_dir,
    read_pid,
    run,
    tail,
)
from devtools.localnode.configs import make_kubelet_credentials, pki, write_configs
from devtools.localnode.processes import (
    containerd_argv,
    import_images,
    kill_node_processes,
    kubelet_argv,
    start_component,
    start_holder,
    wait_containerd,
)


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
