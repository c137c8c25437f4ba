"""The Debian part of each root filesystem: mmdebstrap extracts the pinned packages (reusing the
.deb files of earlier builds from the cache, :func:`cached_debs`), then the tree gets its base
files."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
from pathlib import Path

from devtools.buildimage.common import (
    DEB_ARCH,
    DEBIAN_SOURCES,
    DPKG_FILTERS,
    GROUP,
    MERGED_USR_HOOKS,
    NSSWITCH,
    PACKAGES_FILE,
    PASSWD,
    ROOT,
    SETUP_FILES,
    BuildError,
    remove,
    run,
    write,
)
from devtools.buildimage.pins import Deb, check_pins


def deb_file_prefix(deb: Deb) -> str:
    """How apt names a downloaded package, up to its architecture: ``name_version_`` with the
    epoch's ``:`` written ``%3a`` (``busybox-static_1%3a1.35.0-4+deb12u1_amd64.deb``)."""
    return f"{deb.name}_{deb.version.replace(':', '%3a')}_"


def cached_debs(debs: list[Deb], cache: Path) -> list[Path]:
    """The .deb files in ``cache`` of exactly the pinned ``debs``."""
    prefixes = [deb_file_prefix(d) for d in debs]
    return [p for p in sorted(cache.glob("*.deb")) if p.name.startswith(tuple(prefixes))]


def keep_debs(debs: list[Deb], archives: Path, cache: Path) -> None:
    """Copy the pinned packages that apt downloaded into ``cache`` (atomically), and drop the
    cache's files of other versions of the same packages (superseded pins)."""
    cache.mkdir(parents=True, exist_ok=True)
    for deb in debs:
        prefix = deb_file_prefix(deb)
        for old in cache.glob(f"{deb.name}_*.deb"):
            if not old.name.startswith(prefix):
                old.unlink(missing_ok=True)
    for src in cached_debs(debs, archives):
        if not (cache / src.name).exists():
            fd, tmp = tempfile.mkstemp(dir=cache, suffix=".part")
            os.close(fd)
            shutil.copyfile(src, tmp)
            os.replace(tmp, cache / src.name)


def debian_root(debs: list[Deb], root: Path, cache: Path | None = None) -> None:
    """The Debian part of an image in ``root`` (an empty directory): ``debs`` and nothing else,
    extracted by mmdebstrap (no maintainer scripts run), with merged /usr, without
    documentation, without mmdebstrap's setup files, and with /var/lib/dpkg/status listing the
    packages. With ``cache``, the pinned packages found there are handed to apt before it
    downloads (a setup hook copies them into the tree's ``/var/cache/apt/archives``, which apt
    takes when their checksums match its index: mmdebstrap(1), "sync-in"), and what it
    downloaded is kept there for the next build.

    Raises:
        BuildError: a pin that Debian no longer serves (with how to update the pins), or
            dependencies that apt resolved beyond the pinned set (named, to be pinned).
    """
    have = cached_debs(debs, cache) if cache is not None else []
    hooks = []
    if have:
        files = " ".join(shlex.quote(str(p)) for p in have)
        inside = '"$1"/var/cache/apt/archives/'
        hooks = [f"--setup-hook=mkdir -p {inside} && cp {files} {inside}"]
    argv = [
        "mmdebstrap", "--variant=extract", "--format=directory",
        f"--architectures={DEB_ARCH}", f"--include={','.join(d.pin for d in debs)}",
        f"--hook-dir={MERGED_USR_HOOKS}", *hooks, "--skip=cleanup/apt/cache",
        "--skip=chroot/mount", *[f"--dpkgopt={f}" for f in DPKG_FILTERS], "bookworm", str(root),
        *DEBIAN_SOURCES,
    ]  # fmt: skip
    proc = run(argv, check=False)
    if proc.returncode != 0:
        raise BuildError(mmdebstrap_error(proc.stdout + proc.stderr, proc.returncode))
    archives = root / "var/cache/apt/archives"
    controls = [
        run(["dpkg-deb", "-f", str(deb)]).stdout.rstrip("\n")
        for deb in sorted(archives.glob("*.deb"))
    ]
    check_pins(controls, debs)
    if cache is not None:
        keep_debs(debs, archives, cache)
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
