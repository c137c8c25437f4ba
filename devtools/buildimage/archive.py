"""Layers and OCI archives: the tree normalized (modes, times), the layer by GNU tar, the image by
umoci, the index, docker's manifest.json and the archive by us."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devtools.buildimage.common import (
    DEB_ARCH,
    MEDIA_INDEX,
    PATH_ENV,
    PAUSE_SCRIPT,
    BuildError,
    dumps,
    run,
)
from devtools.buildimage.pins import project


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
