"""Paths, the images' fixed contents, and the helpers every step uses: the build's one error
type, its log line and how it runs a tool."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


BUILD_SOURCES = Path(__file__).resolve().parent
"""This package: its files are part of every image's inputs."""


PACKAGES_FILE = ROOT / "devtools" / "image-packages.txt"


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


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
