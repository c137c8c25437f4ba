"""``hack/build-image``: the command line, and the build of each image (or of the plugin's root
filesystem only) under the cache lock."""

from __future__ import annotations

import argparse
import importlib
import shutil
import signal
import tempfile
from pathlib import Path

from devtools.buildimage.archive import image_config, normalize_tree, write_archive
from devtools.buildimage.assemble import assemble
from devtools.buildimage.cache import (
    cache_dir,
    cache_lock,
    inputs_hash,
    remove_stale_temporaries,
    source_date_epoch,
    stamp_matches,
    tool_versions,
    write_stamp,
)
from devtools.buildimage.common import IMAGES, PACKAGES_FILE, ROOT, BuildError, log
from devtools.buildimage.pins import Deb, default_refs, parse_packages
from devtools.buildimage.wheels import lock_hashes


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


def parse_args(argv: list[str]) -> argparse.Namespace:
    usage = importlib.import_module("devtools.buildimage").__doc__ or ""
    p = argparse.ArgumentParser(
        prog="build-image",
        description=usage.split("\n\nUsage:", 1)[0],
        epilog=usage.split("\n\nOutput:", 1)[-1].join(["Output:", ""]),
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
