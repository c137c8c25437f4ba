"""Each image's root filesystem: the Debian part, then the plugin's wheels, the driver's files,
its entry point and byte code, or the tenant probe, or busybox's applet links."""

from __future__ import annotations

import shutil
from pathlib import Path

from devtools.buildimage.common import (
    CONTROL_CLIENT,
    ENTRY_POINT,
    LAUNCHERS,
    LOCK_FILE,
    PACKAGE_DIR,
    PROBE,
    PRUNE_PLUGIN,
    PYTHON,
    ROOT,
    SITE,
    TRIPLET,
    BuildError,
    log,
    remove,
    run,
    write,
)
from devtools.buildimage.debian import base_files, ca_bundle, debian_root
from devtools.buildimage.pins import Deb, parse_lock
from devtools.buildimage.wheels import fetch_wheels, unpack_wheel
from dra_driver.mpsemu.paths import CLIENT_SOURCE, emulator_path, python_program


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


def assemble_plugin(
    root: Path, debs: list[Deb], wheels: list[Path], deb_cache: Path | None = None
) -> None:
    debian_root(debs, root, deb_cache)
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


def assemble_tenant(root: Path, debs: list[Deb], deb_cache: Path | None = None) -> None:
    """busybox with its applets, python3.11 (pruned as the plugin's) and the tenant probe."""
    python = tuple(rel for rel in PRUNE_PLUGIN if not rel.startswith(SITE))
    assemble_busybox(root, debs, applets=True, prune=python, deb_cache=deb_cache)
    (root / "usr/bin/python3").symlink_to(PYTHON)
    probe = PROBE.read_text()
    write(root, "usr/local/bin/tenant-probe", f"#!/usr/bin/{PYTHON}\n{probe}", 0o755)
    rootfs_python(root, ["-c", "import argparse, datetime, json, os, signal, socket, time"])


def assemble_busybox(
    root: Path,
    debs: list[Deb],
    applets: bool,
    prune: tuple[str, ...] = (),
    deb_cache: Path | None = None,
) -> None:
    debian_root(debs, root, deb_cache)
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


def assemble(image: str, root: Path, debs: list[Deb], cache: Path) -> None:
    """``image``'s root filesystem in ``root``, with the wheels and Debian packages of earlier
    builds taken from ``cache`` (``wheels/``, ``debs/``)."""
    if image == "plugin":
        wheels = fetch_wheels(parse_lock(LOCK_FILE.read_text()), cache / "wheels")
        assemble_plugin(root, debs, wheels, cache / "debs")
    elif image == "tenant":
        assemble_tenant(root, debs, cache / "debs")
    else:
        assemble_busybox(root, debs, applets=image == "busybox", deb_cache=cache / "debs")
