"""The control plane's processes: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, their command lines and client limits, started, checked healthy, stopped."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request

from devtools.localcluster.common import (
    BIN,
    COMPONENTS,
    NODE_GRACE,
    SERVICE_CIDR,
    START_TIMEOUT,
    STARTED,
    STATE,
    STOP_GRACE,
    UpError,
    alive,
    load_ports,
    log,
    log_file,
    pid_file,
    pid_is_ours,
    read_pid,
    tail,
)
from devtools.localcluster.pki import admin_ssl, insecure_ssl


def probe(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, ValueError) as e:
        return 0, str(e)


def health_url(comp: str, ports: dict[str, int]) -> str:
    return {
        "etcd": f"http://127.0.0.1:{ports['etcd']}/health",
        "kube-apiserver": f"https://127.0.0.1:{ports['apiserver']}/readyz",
        "kube-controller-manager": f"https://127.0.0.1:{ports['controller-manager']}/healthz",
        "kube-scheduler": f"https://127.0.0.1:{ports['scheduler']}/healthz",
    }[comp]


def healthy(comp: str, ports: dict[str, int]) -> tuple[bool, str]:
    if comp == "etcd":
        code, body = probe(health_url(comp, ports))
        return code == 200 and '"true"' in body, body.strip()
    ctx = admin_ssl() if comp == "kube-apiserver" else insecure_ssl()
    code, body = probe(health_url(comp, ports), ctx)
    return code == 200, body.strip()[:500]


def free_ports(names: list[str]) -> dict[str, int]:
    socks, ports = [], {}
    try:
        for n in names:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports[n] = s.getsockname()[1]
    finally:
        for s in socks:
            s.close()
    return ports


CLIENT_LIMIT_KEYS = {"kube-scheduler": "SCHEDULER", "kube-controller-manager": "CM"}
"""Component -> the infix of its LOCAL_CLUSTER_<KEY>_QPS / _BURST variables."""


def client_limit_args(comp: str) -> list[str]:
    """--kube-api-qps / --kube-api-burst from LOCAL_CLUSTER_<KEY>_QPS / _BURST (see the module
    docstring); none for an unset variable. Raises UpError for a value that is not a positive
    number (QPS) or a positive integer (burst)."""
    key = CLIENT_LIMIT_KEYS.get(comp)
    if key is None:
        return []
    args = []
    for suffix, flag, kind in (
        ("QPS", "--kube-api-qps", float),
        ("BURST", "--kube-api-burst", int),
    ):
        var = f"LOCAL_CLUSTER_{key}_{suffix}"
        value = os.environ.get(var, "").strip()
        if not value:
            continue
        try:
            ok = kind(value) > 0
        except ValueError:
            ok = False
        if not ok:
            what = "a positive number" if kind is float else "a positive integer"
            raise UpError(f"{var}={value!r}: must be {what}; unset it to keep the default")
        args.append(f"{flag}={value}")
    return args


def extra_args(comp: str) -> list[str]:
    key = comp.removeprefix("kube-").replace("-", "_").upper()
    return shlex.split(os.environ.get(f"LOCAL_CLUSTER_{key}_ARGS", ""))


def command(comp: str, p: dict[str, int]) -> list[str]:
    s = str(STATE)
    if comp == "etcd":
        peer = f"http://127.0.0.1:{p['etcd-peer']}"
        client = f"http://127.0.0.1:{p['etcd']}"
        args = [
            "--name=local",
            f"--data-dir={s}/etcd",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=local={peer}",
            "--unsafe-no-fsync=true",  # throwaway test data: durability is not needed
            "--log-level=warn",
        ]
    elif comp == "kube-apiserver":
        args = [
            f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['apiserver']}",
            "--advertise-address=127.0.0.1",
            # Loopback addresses are invalid in Endpoints: do not publish the
            # "kubernetes" service endpoints (nothing in-cluster needs them).
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={s}/pki/apiserver.crt",
            f"--tls-private-key-file={s}/pki/apiserver.key",
            f"--client-ca-file={s}/pki/ca.crt",
            "--authorization-mode=Node,RBAC",
            # Defaults (incl. ResourceQuota, ValidatingAdmissionPolicy) plus NodeRestriction.
            "--enable-admission-plugins=NodeRestriction",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={s}/pki/sa.pub",
            f"--service-account-signing-key-file={s}/pki/sa.key",
            "--allow-privileged=true",
            "--profiling=false",
        ]
    elif comp == "kube-controller-manager":
        args = [
            f"--kubeconfig={s}/controller-manager.kubeconfig",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['controller-manager']}",
            f"--cert-dir={s}/serving/controller-manager",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={s}/pki/sa.key",
            f"--root-ca-file={s}/pki/ca.crt",
            f"--cluster-signing-cert-file={s}/pki/ca.crt",
            f"--cluster-signing-key-file={s}/pki/ca.key",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--node-monitor-grace-period={NODE_GRACE}",
            f"--node-startup-grace-period={NODE_GRACE}",
            "--profiling=false",
        ]
    else:
        args = [
            f"--kubeconfig={s}/scheduler.kubeconfig",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['scheduler']}",
            f"--cert-dir={s}/serving/scheduler",
            "--leader-elect=false",
            "--profiling=false",
        ]
    return [str(BIN / comp), *args, *client_limit_args(comp), *extra_args(comp)]


def start(comp: str, ports: dict[str, int]) -> int:
    with open(log_file(comp), "ab") as logf:
        proc = subprocess.Popen(
            command(comp, ports),
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=STATE,
        )
    STARTED[proc.pid] = proc
    pid_file(comp).write_text(f"{proc.pid}\n")
    return proc.pid


def wait_healthy(comps: list[str], ports: dict[str, int], deadline: float) -> None:
    pending = list(comps)
    last: dict[str, str] = {}
    while pending:
        for comp in list(pending):
            pid = read_pid(comp)
            if pid is None or not alive(pid):
                raise UpError(
                    f"{comp} exited during startup; last log lines:\n{tail(log_file(comp))}"
                )
            ok, detail = healthy(comp, ports)
            if ok:
                pending.remove(comp)
            else:
                last[comp] = detail
        if pending and time.monotonic() > deadline:
            comp = pending[0]
            raise UpError(
                f"{comp} not healthy after {START_TIMEOUT:.0f}s ({last.get(comp, '')[:300]});"
                f" last log lines:\n{tail(log_file(comp))}"
            )
        if pending:
            time.sleep(0.2)


def wait_default_serviceaccount(ports: dict[str, int], deadline: float) -> None:
    """The serviceaccount controller works once the default SA exists; pods need it."""
    url = (
        f"https://127.0.0.1:{ports['apiserver']}/api/v1/namespaces/default/serviceaccounts/default"
    )
    ctx = admin_ssl()
    while True:
        code, _ = probe(url, ctx)
        if code == 200:
            return
        if time.monotonic() > deadline:
            raise UpError(
                "default ServiceAccount not created by kube-controller-manager;"
                f" last log lines:\n{tail(log_file('kube-controller-manager'))}"
            )
        time.sleep(0.2)


def stop_all(quiet: bool = False) -> list[str]:
    """Stop every process named by our PID files: clients first, then kube-apiserver, then
    etcd (the apiserver shuts down faster while etcd is still there). SIGTERM, then SIGKILL
    after STOP_GRACE seconds."""
    victims: dict[str, int] = {}
    for comp in COMPONENTS:
        pid = read_pid(comp)
        if pid is not None and alive(pid):
            victims[comp] = pid
    stages = [["kube-scheduler", "kube-controller-manager"], ["kube-apiserver"], ["etcd"]]
    for stage in stages:
        pids = {c: victims[c] for c in stage if c in victims}
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while time.monotonic() < deadline and any(alive(p) for p in pids.values()):
            time.sleep(0.05)
        for comp, pid in pids.items():
            if alive(pid):
                if not quiet:
                    log(f"{comp} (pid {pid}) ignored SIGTERM for {STOP_GRACE:.0f}s; SIGKILL")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(p) for p in pids.values()):
            time.sleep(0.05)
    return [f"{c}({p})" for c, p in victims.items()]


def is_up() -> bool:
    ports = load_ports()
    if ports is None:
        return False
    for comp in COMPONENTS:
        pid = read_pid(comp)
        if pid is None or not pid_is_ours(pid):
            return False
    return healthy("kube-apiserver", ports)[0]
