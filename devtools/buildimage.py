"""Build the project's container images as OCI image archives, without Docker or a registry.

Images (linux/amd64, one layer each, made only of pinned Debian bookworm packages and wheels):
  plugin   the driver: Debian's python3.11, the wheels of requirements-image.txt and the
           dra_driver package; entry point /usr/local/bin/dra-driver. No shell.
  pause    the pod sandbox image for containerd: busybox-static; sleeps until SIGTERM/SIGINT.
  busybox  a workload image with a shell: busybox-static and links for all its applets.
  tenant   the simulated tenant's workload image: busybox with its applets, Debian's python3.11
           and the tenant probe (dra_driver/mpsemu/probe.py as /usr/local/bin/tenant-probe),
           which connects to its MPS namespace as a CUDA client would.

Debian's own tools do the work: `mmdebstrap --variant=extract` makes each root filesystem
from the packages pinned in devtools/image-packages.txt (apt resolves the dependencies; the
build fails unless what it resolved is exactly the pinned set; merged /usr by mmdebstrap's
merged-usr hook; documentation left out by dpkg path filters), and `umoci` turns the finished
tree into an OCI image layout. Ours is only the glue: the wheels (pinned by version and sha256
in requirements-image.txt, fetched with `pip download`, cached under
${DRA_DRIVER_CACHE:-~/.cache/dra-driver}/images), the driver's files, byte code, the image
configuration, and the archive. The archives are reproducible (file times SOURCE_DATE_EPOCH,
default 0; the layer written by GNU tar sorted, owner 0:0, normalized modes; byte code with
hash-based invalidation): the same inputs give the same digest, and an image whose inputs did
not change is not rebuilt.

Usage:
  hack/build-image [--out DIR] [--force] [--plugin-ref REF] [--pause-ref REF]
                   [--busybox-ref REF] [--tenant-ref REF] [plugin|pause|busybox|tenant ...]
  hack/build-image --print-ref IMAGE      the image reference that a build would use
  hack/build-image --rootfs-only DIR      only the plugin's root filesystem, into DIR
  hack/build-image --lock-hashes          re-pin the wheel hashes of requirements-image.txt

Output: build/images/<image>.oci.tar (OCI image layout, plus a manifest.json for docker load).
Load it with `ctr -n k8s.io images import build/images/plugin.oci.tar`.
Needs mmdebstrap, umoci, GNU tar and pip (hack/install-node-prereqs installs the Debian
packages; root is not needed: mmdebstrap then runs in its unshare mode, same result), the Debian
mirror on every build of an image (mmdebstrap downloads its packages each time; only the
wheels are cached), and the Python package index when a wheel is not cached yet.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dra_driver.mpsemu.paths import CLIENT_SOURCE, emulator_path, python_program

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()
PACKAGES_FILE = Path(__file__).resolve().parent / "image-packages.txt"
LOCK_FILE = ROOT / "requirements-image.txt"
PACKAGE_DIR = ROOT / "dra_driver"
IMAGES = ("plugin", "pause", "busybox", "tenant")
PROBE = PACKAGE_DIR / "mpsemu" / "probe.py"
LAUNCHERS = PACKAGE_DIR / "mpsemu" / "bin"
CONTROL_CLIENT = LAUNCHERS / "nvidia-cuda-mps-control"
"""The emulator's compiled control program: built from its source, not copied."""

# The images are linux/amd64 only: the pinned .debs, the wheel platform tags and the
# dynamic loader used to run the image's own python3.11 while building.
DEB_ARCH = "amd64"
TRIPLET = "x86_64-linux-gnu"
PYTHON = "python3.11"
SITE = f"usr/local/lib/{PYTHON}/dist-packages"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# manylinux tags that Debian bookworm's glibc 2.36 can run, newest first.
WHEEL_PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in range(36, 4, -1)] + ["manylinux2014_x86_64"]

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"

# Where mmdebstrap takes the packages from (Debian bookworm with its point-release updates and
# security updates), and its hook that lays out the merged /usr.
DEBIAN_SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
MERGED_USR_HOOKS = "/usr/share/mmdebstrap/hooks/merged-usr"
# dpkg path filters (dpkg(1) --path-exclude): every image leaves out documentation (but not
# the copyright files), translations and integration files of tools that are not there.
DPKG_FILTERS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/bug/*",
    "path-exclude=/usr/share/binfmts/*",
    "path-exclude=/usr/lib/binfmt.d/*",
)
# What mmdebstrap's setup leaves in the tree for apt and dpkg, and files it copies from the
# build host (resolv.conf, hostname): removed; /var/lib/dpkg is rewritten (dpkg_status).
SETUP_FILES = (
    "etc/apt",
    "etc/dpkg/dpkg.cfg.d/99mmdebstrap",
    "etc/resolv.conf",
    "etc/hostname",
    "etc/fstab",
    "var/cache/apt",
    "var/lib/apt",
    "var/log/apt",
    "var/lib/dpkg",
)
# Dropped from the plugin image (and the tenant's python): glibc's iconv modules (Python has
# its own codecs), the stdlib's Python 2 conversion and documentation modules, the CA tool
# whose work ca_bundle does, and the asyncio copy of the Kubernetes client (kubernetes.aio,
# 68 MiB; the driver uses the synchronous one).
PRUNE_PLUGIN = (
    f"usr/lib/{TRIPLET}/gconv",
    f"usr/lib/{PYTHON}/lib2to3",
    f"usr/lib/{PYTHON}/pydoc_data",
    "usr/sbin/update-ca-certificates",
    f"{SITE}/kubernetes/aio",
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


def run(argv: list[str], check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a command in its own process group; raise BuildError with its output when it fails
    (unless not ``check``), or naming the program and how to install it when it is not there.
    Interrupted (Ctrl-C, SIGTERM), the whole group is killed: mmdebstrap's apt and dpkg
    children too, not only mmdebstrap."""
    try:
        child = subprocess.Popen(
            argv,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            **kw,
        )
    except FileNotFoundError as exc:
        raise BuildError(
            f"{argv[0]} is not installed ({exc.strerror}): run hack/install-node-prereqs "
            "(as root; it installs the Debian tools the build uses)"
        ) from None
    try:
        stdout, stderr = child.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        raise
    proc = subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)
    if check and proc.returncode != 0:
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


# --- Root filesystems: mmdebstrap ------------------------------------------------------------


def debian_root(debs: list[Deb], root: Path) -> None:
    """The Debian part of an image in ``root`` (an empty directory): ``debs`` and nothing else,
    extracted by mmdebstrap (no maintainer scripts run), with merged /usr, without
    documentation, without mmdebstrap's setup files, and with /var/lib/dpkg/status listing the
    packages.

    Raises:
        BuildError: a pin that Debian no longer serves (with how to update the pins), or
            dependencies that apt resolved beyond the pinned set (named, to be pinned).
    """
    argv = [
        "mmdebstrap", "--variant=extract", "--format=directory",
        f"--architectures={DEB_ARCH}", f"--include={','.join(d.pin for d in debs)}",
        f"--hook-dir={MERGED_USR_HOOKS}", "--skip=cleanup/apt/cache", "--skip=chroot/mount",
        *[f"--dpkgopt={f}" for f in DPKG_FILTERS], "bookworm", str(root), *DEBIAN_SOURCES,
    ]  # fmt: skip
    proc = run(argv, check=False)
    if proc.returncode != 0:
        raise BuildError(mmdebstrap_error(proc.stdout + proc.stderr, proc.returncode))
    controls = [
        run(["dpkg-deb", "-f", str(deb)]).stdout.rstrip("\n")
        for deb in sorted((root / "var/cache/apt/archives").glob("*.deb"))
    ]
    check_pins(controls, debs)
    for rel in SETUP_FILES:
        remove(root / rel)
    for entry in sorted((root / "dev").iterdir()):
        remove(entry)
    dpkg_status(root, controls)


def mmdebstrap_error(output: str, code: int) -> str:
    """The message of a failed mmdebstrap run: apt's first error first (a superseded pin is
    named, with how to update it), then the end of the output."""
    errors = [line[3:] for line in output.splitlines() if line.startswith("E: ")]
    head = f"mmdebstrap failed (exit {code})" + (f": {errors[0]}" if errors else "")
    tail = "\n".join(output.strip().splitlines()[-15:])
    superseded = re.search(r"Version '[^']+' for '([^']+)' was not found", output)
    if superseded:
        return (
            f"{head}\nDebian replaces versions on point releases and security updates. On a "
            f"Debian bookworm host run\n  apt-get update && apt-cache policy "
            f"{superseded.group(1)}\nand set the pin in {PACKAGES_FILE.relative_to(ROOT)} to "
            "the Candidate version (the build then names any dependency to pin as well)."
        )
    if any("apt-get update" in e for e in errors):
        why = "apt could not read the package lists (no network to the Debian mirror?)"
        return f"{head}\n{why}:\n{tail}"
    return f"{head}\n{tail}"


def control_fields(control: str) -> dict[str, str]:
    """The single-line fields of a package's control text (``dpkg-deb -f``)."""
    return dict(
        line.split(": ", 1) for line in control.splitlines() if ": " in line and line[0] != " "
    )


def check_pins(controls: list[str], debs: list[Deb]) -> None:
    """Fail unless the packages mmdebstrap extracted (their control texts) are exactly the
    pinned ``debs``."""
    got = {(f["Package"], f["Version"]) for f in map(control_fields, controls)}
    want = {(d.name, d.version) for d in debs}
    extra = sorted(f"{n}={v}" for n, v in got - want)
    missing = sorted(f"{n}={v}" for n, v in want - got)
    if extra or missing:
        raise BuildError(
            f"the packages apt resolved differ from the pins in {PACKAGES_FILE.name}"
            + (f"\n  resolved but not pinned: {' '.join(extra)}" if extra else "")
            + (f"\n  pinned but not resolved: {' '.join(missing)}" if missing else "")
            + "\nPin exactly what apt resolves (a dependency of a pinned package changed)."
        )


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


def dpkg_status(root: Path, controls: list[str]) -> None:
    """/var/lib/dpkg/status, so that image scanners see the Debian packages and versions."""
    stanzas = []
    for control in controls:
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


# --- Wheels ----------------------------------------------------------------------------------


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
    """The dra_driver files that make the image: its Python modules, the MPS emulator's
    launchers (:func:`launcher_text`) and the source of its compiled control program
    (:data:`CLIENT_SOURCE`, compiled into the image as :data:`CONTROL_CLIENT`)."""
    modules = [p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts]
    launchers = [p for p in LAUNCHERS.iterdir() if p != CONTROL_CLIENT and p.name[:1] != "."]
    return sorted([*modules, *launchers, CLIENT_SOURCE])


def launcher_text(src: Path) -> str:
    """A launcher of the MPS emulator as the image carries it: its ``#!/usr/bin/env [-S]
    python3 [-I -S]`` line names the image's own interpreter (the image has no ``env``), with
    the interpreter's options joined into one argument (``-IS``: a ``#!`` line passes one)."""
    first, _, rest = src.read_text().partition("\n")
    words = first.removeprefix("#!").split()
    if not first.startswith("#!") or words[:1] != ["/usr/bin/env"]:
        raise BuildError(f"{src}: a launcher must start with #!/usr/bin/env")
    words = words[2:] if words[1:2] == ["-S"] else words[1:]
    if words[:1] != ["python3"] or not all(w[:1] == "-" and w[1:].isalpha() for w in words[1:]):
        raise BuildError(f"{src}: a launcher runs python3 with single-letter options only")
    options = "".join(w[1:] for w in words[1:])
    return f"#!/usr/bin/{PYTHON}{' -' + options if options else ''}\n{rest}"


def rootfs_python(root: Path, args: list[str]) -> None:
    """Run the root filesystem's own python3.11 (through its own dynamic loader, no chroot)."""
    libdir = root / "usr/lib" / TRIPLET
    argv = [str(libdir / "ld-linux-x86-64.so.2"), "--library-path", str(libdir)]
    env = {"PYTHONHOME": str(root / "usr"), "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    run([*argv, str(root / "usr/bin" / PYTHON), "-s", *args], env={**env, "LC_ALL": "C.UTF-8"})


def assemble_plugin(root: Path, debs: list[Deb], wheels: list[Path]) -> None:
    debian_root(debs, root)
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
        if src == CLIENT_SOURCE:
            dest = site / CONTROL_CLIENT.relative_to(ROOT)
            shutil.copyfile(emulator_path(), dest)
            dest.chmod(0o755)
        elif src.parent == LAUNCHERS:
            write(site, str(dest.relative_to(site)), launcher_text(src), 0o755)
        else:
            shutil.copyfile(src, dest)
    write(root, "usr/local/bin/dra-driver", ENTRY_POINT, 0o755)
    for rel in PRUNE_PLUGIN:
        remove(root / rel)
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
    rootfs_python(root, [str(site / python_program().relative_to(ROOT)), "-h"])


def assemble_tenant(root: Path, debs: list[Deb]) -> None:
    """busybox with its applets, python3.11 (pruned as the plugin's) and the tenant probe."""
    python = tuple(rel for rel in PRUNE_PLUGIN if not rel.startswith(SITE))
    assemble_busybox(root, debs, applets=True, prune=python)
    (root / "usr/bin/python3").symlink_to(PYTHON)
    probe = PROBE.read_text()
    write(root, "usr/local/bin/tenant-probe", f"#!/usr/bin/{PYTHON}\n{probe}", 0o755)
    rootfs_python(root, ["-c", "import argparse, datetime, json, os, signal, socket, time"])


def assemble_busybox(
    root: Path, debs: list[Deb], applets: bool, prune: tuple[str, ...] = ()
) -> None:
    debian_root(debs, root)
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


# --- Layers and OCI archives: GNU tar and umoci ----------------------------------------------


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
    """Give the files on disk the modes (:func:`mode_of`) and times that the layer records.

    Raises:
        BuildError: something other than a file, directory or symlink (a device node).
    """
    entries = list(walk(root))
    for rel, path, st in entries:
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            raise BuildError(f"/{rel}: not a file, directory or symlink")
        if not stat.S_ISLNK(st.st_mode):
            path.chmod(mode_of(st))
    for _, path, _ in [*reversed(entries), ("", root, root.lstat())]:
        os.utime(path, (mtime, mtime), follow_symlinks=False)


def reproducible_tar(directory: Path, names: list[str], out: Path, mtime: int) -> None:
    """GNU tar of ``names`` in ``directory``: sorted, owner 0:0, every time ``mtime``, no
    access or change times (the tar manual's "Reproducibility" options)."""
    run(
        ["tar", "--create", f"--file={out}", f"--directory={directory}", "--sort=name",
         "--format=posix", "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
         f"--mtime=@{mtime}", "--owner=0", "--group=0", "--numeric-owner", "--", *names]
    )  # fmt: skip


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Built:
    digest: str  # of the manifest, as `ctr images ls` shows it
    size: int  # of the archive
    layer_size: int  # uncompressed


def config_args(config: dict[str, Any]) -> list[str]:
    """``umoci config`` options that set the image configuration ``config``
    (:func:`image_config`)."""
    args = [f"--config.entrypoint={a}" for a in config.get("Entrypoint", [])]
    args += [f"--config.cmd={a}" for a in config.get("Cmd", [])]
    args += [f"--config.env={e}" for e in config.get("Env", [])]
    args += [f"--config.label={k}={v}" for k, v in sorted(config.get("Labels", {}).items())]
    if "WorkingDir" in config:
        args.append(f"--config.workingdir={config['WorkingDir']}")
    if "User" in config:
        args.append(f"--config.user={config['User']}")
    return args


def write_archive(root: Path, config: dict[str, Any], ref: str, out: Path, mtime: int) -> Built:
    """An OCI image layout archive (plus docker's manifest.json) with one gzip layer of
    ``root``: the layer by GNU tar, the image (config, manifest, blobs) by umoci, the index's
    name annotations and the archive by us."""
    created = f"{datetime.fromtimestamp(mtime, tz=UTC):%Y-%m-%dT%H:%M:%SZ}"
    normalize_tree(root, mtime)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        layer, layout = Path(tmp) / "layer.tar", Path(tmp) / "layout"
        reproducible_tar(root, sorted(os.listdir(root)), layer, mtime)
        image = f"{layout}:image"
        run(["umoci", "init", "--layout", str(layout)])
        run(["umoci", "new", "--image", image])
        run(["umoci", "raw", "add-layer", "--image", image, f"--history.created={created}",
             "--history.created_by=hack/build-image", str(layer)])  # fmt: skip
        run(["umoci", "config", "--image", image, "--no-history", f"--created={created}",
             "--os=linux", f"--architecture={DEB_ARCH}", *config_args(config)])  # fmt: skip
        run(["umoci", "gc", "--layout", str(layout)])
        [desc] = json.loads((layout / "index.json").read_text())["manifests"]
        manifest = json.loads(blob_path(layout, desc["digest"]).read_text())
        desc["platform"] = {"architecture": DEB_ARCH, "os": "linux"}
        desc["annotations"] = {
            "io.containerd.image.name": ref,
            "org.opencontainers.image.ref.name": ref,
        }
        index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [desc]}
        (layout / "index.json").write_bytes(dumps(index))
        docker = {
            "Config": blob_name(manifest["config"]["digest"]),
            "RepoTags": [ref],
            "Layers": [blob_name(d["digest"]) for d in manifest["layers"]],
        }
        (layout / "manifest.json").write_bytes(dumps([docker]))
        for path in [layout, *layout.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        partial = Path(tmp) / "archive"
        names = ["blobs", "index.json", "manifest.json", "oci-layout"]
        reproducible_tar(layout, names, partial, mtime)
        partial.chmod(0o644)
        partial.rename(out)
        return Built(desc["digest"], out.stat().st_size, layer.stat().st_size)


def blob_name(digest: str) -> str:
    return "blobs/sha256/" + digest.removeprefix("sha256:")


def blob_path(layout: Path, digest: str) -> Path:
    return layout / blob_name(digest)


# --- Driver ----------------------------------------------------------------------------------


def source_date_epoch() -> int:
    """File times of the images: ``SOURCE_DATE_EPOCH`` (seconds since 1970, reproducible-builds
    .org's convention; unset or empty: 0).

    Raises:
        BuildError: a value that is not a non-negative integer.
    """
    value = os.environ.get("SOURCE_DATE_EPOCH") or "0"
    if not value.isdigit():
        raise BuildError(f"SOURCE_DATE_EPOCH={value!r}: expected seconds since 1970 (an integer)")
    return int(value)


def cache_dir() -> Path:
    base = os.environ.get("DRA_DRIVER_CACHE") or str(Path.home() / ".cache" / "dra-driver")
    return Path(base) / "images"


def tool_versions() -> list[str]:
    """The versions of the Debian tools and the C compiler that write the bytes (part of the
    inputs)."""
    tools = ("mmdebstrap", "umoci", "tar", os.environ.get("CC", "cc"))
    return [run([tool, "--version"]).stdout.strip() for tool in tools]


def inputs_hash(image: str, ref: str, debs: list[Deb], mtime: int, tools: list[str]) -> str:
    """What determines the image: if it did not change, neither did the archive."""
    h = hashlib.sha256()
    h.update(SCRIPT.read_bytes())
    h.update(dumps([image, ref, mtime, tools, [d.pin for d in debs]]))
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
    if image == "plugin":
        wheels = fetch_wheels(parse_lock(LOCK_FILE.read_text()), cache / "wheels")
        assemble_plugin(root, debs, wheels)
    elif image == "tenant":
        assemble_tenant(root, debs)
    else:
        assemble_busybox(root, debs, applets=image == "busybox")


def human(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def build(
    image: str, ref: str, debs: list[Deb], out_dir: Path, tools: list[str], force: bool
) -> None:
    mtime = source_date_epoch()
    out = out_dir / f"{image}.oci.tar"
    stamp = out_dir / f".{image}.stamp"
    key = inputs_hash(image, ref, debs, mtime, tools)
    recorded = None if force else stamp_matches(stamp, key, out)
    if recorded:
        built, status = recorded, "up to date"
    else:
        cache = cache_dir()
        (cache / "tmp").mkdir(parents=True, exist_ok=True)
        log(f"{image}: building {ref}")
        stamp.unlink(missing_ok=True)  # an archive without a stamp is never up to date
        with tempfile.TemporaryDirectory(dir=cache / "tmp") as tmp:
            root = Path(tmp) / "rootfs"
            root.mkdir()
            assemble(image, root, debs, cache)
            log(f"{image}: writing {out}")
            built = write_archive(root, image_config(image, ref), ref, out, mtime)
        write_stamp(stamp, key, built, out)
        status = "built"
    shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print(
        f"{image}: {status}: {ref} {built.digest} {human(built.size)} "
        f"({human(built.layer_size)} uncompressed) {shown}",
        flush=True,
    )


def write_stamp(stamp: Path, key: str, built: Built, out: Path) -> None:
    """Record that ``out`` (its size and modification time) was built from inputs ``key``."""
    st = out.stat()
    record = {"inputs": key, "digest": built.digest, "layer_size": built.layer_size}
    record |= {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    stamp.write_text(dumps(record).decode() + "\n")


def stamp_matches(stamp: Path, key: str, out: Path) -> Built | None:
    """The recorded build of ``out`` if it was built from inputs ``key`` and is still the
    file that was written (same size and modification time); None otherwise."""
    try:
        recorded = json.loads(stamp.read_text())
        st = out.stat()
    except (OSError, ValueError):
        return None
    same_file = (recorded.get("size"), recorded.get("mtime_ns")) == (st.st_size, st.st_mtime_ns)
    if recorded.get("inputs") != key or not same_file:
        return None
    return Built(recorded["digest"], st.st_size, recorded["layer_size"])


def remove_stale_temporaries(cache: Path) -> None:
    """Temporary trees of builds that were killed (SIGKILL, power loss); called with the
    cache lock held, so no build of this cache is using them."""
    tmp = cache / "tmp"
    for entry in sorted(tmp.glob("tmp*")) if tmp.is_dir() else []:
        log(f"removing {entry}, left by a build that was killed")
        remove(entry)


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
    normalize_tree(target, source_date_epoch())
    log(f"plugin root filesystem in {target}")


@contextlib.contextmanager
def cache_lock() -> Iterator[None]:
    """One build at a time per cache (two test sessions starting at once)."""
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another build that uses {cache} to finish")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="build-image",
        description=__doc__.split("\n\nUsage:", 1)[0] if __doc__ else None,
        epilog=__doc__.split("\n\nOutput:", 1)[-1].join(["Output:", ""]) if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "images", nargs="*", metavar="IMAGE", help="plugin, pause, busybox, tenant (default: all)"
    )
    p.add_argument("--out", type=Path, default=ROOT / "build" / "images",
                   help="output directory (default: build/images)")  # fmt: skip
    p.add_argument("--force", action="store_true", help="rebuild even if the inputs are unchanged")
    for name in IMAGES:
        p.add_argument(f"--{name}-ref", metavar="REF", help=f"reference of the {name} image")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--print-ref",
        choices=IMAGES,
        metavar="IMAGE",
        help="print the image reference that a build would use",
    )
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
            remove_stale_temporaries(cache_dir())
            if args.rootfs_only:
                rootfs_only(args.rootfs_only.resolve(), packages["plugin"])
                return 0
            args.out.mkdir(parents=True, exist_ok=True)
            tools = tool_versions()
            for name in args.images or IMAGES:
                build(name, refs[name], packages[name], args.out.resolve(), tools, args.force)
    except (BuildError, OSError) as e:
        log(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        log("interrupted; nothing half-built is left")
        return 130
    return 0


def interrupt_on_sigterm() -> None:
    """SIGTERM (timeout, a CI cancel) ends the build as Ctrl-C does: the running tool is
    killed and every temporary tree removed (otherwise hundreds of MiB are left behind)."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


if __name__ == "__main__":
    interrupt_on_sigterm()
    sys.exit(main(sys.argv[1:]))
