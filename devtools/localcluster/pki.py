"""The cluster's certificates (a CA, the API server's serving certificate, the components' and the
admin's client certificates, by the openssl CLI) and the kubeconfigs that carry them."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
from pathlib import Path

from devtools.localcluster.common import SERVICE_IP, STATE, UpError, pki


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
