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

import base64
import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE = Path(os.environ.get("LOCAL_CLUSTER_DIR", "/tmp/dra-local-cluster")).absolute()
CACHE = Path(os.environ.get("DRA_DRIVER_CACHE", str(Path.home() / ".cache" / "dra-driver")))
BIN = CACHE / "bin"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
NODE_GRACE = os.environ.get("LOCAL_CLUSTER_NODE_GRACE", "1h")
START_TIMEOUT = float(os.environ.get("LOCAL_CLUSTER_START_TIMEOUT", "180"))
STOP_GRACE = 10.0


def log(msg: str) -> None:
    print(f"local-cluster: {msg}", file=sys.stderr, flush=True)


class UpError(Exception):
    pass


# ---------------------------------------------------------------- state helpers


def pki(name: str) -> Path:
    return STATE / "pki" / name


def pid_file(comp: str) -> Path:
    return STATE / "run" / f"{comp}.pid"


def log_file(comp: str) -> Path:
    return STATE / "logs" / f"{comp}.log"


def load_ports() -> dict[str, int] | None:
    try:
        data = json.loads((STATE / "ports.json").read_text())
    except (OSError, ValueError):
        return None
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else None


def read_pid(comp: str) -> int | None:
    try:
        return int(pid_file(comp).read_text().strip())
    except (OSError, ValueError):
        return None


def pid_is_ours(pid: int) -> bool:
    """True if pid is alive and is one of our components for this state dir.

    The command line of every component names a file under STATE, which guards
    against a recycled PID."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":  # zombie: exited
        return False
    args = raw.decode(errors="replace").split("\0")
    exe = os.path.basename(args[0]) if args else ""
    return exe in COMPONENTS and any(str(STATE) + "/" in a for a in args)


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


# ---------------------------------------------------------------- PKI


def openssl(*args: str) -> None:
    res = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise UpError(f"openssl {' '.join(args[:2])} failed: {res.stderr.strip()}")


def make_pki() -> None:
    if shutil.which("openssl") is None:
        raise UpError("the openssl CLI is required (Debian: apt-get install -y openssl)")
    d = STATE / "pki"
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.crt"),
        "-days",
        "3650",
        "-subj",
        "/CN=dra-local-cluster-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )

    def leaf(name: str, subj: str, eku: str, sans: str | None = None) -> None:
        ext = [
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-addext",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            "-addext",
            f"extendedKeyUsage={eku}",
        ]
        if sans:
            ext += ["-addext", f"subjectAltName={sans}"]
        openssl(
            "req",
            "-x509",
            *ec,
            "-CA",
            str(d / "ca.crt"),
            "-CAkey",
            str(d / "ca.key"),
            "-keyout",
            str(d / f"{name}.key"),
            "-out",
            str(d / f"{name}.crt"),
            "-days",
            "3650",
            "-subj",
            subj,
            *ext,
        )

    sans = ",".join(
        [
            "IP:127.0.0.1",
            f"IP:{SERVICE_IP}",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ]
    )
    leaf("apiserver", "/CN=kube-apiserver", "serverAuth", sans)
    leaf("admin", "/O=system:masters/CN=kubernetes-admin", "clientAuth")
    leaf("controller-manager", "/CN=system:kube-controller-manager", "clientAuth")
    leaf("scheduler", "/CN=system:kube-scheduler", "clientAuth")
    # Service-account token signing key pair.
    openssl(
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-out",
        str(d / "sa.key"),
    )
    openssl("pkey", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub"))
    for f in d.glob("*.key"):
        f.chmod(0o600)


def write_kubeconfig(path: Path, user: str, server: str) -> None:
    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    path.write_text(
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        "- name: local\n"
        "  cluster:\n"
        f"    server: {server}\n"
        f"    certificate-authority-data: {b64(pki('ca.crt'))}\n"
        "users:\n"
        f"- name: {user}\n"
        "  user:\n"
        f"    client-certificate-data: {b64(pki(user + '.crt'))}\n"
        f"    client-key-data: {b64(pki(user + '.key'))}\n"
        "contexts:\n"
        "- name: local\n"
        "  context:\n"
        "    cluster: local\n"
        f"    user: {user}\n"
        "current-context: local\n"
    )
    path.chmod(0o600)


# ---------------------------------------------------------------- HTTP probes


def admin_ssl() -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki("ca.crt")))
    ctx.load_cert_chain(str(pki("admin.crt")), str(pki("admin.key")))
    return ctx


def insecure_ssl() -> ssl.SSLContext:
    # Scheduler and controller-manager serve /healthz with a self-signed cert.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


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


# ---------------------------------------------------------------- processes


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


# Processes started by this invocation of `up`. Right after fork, /proc/PID/cmdline is
# still the Python parent's, so for these the Popen object is the source of truth.
STARTED: dict[int, subprocess.Popen[bytes]] = {}


def alive(pid: int) -> bool:
    proc = STARTED.get(pid)
    if proc is not None:
        return proc.poll() is None
    return pid_is_ours(pid)


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


# ---------------------------------------------------------------- commands


class Lock:
    """Serializes up/down for one state dir (the lock file sits beside it)."""

    def __enter__(self) -> Lock:
        STATE.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(str(STATE) + ".lock", "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


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
        print(__doc__, file=sys.stderr)
        return 0 if len(argv) == 2 and argv[1] in ("-h", "--help", "help") else 2
    return cmds[argv[1]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
