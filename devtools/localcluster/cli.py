"""``hack/local-cluster``: up | down | env | status, the nodes it asks ``hack/local-node`` for,
and the state directory's ownership check."""

from __future__ import annotations

import importlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from devtools.localcluster.common import (
    BIN,
    COMPONENTS,
    ROOT,
    START_TIMEOUT,
    STATE,
    Lock,
    UpError,
    load_ports,
    log,
    log_file,
    pid_is_ours,
    read_pid,
    tail,
)
from devtools.localcluster.components import (
    free_ports,
    health_url,
    healthy,
    is_up,
    start,
    stop_all,
    wait_default_serviceaccount,
    wait_healthy,
)
from devtools.localcluster.pki import make_pki, write_kubeconfig

OWN_ENTRIES = {
    "pki", "run", "logs", "serving", "etcd", "ports.json", "kubeconfig",
    "controller-manager.kubeconfig", "scheduler.kubeconfig", "nodes",
}  # fmt: skip


LOCAL_NODE = ROOT / "hack" / "local-node"


def local_node(*args: str) -> int:
    """Run hack/local-node for this state dir; returns its exit code."""
    env = {**os.environ, "LOCAL_CLUSTER_DIR": str(STATE)}
    return subprocess.run([sys.executable, str(LOCAL_NODE), *args], env=env).returncode


def wanted_nodes() -> list[str]:
    return [n for n in os.environ.get("LOCAL_CLUSTER_NODES", "").split(",") if n.strip()]


def check_owned() -> None:
    """Refuse to delete a directory that holds anything this script did not create."""
    foreign = sorted(p.name for p in STATE.iterdir() if p.name not in OWN_ENTRIES)
    if foreign:
        log(f"ERROR: {STATE} holds files not made by local-cluster ({', '.join(foreign[:5])});")
        log("refusing to delete it; set LOCAL_CLUSTER_DIR to a dedicated directory")
        sys.exit(1)


def ensure_binaries() -> None:
    res = subprocess.run([str(ROOT / "hack" / "build-k8s"), *COMPONENTS])
    if res.returncode != 0:
        raise UpError(f"hack/build-k8s failed (exit {res.returncode}); see its output above")
    for comp in COMPONENTS:
        if not os.access(BIN / comp, os.X_OK):
            raise UpError(f"{BIN / comp} missing after hack/build-k8s")


def bring_up() -> tuple[dict[str, int], str]:
    """Start everything; returns the ports and a summary of the time each phase took."""
    phases: list[str] = []
    t = time.monotonic()

    def phase(name: str) -> None:
        nonlocal t
        now = time.monotonic()
        phases.append(f"{name} {now - t:.1f}s")
        t = now

    for sub in ("pki", "run", "logs", "serving"):
        (STATE / sub).mkdir(parents=True, exist_ok=True)
    make_pki()
    ports = free_ports(["etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler"])
    (STATE / "ports.json").write_text(json.dumps(ports, indent=1) + "\n")
    server = f"https://127.0.0.1:{ports['apiserver']}"
    write_kubeconfig(STATE / "kubeconfig", "admin", server)
    write_kubeconfig(STATE / "controller-manager.kubeconfig", "controller-manager", server)
    write_kubeconfig(STATE / "scheduler.kubeconfig", "scheduler", server)
    phase("pki")

    deadline = time.monotonic() + START_TIMEOUT
    start("etcd", ports)
    wait_healthy(["etcd"], ports, deadline)
    phase("etcd")
    start("kube-apiserver", ports)
    wait_healthy(["kube-apiserver"], ports, deadline)
    phase("apiserver")
    start("kube-controller-manager", ports)
    start("kube-scheduler", ports)
    wait_healthy(["kube-controller-manager", "kube-scheduler"], ports, deadline)
    phase("controllers")
    wait_default_serviceaccount(ports, deadline)
    phase("default-sa")
    return ports, ", ".join(phases)


def cmd_up() -> int:
    t0 = time.monotonic()
    with Lock():
        if is_up():
            log(f"already up ({STATE})")
            print_env()
            return 0
        try:
            ensure_binaries()
        except UpError as e:
            log(f"ERROR: {e}")
            return 1
        t1 = time.monotonic()
        if STATE.exists():
            check_owned()
            local_node("down")
            stopped = stop_all(quiet=True)
            if stopped:
                log(f"stale cluster in {STATE}: stopped {', '.join(stopped)}")
            shutil.rmtree(STATE)
        for attempt in (1, 2):
            try:
                ports, phases = bring_up()
                break
            except UpError as e:
                stop_all(quiet=True)
                in_use = any("address already in use" in tail(log_file(c), 50) for c in COMPONENTS)
                if attempt == 1 and in_use:
                    log("a picked port was taken meanwhile; retrying with new ports")
                    shutil.rmtree(STATE)
                    continue
                log(f"ERROR: {e}")
                log(f"logs kept in {STATE / 'logs'}; run 'hack/local-cluster down' to clean up")
                return 1
    t2 = time.monotonic()
    for comp in COMPONENTS:
        log(f"started {comp:24} pid {read_pid(comp):<8} {health_url(comp, ports)}")
    log(f"control plane up in {t2 - t1:.1f}s ({phases}; binaries check {t1 - t0:.1f}s)")
    nodes = wanted_nodes()
    if nodes and local_node("up", *nodes) != 0:
        log(
            "ERROR: starting the real nodes failed (see above); 'hack/local-cluster down' cleans up"
        )
        return 1
    log(f"state in {STATE}")
    print_env()
    return 0


def cmd_down() -> int:
    with Lock():
        if not STATE.exists():
            log(f"nothing to stop ({STATE} does not exist)")
            return 0
        check_owned()
        nodes_left = local_node("down") != 0
        stopped = stop_all()
        shutil.rmtree(STATE, ignore_errors=True)
        # The lock file beside the state dir goes too (a waiting `up` holds the old inode).
        Path(str(STATE) + ".lock").unlink(missing_ok=True)
        if nodes_left:
            log("ERROR: some node resources could not be removed (see above)")
            return 1
        log(f"stopped {', '.join(stopped) or 'nothing (no live processes)'}; removed {STATE}")
    return 0


def print_env() -> None:
    print(f"export KUBECONFIG={shlex.quote(str(STATE / 'kubeconfig'))}")


def cmd_env() -> int:
    if not (STATE / "kubeconfig").exists():
        log(f"no cluster in {STATE}; run 'hack/local-cluster up'")
        return 1
    print_env()
    return 0


def cmd_status() -> int:
    ports = load_ports()
    if ports is None:
        print(f"down: no cluster in {STATE}")
        return 3
    all_ok = True
    for comp in COMPONENTS:
        pid = read_pid(comp)
        running = pid is not None and pid_is_ours(pid)
        ok, detail = healthy(comp, ports) if running else (False, "")
        all_ok &= ok
        state = "healthy" if ok else ("running, unhealthy" if running else "not running")
        print(f"{comp:24} pid {pid or '-':<8} {state:20} {health_url(comp, ports)}")
        if running and not ok:
            print(f"    {detail[:200]}")
    print(f"state dir {STATE}  KUBECONFIG={STATE / 'kubeconfig'}")
    if (STATE / "nodes").is_dir():
        all_ok &= local_node("status") == 0
    return 0 if all_ok else 1


def main(argv: list[str]) -> int:
    cmds = {"up": cmd_up, "down": cmd_down, "env": cmd_env, "status": cmd_status}
    if len(argv) != 2 or argv[1] not in cmds:
        print(importlib.import_module("devtools.localcluster").__doc__, file=sys.stderr)
        return 0 if len(argv) == 2 and argv[1] in ("-h", "--help", "help") else 2
    return cmds[argv[1]]()
