"""Build the project's container images as OCI image archives, without Docker or a registry.

Images (linux/amd64, one layer each, made only of pinned Debian bookworm packages and wheels):
  plugin   the driver: Debian's python3.11, the wheels of requirements-image.txt and the
           dra_driver package; entry point /usr/local/bin/dra-driver. No shell.
  pause    the pod sandbox image for containerd: busybox-static; sleeps until SIGTERM/SIGINT.
  busybox  a workload image with a shell: busybox-static and links for all its applets.
  tenant   the simulated tenant's workload image: busybox with its applets, Debian's python3.11
           and the tenant probe (dra_driver/mpsemu/probe.py as /usr/local/bin/tenant-probe),
           which connects to its MPS namespace as a CUDA client would.

Debian packages are pinned in devtools/image-packages.txt, fetched with `apt-get download` and
unpacked with `dpkg-deb -x` (no maintainer scripts run); wheels are pinned by version and
sha256 in requirements-image.txt and fetched with `pip download`. Both are cached under
${DRA_DRIVER_CACHE:-~/.cache/dra-driver}/images. The archives are reproducible (file times
SOURCE_DATE_EPOCH, default 0; sorted entries; owner 0:0; byte code with hash-based
invalidation): the same inputs give the same digest, and an image whose inputs did not change
is not rebuilt.

Usage:
  hack/build-image [--out DIR] [--force] [--compression gzip|none] [--plugin-ref REF]
                   [--pause-ref REF] [--busybox-ref REF] [--tenant-ref REF]
                   [plugin|pause|busybox|tenant ...]
  hack/build-image --print-ref IMAGE      the image reference that a build would use
  hack/build-image --rootfs-only DIR      only the plugin's root filesystem, into DIR
  hack/build-image --lock-hashes          re-pin the wheel hashes of requirements-image.txt

Output: build/images/<image>.oci.tar (OCI image layout, plus a manifest.json for docker load).
Load it with `ctr -n k8s.io images import build/images/plugin.oci.tar`.
Needs a Debian bookworm amd64 host (or container) with apt-get, dpkg-deb and pip.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()
PACKAGES_FILE = Path(__file__).resolve().parent / "image-packages.txt"
LOCK_FILE = ROOT / "requirements-image.txt"
PACKAGE_DIR = ROOT / "dra_driver"
IMAGES = ("plugin", "pause", "busybox", "tenant")
PROBE = PACKAGE_DIR / "mpsemu" / "probe.py"
LAUNCHERS = PACKAGE_DIR / "mpsemu" / "bin"
"""The MPS emulator's programs (``nvidia-cuda-mps-control``, ``-server``): in the plugin image
for simulated nodes, under the package, never on ``PATH``."""
"""The tenant probe, a standard-library-only script (the tenant image's program)."""
DEB_ARCH = "amd64"
TRIPLET = "x86_64-linux-gnu"
PYTHON = "python3.11"
SITE = f"usr/local/lib/{PYTHON}/dist-packages"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Wheels: CPython 3.11 on glibc 2.36 (bookworm), x86_64.
WHEEL_PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in range(36, 4, -1)] + ["manylinux2014_x86_64"]

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"

# Dropped from every image: documentation (but not the copyright files), translations and
# integration files of tools that are not there.
PRUNE = (
    "usr/share/man",
    "usr/share/info",
    "usr/share/lintian",
    "usr/share/locale",
    "usr/share/binfmts",
    "usr/lib/binfmt.d",
    "usr/share/bug",
)
# Dropped from the plugin image: glibc's iconv modules (Python has its own codecs), the
# stdlib's test and Python 2 conversion modules, the stdlib extension modules whose libraries
# are left out (curses, readline, dbm, nis, sqlite3, crypt, uuid: unused by the driver;
# importing them raises ImportError; the closure check below keeps this honest), and the
# asyncio copy of the Kubernetes client (kubernetes.aio, 68 MiB; the driver uses the
# synchronous one).
DROPPED_MODULES = (
    "_curses _curses_panel readline _dbm nis _sqlite3 _crypt _uuid _testcapi _testinternalcapi"
    " _testbuffer _testimportmultiple _testmultiphase _testclinic _ctypes_test xxlimited"
    " xxlimited_35 xxsubtype"
)
PRUNE_PLUGIN = (
    f"usr/lib/{TRIPLET}/gconv",
    f"usr/lib/{PYTHON}/lib2to3",
    f"usr/lib/{PYTHON}/pydoc_data",
    "usr/sbin/update-ca-certificates",
    f"{SITE}/kubernetes/aio",
) + tuple(
    f"usr/lib/{PYTHON}/lib-dynload/{m}.cpython-311-{TRIPLET}.so" for m in DROPPED_MODULES.split()
)

# The pause image's command: sleeps until SIGTERM or SIGINT, then exits 0 at once (a shell
# runs traps only between commands, hence the sleep in the background and `wait`). As PID 1
# it also reaps orphans (ash's wait reaps any child). Applets are called by path: the pause
# image has no applet links. If the background sleep cannot start it falls back to a
# foreground one rather than spinning.
PAUSE_SCRIPT = (
    "trap 'exit 0' TERM INT; "
    "while :; do /bin/busybox sleep 3600 & wait $! || /bin/busybox sleep 1; done"
)
ENTRY_POINT = """#!/usr/bin/python3.11
import sys

from dra_driver.app.cli import main

sys.exit(main())
"""
PASSWD = "root:x:0:0:root:/root:/sbin/nologin\n"
GROUP = "root:x:0:\n"
NSSWITCH = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n"


class BuildError(Exception):
    """A failure with a message for the user."""


def log(msg: str) -> None:
    print(f"build-image: {msg}", file=sys.stderr, flush=True)


def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a command; raise BuildError with its output when it fails."""
    proc = subprocess.run(argv, text=True, capture_output=True, **kw)
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr).strip()
        raise BuildError(f"{' '.join(argv[:3])} ... failed (exit {proc.returncode}):\n{out}")
    return proc


# --- Pins ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deb:
    name: str
    version: str

    @property
    def pin(self) -> str:
        return f"{self.name}={self.version}"


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    sha256: str


def parse_packages(text: str) -> dict[str, list[Deb]]:
    """devtools/image-packages.txt: lines ``IMAGE NAME=VERSION``; ``#`` starts a comment."""
    out: dict[str, list[Deb]] = {name: [] for name in IMAGES}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"(\S+)\s+([a-z0-9][a-z0-9+.-]+)=(\S+)", line)
        if not m or m.group(1) not in out:
            raise BuildError(f"{PACKAGES_FILE.name}:{n}: expected 'IMAGE NAME=VERSION': {raw!r}")
        out[m.group(1)].append(Deb(m.group(2), m.group(3)))
    return out


def parse_lock(text: str) -> list[Wheel]:
    """requirements-image.txt: ``name==version --hash=sha256:HEX`` (continuation lines ok)."""
    wheels = []
    for n, line in enumerate(text.replace("\\\n", " ").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(
            r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})*)", line
        )
        if not m:
            raise BuildError(f"{LOCK_FILE.name}: entry {n}: expected 'NAME==VERSION --hash=...'")
        hashes = re.findall(r"[0-9a-f]{64}", m.group(3))
        if len(hashes) != 1:
            raise BuildError(f"{LOCK_FILE.name}: {m.group(1)} needs one hash; run --lock-hashes")
        wheels.append(Wheel(normalize(m.group(1)), m.group(2), hashes[0]))
    return wheels


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        data: dict[str, Any] = tomllib.load(f)["project"]
    return data


def upstream_version(debian_version: str) -> str:
    """``1:1.35.0-4+deb12u1`` -> ``1.35.0``."""
    return debian_version.split(":", 1)[-1].rsplit("-", 1)[0]


def default_refs(packages: dict[str, list[Deb]]) -> dict[str, str]:
    busybox = next((d.version for d in packages["busybox"] if d.name == "busybox-static"), "1.36")
    return {
        "plugin": f"localhost/gpu-fraction-dra:{project()['version']}",
        "pause": "localhost/pause:3.10.1",
        "busybox": f"localhost/busybox:{upstream_version(busybox)}",
        "tenant": f"localhost/gpu-fraction-tenant:{project()['version']}",
    }


def image_config(image: str, ref: str) -> dict[str, Any]:
    """The ``config`` part of the OCI image configuration."""
    tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else ""
    if image == "plugin":
        meta = project()
        return {
            "User": "0:0",
            "Entrypoint": ["dra-driver"],
            "Cmd": ["--help"],
            "Env": [PATH_ENV, "LANG=C.UTF-8", "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1"],
            "WorkingDir": "/",
            "Labels": {
                "org.opencontainers.image.title": "gpu-fraction-dra",
                "org.opencontainers.image.description": meta["description"],
                "org.opencontainers.image.version": meta["version"],
            },
        }
    labels = {"org.opencontainers.image.title": image, "org.opencontainers.image.version": tag}
    if image == "pause":
        entry = ["/bin/busybox", "sh", "-c", PAUSE_SCRIPT]
        return {"Entrypoint": entry, "Env": [PATH_ENV], "WorkingDir": "/", "Labels": labels}
    if image == "tenant":
        env = [PATH_ENV, "LANG=C.UTF-8", "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1"]
        return {"Cmd": ["tenant-probe"], "Env": env, "WorkingDir": "/", "Labels": labels}
    return {"Cmd": ["sh"], "Env": [PATH_ENV], "WorkingDir": "/", "Labels": labels}


# --- Inputs: Debian packages and wheels ------------------------------------------------------


def fetch_debs(debs: list[Deb], cache: Path) -> list[Path]:
    """The .deb files of ``debs``, downloaded into ``cache`` with apt-get when missing."""
    cache.mkdir(parents=True, exist_ok=True)

    def cached(d: Deb) -> Path | None:
        quoted = d.version.replace(":", "%3a")
        return next(iter(sorted(cache.glob(f"{d.name}_{quoted}_*.deb"))), None)

    missing = [d for d in debs if cached(d) is None]
    if missing:
        log(f"downloading {len(missing)} Debian packages")
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            if apt_download([d.pin for d in missing], tmp).returncode != 0:
                # Which ones? One at a time, for the message.
                bad = [(d, apt_download([d.pin], tmp).stderr.strip()) for d in missing]
                lines = [f"  {d.pin}: {err.splitlines()[-1]}" for d, err in bad if err]
                names = " ".join(d.name for d, err in bad if err)
                raise BuildError(
                    "pinned Debian packages cannot be downloaded:\n"
                    + "\n".join(lines)
                    + "\nDebian replaces versions on point releases and security updates. Run"
                    f"\n  apt-get update && apt-cache policy {names}\nand set the pins in "
                    f"{PACKAGES_FILE.relative_to(ROOT)} to the Candidate versions."
                )
            for f in Path(tmp).glob("*.deb"):
                f.rename(cache / f.name)
    paths = []
    for d in debs:
        path = cached(d)
        if path is None:
            raise BuildError(f"apt-get download {d.pin} gave no file {d.name}_*.deb")
        fields = run(["dpkg-deb", "-f", str(path), "Package", "Version", "Architecture"]).stdout
        got = dict(line.split(": ", 1) for line in fields.splitlines())
        arch_ok = got["Architecture"] in (DEB_ARCH, "all")
        if (got["Package"], got["Version"]) != (d.name, d.version) or not arch_ok:
            raise BuildError(f"{path} is not {d.pin} for {DEB_ARCH}: {got}")
        paths.append(path)
    return paths


def apt_download(pins: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
    # As root, apt would try to drop to its sandbox user, who cannot write to a home directory.
    opts = ["-o", "APT::Sandbox::User=root"] if os.geteuid() == 0 else []
    argv = ["apt-get", "download", "-q", *opts, *pins]
    return subprocess.run(argv, cwd=cwd, text=True, capture_output=True)


def pip_download(wheels: list[Wheel], dest: Path, *, hashes: bool = True) -> None:
    """``pip download`` the given pins (binary wheels for CPython 3.11 manylinux x86_64)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as req:
        for w in wheels:
            req.write(
                f"{w.name}=={w.version}" + (f" --hash=sha256:{w.sha256}\n" if hashes else "\n")
            )
        req.flush()
        plats = [arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)]
        run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
             "--no-deps", "--only-binary=:all:", "--implementation", "cp", "--python-version",
             "3.11", "--abi", "cp311", *plats, "--dest", str(dest), "-r", req.name]
        )  # fmt: skip


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_wheels(wheels: list[Wheel], cache: Path) -> list[Path]:
    """The wheel files of ``wheels`` (checked against their hashes), downloaded when missing."""
    cache.mkdir(parents=True, exist_ok=True)

    def by_hash() -> dict[str, Path]:
        return {sha256_file(p): p for p in sorted(cache.glob("*.whl"))}

    have = by_hash()
    missing = [w for w in wheels if w.sha256 not in have]
    if missing:
        log(f"downloading {len(missing)} wheels")
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            pip_download(missing, Path(tmp))
            for f in Path(tmp).glob("*.whl"):
                f.rename(cache / f.name)
        have = by_hash()
    lost = [f"{w.name}=={w.version}" for w in wheels if w.sha256 not in have]
    if lost:
        raise BuildError(f"no wheel with the pinned hash for {lost}; run --lock-hashes")
    return [have[w.sha256] for w in wheels]


def lock_hashes() -> None:
    """Rewrite requirements-image.txt with the sha256 of each pin's wheel for the image."""
    text = LOCK_FILE.read_text()
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    pins = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\]+)", text, flags=re.M)
    wheels = [Wheel(normalize(n), v, "") for n, v in pins]
    with tempfile.TemporaryDirectory() as tmp:
        pip_download(wheels, Path(tmp), hashes=False)
        found = {normalize(f.name.split("-")[0]): f for f in Path(tmp).glob("*.whl")}
        body = "".join(
            f"{w.name}=={w.version} \\\n    --hash=sha256:{sha256_file(found[w.name])}\n"
            for w in sorted(wheels, key=lambda w: w.name)
        )
    LOCK_FILE.write_text(header + body)
    log(f"{LOCK_FILE.name}: {len(wheels)} pins hashed")


# --- Root filesystems ------------------------------------------------------------------------


def unpack_debs(debs: list[Path], root: Path) -> None:
    for deb in debs:
        run(["dpkg-deb", "-x", str(deb), str(root)])
    merge_usr(root)
    for rel in PRUNE:
        remove(root / rel)
    doc = root / "usr/share/doc"
    if doc.is_dir():
        for path in sorted(doc.rglob("*"), reverse=True):
            if path.is_symlink() or path.is_file():
                if path.name != "copyright":
                    path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()


def merge_usr(root: Path) -> None:
    """Debian's merged /usr: /bin, /sbin, /lib and /lib64 become links into /usr."""
    for top in ("bin", "sbin", "lib", "lib64"):
        src, dst = root / top, root / "usr" / top
        dst.mkdir(parents=True, exist_ok=True)
        if src.is_dir() and not src.is_symlink():
            for path in sorted(src.rglob("*")):
                target = dst / path.relative_to(src)
                if path.is_dir() and not path.is_symlink():
                    target.mkdir(exist_ok=True)
                elif target.exists() or target.is_symlink():
                    raise BuildError(f"/{path.relative_to(root)} and /usr/{top} both have it")
                else:
                    path.rename(target)
            shutil.rmtree(src)
        src.symlink_to(f"usr/{top}")


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def write(root: Path, rel: str, text: str, mode: int = 0o644) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def base_files(root: Path) -> None:
    """Mount points, root's account and name service configuration."""
    for d in ("dev", "proc", "sys", "etc", "root", "run", "var/tmp", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "var/tmp").chmod(0o1777)
    write(root, "etc/passwd", PASSWD)
    write(root, "etc/group", GROUP)
    write(root, "etc/nsswitch.conf", NSSWITCH)


def dpkg_status(root: Path, debs: list[Path]) -> None:
    """/var/lib/dpkg/status, so that image scanners see the Debian packages and versions."""
    stanzas = []
    for deb in debs:
        control = run(["dpkg-deb", "-f", str(deb)]).stdout.rstrip("\n")
        first, rest = control.split("\n", 1)
        stanzas.append(f"{first}\nStatus: install ok installed\n{rest}\n")
    write(root, "var/lib/dpkg/status", "\n".join(sorted(stanzas)))


def ca_bundle(root: Path) -> None:
    """What update-ca-certificates would make: /etc/ssl/certs/ca-certificates.crt."""
    certs = sorted((root / "usr/share/ca-certificates").rglob("*.crt"))
    if not certs:
        raise BuildError("ca-certificates: no certificates found")
    bundle = "".join(c.read_text().rstrip("\n") + "\n" for c in certs)
    write(root, "etc/ssl/certs/ca-certificates.crt", bundle)
    ssl = root / "usr/lib/ssl"
    ssl.mkdir(parents=True, exist_ok=True)
    for name, target in (
        ("certs", "/etc/ssl/certs"),
        ("cert.pem", "/etc/ssl/certs/ca-certificates.crt"),
    ):
        if not (ssl / name).is_symlink():
            (ssl / name).symlink_to(target)


def unpack_wheel(whl: Path, site: Path) -> None:
    """Install a wheel: its files into ``site`` (a wheel of only purelib/platlib files)."""
    with zipfile.ZipFile(whl) as z:
        for info in sorted(z.infolist(), key=lambda i: i.filename):
            parts = info.filename.split("/")
            if info.is_dir():
                continue
            if info.filename.startswith("/") or ".." in parts:
                raise BuildError(f"{whl.name}: unsafe path {info.filename}")
            if parts[0].endswith(".data"):
                if parts[1] not in ("purelib", "platlib"):
                    raise BuildError(f"{whl.name}: unsupported {info.filename}")
                parts = parts[2:]
            dest = site.joinpath(*parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, dest.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            dest.chmod(0o755 if (info.external_attr >> 16) & 0o111 else 0o644)
        dist_info = next(n.split("/")[0] for n in z.namelist() if ".dist-info/" in n)
    (site / dist_info / "INSTALLER").write_text("hack/build-image\n")


def package_sources() -> list[Path]:
    """The dra_driver files that go into the image: its Python modules and the MPS
    emulator's launchers (:func:`launcher_text`)."""
    modules = [p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts]
    return sorted([*modules, *LAUNCHERS.iterdir()])


def launcher_text(src: Path) -> str:
    """A launcher of the MPS emulator as the image carries it: its ``#!/usr/bin/env python3``
    line names the image's own interpreter (the image has no ``env``)."""
    first, _, rest = src.read_text().partition("\n")
    if not first.startswith("#!"):
        raise BuildError(f"{src}: a launcher must start with #!")
    return f"#!/usr/bin/{PYTHON}\n{rest}"


def rootfs_python(root: Path, args: list[str]) -> None:
    """Run the root filesystem's own python3.11 (through its own dynamic loader, no chroot)."""
    libdir = root / "usr/lib" / TRIPLET
    argv = [str(libdir / "ld-linux-x86-64.so.2"), "--library-path", str(libdir)]
    env = {"PYTHONHOME": str(root / "usr"), "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    run([*argv, str(root / "usr/bin" / PYTHON), "-s", *args], env={**env, "LC_ALL": "C.UTF-8"})


def assemble_plugin(root: Path, debs: list[Path], wheels: list[Path]) -> None:
    unpack_debs(debs, root)
    base_files(root)
    ca_bundle(root)
    (root / "usr/bin/python3").symlink_to(PYTHON)
    site = root / SITE
    site.mkdir(parents=True)
    for whl in wheels:
        unpack_wheel(whl, site)
    for src in package_sources():
        dest = site / src.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.parent == LAUNCHERS:
            write(site, str(dest.relative_to(site)), launcher_text(src), 0o755)
        else:
            shutil.copyfile(src, dest)
    write(root, "usr/local/bin/dra-driver", ENTRY_POINT, 0o755)
    for rel in PRUNE_PLUGIN:
        remove(root / rel)
    dpkg_status(root, debs)
    check_closure(root)
    # Byte code by the image's own interpreter, deterministic (hash seed 0, one process) and
    # valid without timestamps; the image runs with PYTHONDONTWRITEBYTECODE on a read-only
    # root filesystem.
    log("compiling byte code")
    rootfs_python(
        root,
        ["-m", "compileall", "-q", "-f", "-j", "1", "--invalidation-mode", "unchecked-hash",
         "-s", str(root), "-p", "/", str(root / "usr/lib" / PYTHON), str(site)],
    )  # fmt: skip
    rootfs_python(root, ["-c", "import dra_driver.app.cli, grpc, kubernetes, pynvml, yaml"])
    emulator = site / "dra_driver/mpsemu/bin/nvidia-cuda-mps-control"
    rootfs_python(root, [str(emulator), "-h"])


def assemble_tenant(root: Path, debs: list[Path]) -> None:
    """busybox with its applets, python3.11 (pruned as the plugin's) and the tenant probe."""
    python = tuple(rel for rel in PRUNE_PLUGIN if not rel.startswith(SITE))
    assemble_busybox(root, debs, applets=True, prune=python)
    (root / "usr/bin/python3").symlink_to(PYTHON)
    probe = PROBE.read_text()
    write(root, "usr/local/bin/tenant-probe", f"#!/usr/bin/{PYTHON}\n{probe}", 0o755)
    rootfs_python(root, ["-c", "import argparse, datetime, json, os, signal, socket, time"])


def assemble_busybox(
    root: Path, debs: list[Path], applets: bool, prune: tuple[str, ...] = ()
) -> None:
    unpack_debs(debs, root)
    for rel in prune:
        remove(root / rel)
    base_files(root)
    busybox = root / "usr/bin/busybox"
    if applets:
        listing = run([str(busybox), "--list-full"]).stdout.split()
        for entry in sorted(listing):
            top, _, name = entry.rpartition("/")
            if top not in ("bin", "sbin", "usr/bin", "usr/sbin") or "/" in name or not name:
                continue
            link = root / "usr" / top.removeprefix("usr/") / name
            if not (link.exists() or link.is_symlink()):
                link.symlink_to("busybox" if link.parent == busybox.parent else "../bin/busybox")
    dpkg_status(root, debs)
    check_closure(root)


# --- The closure check: every ELF file's libraries are in the image --------------------------


def resolve_in(root: Path, rel: str) -> Path | None:
    """``rel`` resolved inside ``root`` as a chroot would (symlinks too); None if missing."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    cur: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            cur = cur[:-1]
            continue
        path = root.joinpath(*cur, part)
        if path.is_symlink():
            hops += 1
            if hops > 40:
                return None
            target = os.readlink(path)
            if target.startswith("/"):
                cur = []
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
        elif os.path.lexists(path):
            cur.append(part)
        else:
            return None
    return root.joinpath(*cur)


def elf_deps(data: bytes) -> tuple[str | None, list[str], list[str]] | None:
    """(PT_INTERP, DT_NEEDED, DT_RUNPATH+DT_RPATH) of a little-endian ELF64 file; None if the
    file is not one."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", data, 0x20)  # fmt: skip
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic, interp = [], None, None
    for i in range(phnum):
        p_type, _, off, vaddr, _, filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize
        )
        if p_type == 1:
            loads.append((vaddr, off, filesz))
        elif p_type == 2:
            dynamic = (off, filesz)
        elif p_type == 3:
            interp = data[off : off + filesz].rstrip(b"\0").decode()
    if dynamic is None:
        return interp, [], []
    entries = [struct.unpack_from("<qQ", data, dynamic[0] + i) for i in range(0, dynamic[1], 16)]
    strtab = next(v for t, v in entries if t == 5)
    base = next(
        off + strtab - vaddr for vaddr, off, size in loads if vaddr <= strtab < vaddr + size
    )

    def string(at: int) -> str:
        return data[base + at : data.index(b"\0", base + at)].decode()

    needed = [string(v) for t, v in entries if t == 1]
    paths = [p for t, v in entries if t in (15, 29) for p in string(v).split(":")]
    return interp, needed, paths


def check_closure(root: Path) -> None:
    """Fail unless every ELF file's interpreter and libraries resolve inside ``root``."""
    default = [f"usr/lib/{TRIPLET}", "usr/lib", "usr/lib64"]
    missing = []
    for rel, path, st in walk(root):
        if not stat.S_ISREG(st.st_mode) or st.st_size < 64:
            continue
        with path.open("rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
        deps = elf_deps(path.read_bytes())
        if deps is None:
            continue
        interp, needed, rpaths = deps
        origin = str(Path(rel).parent)
        dirs = [p.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for p in rpaths]
        if interp and resolve_in(root, interp) is None:
            missing.append(f"/{rel}: interpreter {interp}")
        for lib in needed:
            if not any(resolve_in(root, f"{d}/{lib}") for d in dirs + default):
                missing.append(f"/{rel}: {lib}")
    if missing:
        raise BuildError("libraries missing from the image:\n  " + "\n  ".join(missing))


# --- Layers and OCI archives -----------------------------------------------------------------


def walk(root: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """(relative path, path, lstat) of everything under ``root``, sorted, parents first."""

    def visit(d: Path, prefix: str) -> Iterator[tuple[str, Path, os.stat_result]]:
        for name in sorted(os.listdir(d)):
            path = d / name
            st = path.lstat()
            yield prefix + name, path, st
            if stat.S_ISDIR(st.st_mode):
                yield from visit(path, f"{prefix}{name}/")

    yield from visit(root, "")


def mode_of(st: os.stat_result) -> int:
    """Normalized permissions: 755 for directories and executables, 644 otherwise; sticky
    directories (tmp) 1777; no set-id bits."""
    if stat.S_ISLNK(st.st_mode):
        return 0o777
    if stat.S_ISDIR(st.st_mode):
        return 0o1777 if st.st_mode & stat.S_ISVTX else 0o755
    return 0o755 if st.st_mode & 0o100 else 0o644


def normalize_tree(root: Path, mtime: int) -> None:
    """Give the files on disk the modes and times that the layer records."""
    entries = list(walk(root))
    for _, path, st in entries:
        if not stat.S_ISLNK(st.st_mode):
            path.chmod(mode_of(st))
    for _, path, _ in [*reversed(entries), ("", root, root.lstat())]:
        os.utime(path, (mtime, mtime), follow_symlinks=False)


class HashingWriter(io.RawIOBase):
    """Writes through to ``out`` and keeps the sha256 and size of what went through."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.hash = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        self.hash.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    @property
    def digest(self) -> str:
        return "sha256:" + self.hash.hexdigest()


def write_layer(root: Path, out: Any, mtime: int) -> None:
    """A tar of ``root``: sorted, owner 0:0, normalized modes, all times ``mtime``."""
    links: dict[tuple[int, int], str] = {}
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, path, st in walk(root):
            info = tarfile.TarInfo(rel)
            info.mtime, info.mode = mtime, mode_of(st)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
            elif stat.S_ISLNK(st.st_mode):
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in links:
                    info.type, info.linkname = tarfile.LNKTYPE, links[key]
                else:
                    links[key] = rel
                    info.size = st.st_size
                    with path.open("rb") as f:
                        tar.addfile(info, f)
                    continue
            else:
                raise BuildError(f"/{rel}: not a file, directory or symlink")
            tar.addfile(info)


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Built:
    digest: str  # of the manifest, as `ctr images ls` shows it
    size: int  # of the archive
    layer_size: int  # uncompressed


def write_archive(
    root: Path, config: dict[str, Any], ref: str, out: Path, mtime: int, compress: bool
) -> Built:
    """An OCI image layout archive (plus docker's manifest.json) with one layer of ``root``."""
    created = f"{datetime.fromtimestamp(mtime, tz=UTC):%Y-%m-%dT%H:%M:%SZ}"
    blobs: dict[str, bytes | Path] = {}
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        layer_path = Path(tmp) / "layer"
        with layer_path.open("wb") as f:
            blob = HashingWriter(f)
            if compress:
                with gzip.GzipFile(fileobj=blob, mode="wb", compresslevel=6, mtime=0) as gz:
                    diff = HashingWriter(gz)
                    write_layer(root, diff, mtime)
            else:
                diff = blob
                write_layer(root, diff, mtime)
        blobs[blob.digest] = layer_path
        media = MEDIA_LAYER + ("+gzip" if compress else "")
        layer = {"mediaType": media, "digest": blob.digest, "size": blob.size}
        image = {
            "created": created,
            "architecture": DEB_ARCH,
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [diff.digest]},
            "history": [{"created": created, "created_by": "hack/build-image"}],
        }
        config_blob = dumps(image)
        config_digest = "sha256:" + hashlib.sha256(config_blob).hexdigest()
        blobs[config_digest] = config_blob
        manifest = dumps(
            {
                "schemaVersion": 2,
                "mediaType": MEDIA_MANIFEST,
                "config": {
                    "mediaType": MEDIA_CONFIG,
                    "digest": config_digest,
                    "size": len(config_blob),
                },
                "layers": [layer],
            }
        )
        digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        blobs[digest] = manifest
        index = {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": digest,
                    "size": len(manifest),
                    "platform": {"architecture": DEB_ARCH, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref,
                    },
                }
            ],
        }

        def blob_name(d: str) -> str:
            return "blobs/sha256/" + d.removeprefix("sha256:")

        docker = [
            {
                "Config": blob_name(config_digest),
                "RepoTags": [ref],
                "Layers": [blob_name(blob.digest)],
            }
        ]
        files: dict[str, bytes | Path] = {
            "oci-layout": dumps({"imageLayoutVersion": "1.0.0"}),
            "index.json": dumps(index),
            "manifest.json": dumps(docker),
        }
        files.update({blob_name(d): b for d, b in blobs.items()})
        partial = Path(tmp) / "archive"
        with tarfile.open(partial, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for d in ("blobs", "blobs/sha256"):
                info = tarfile.TarInfo(d)
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
                tar.addfile(info)
            for name in sorted(files):
                content = files[name]
                info = tarfile.TarInfo(name)
                info.mode, info.mtime = 0o644, mtime
                if isinstance(content, Path):
                    info.size = content.stat().st_size
                    with content.open("rb") as src:
                        tar.addfile(info, src)
                else:
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
        partial.rename(out)
    return Built(digest, out.stat().st_size, diff.size)


# --- Driver ----------------------------------------------------------------------------------


def cache_dir() -> Path:
    base = os.environ.get("DRA_DRIVER_CACHE") or str(Path.home() / ".cache" / "dra-driver")
    return Path(base) / "images"


def inputs_hash(image: str, ref: str, debs: list[Deb], mtime: int, compress: bool) -> str:
    """What determines the image: if it did not change, neither did the archive."""
    h = hashlib.sha256()
    h.update(SCRIPT.read_bytes())
    h.update(dumps([image, ref, mtime, compress, [d.pin for d in debs]]))
    h.update(dumps(image_config(image, ref)))
    if image == "tenant":
        h.update(PROBE.read_bytes())
    if image == "plugin":
        h.update(LOCK_FILE.read_bytes())
        for src in package_sources():
            h.update(str(src.relative_to(ROOT)).encode() + b"\0")
            h.update(hashlib.sha256(src.read_bytes()).digest())
    return h.hexdigest()


def assemble(image: str, root: Path, debs: list[Deb], cache: Path) -> None:
    deb_files = fetch_debs(debs, cache / "debs")
    if image == "plugin":
        wheels = fetch_wheels(parse_lock(LOCK_FILE.read_text()), cache / "wheels")
        assemble_plugin(root, deb_files, wheels)
    elif image == "tenant":
        assemble_tenant(root, deb_files)
    else:
        assemble_busybox(root, deb_files, applets=image == "busybox")


def human(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def build(image: str, ref: str, debs: list[Deb], out_dir: Path, args: argparse.Namespace) -> None:
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    compress = args.compression == "gzip"
    out = out_dir / f"{image}.oci.tar"
    stamp = out_dir / f".{image}.stamp"
    key = inputs_hash(image, ref, debs, mtime, compress)
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, ValueError):
        recorded = {}
    if not args.force and out.exists() and recorded.get("inputs") == key:
        built = Built(recorded["digest"], out.stat().st_size, recorded["layer_size"])
        status = "up to date"
    else:
        cache = cache_dir()
        (cache / "tmp").mkdir(parents=True, exist_ok=True)
        log(f"{image}: building {ref}")
        with tempfile.TemporaryDirectory(dir=cache / "tmp") as tmp:
            root = Path(tmp) / "rootfs"
            root.mkdir()
            assemble(image, root, debs, cache)
            log(f"{image}: writing {out}")
            built = write_archive(root, image_config(image, ref), ref, out, mtime, compress)
        stamp.write_text(
            dumps({"inputs": key, "digest": built.digest, "layer_size": built.layer_size}).decode()
            + "\n"
        )
        status = "built"
    shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print(
        f"{image}: {status}: {ref} {built.digest} {human(built.size)} "
        f"({human(built.layer_size)} uncompressed) {shown}",
        flush=True,
    )


def rootfs_only(target: Path, debs: list[Deb]) -> None:
    if target.exists() and any(target.iterdir()):
        raise BuildError(f"{target} is not empty")
    target.mkdir(parents=True, exist_ok=True)
    cache = cache_dir()
    (cache / "tmp").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache / "tmp") as tmp:
        root = Path(tmp) / "rootfs"
        root.mkdir()
        assemble("plugin", root, debs, cache)
        for child in sorted(root.iterdir()):
            shutil.move(str(child), target / child.name)
    normalize_tree(target, int(os.environ.get("SOURCE_DATE_EPOCH", "0")))
    log(f"plugin root filesystem in {target}")


@contextlib.contextmanager
def cache_lock() -> Iterator[None]:
    """One build at a time per cache (two test sessions starting at once)."""
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="build-image",
        description=__doc__.split("\n\nUsage:", 1)[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "images", nargs="*", metavar="IMAGE", help="plugin, pause, busybox, tenant (default: all)"
    )
    p.add_argument("--out", type=Path, default=ROOT / "build" / "images",
                   help="output directory (default: build/images)")  # fmt: skip
    p.add_argument("--force", action="store_true", help="rebuild even if the inputs are unchanged")
    p.add_argument("--compression", choices=("gzip", "none"), default="gzip")
    for name in IMAGES:
        p.add_argument(f"--{name}-ref", metavar="REF", help=f"reference of the {name} image")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--print-ref", choices=IMAGES, metavar="IMAGE", help="print a reference")
    mode.add_argument("--rootfs-only", type=Path, metavar="DIR",
                      help="write only the plugin's root filesystem into DIR")  # fmt: skip
    mode.add_argument("--lock-hashes", action="store_true",
                      help="re-pin the wheel hashes of requirements-image.txt")  # fmt: skip
    args = p.parse_args(argv)
    unknown = sorted(set(args.images) - set(IMAGES))
    if unknown:
        p.error(f"unknown image {', '.join(unknown)} (choose from {', '.join(IMAGES)})")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        packages = parse_packages(PACKAGES_FILE.read_text())
        refs = default_refs(packages)
        for name in IMAGES:
            refs[name] = getattr(args, f"{name}_ref") or refs[name]
        if args.print_ref:
            print(refs[args.print_ref])
            return 0
        if args.lock_hashes:
            lock_hashes()
            return 0
        with cache_lock():
            if args.rootfs_only:
                rootfs_only(args.rootfs_only.resolve(), packages["plugin"])
                return 0
            args.out.mkdir(parents=True, exist_ok=True)
            for name in args.images or IMAGES:
                build(name, refs[name], packages[name], args.out.resolve(), args)
    except BuildError as e:
        log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
