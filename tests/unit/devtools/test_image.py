"""Container images built by ``hack/build-image`` (``make image``).

Unit tier (fast, no network): the pins (requirements-image.txt against pyproject.toml,
devtools/image-packages.txt, the check that apt resolved exactly the pins), the Dockerfile's
image configuration against the script's, and the tree normalization and umoci options.

e2e tier (needs mmdebstrap, umoci, pip and the network on a cold cache, root for mmdebstrap
and chroot; ``hack/install-node-prereqs`` installs the tools): the layer and OCI archive of a
tiny tree (sorted, normalized, reproducible, every digest and size right); builds or reuses
build/images/*.oci.tar, checks each OCI layout, reference and Debian package list, runs the
plugin under chroot (``--help``, ``render-slices``, imports, no writes to its root
filesystem), the busybox shell and the pause command, and rebuilds everything to check that
the digests are the same. ``--rootfs-only`` (the Dockerfile's path) gives the same tree as the
plugin layer.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import signal
import stat
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from devtools import buildimage
from tests.support.paths import REPO

ROOT = REPO
SCRIPT = ROOT / "hack" / "build-image"
OUT = ROOT / "build" / "images"


def bi() -> ModuleType:
    """devtools.buildimage (hack/build-image's module)."""
    return buildimage


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def read_oci_archive(path: Path) -> dict[str, Any]:
    """Check an OCI image layout archive (index -> manifest -> config + layer: every digest
    and size matches its blob, nothing unreferenced, docker's manifest.json agrees) and return
    its parts; ``layer`` is the uncompressed layer tar."""
    with tarfile.open(path) as tar:
        members = {m.name: m for m in tar.getmembers()}
        files = {n: tar.extractfile(m).read() for n, m in members.items() if m.isfile()}  # type: ignore[union-attr]
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}

    def blob(descriptor: dict[str, Any]) -> bytes:
        data = files["blobs/sha256/" + descriptor["digest"].removeprefix("sha256:")]
        assert sha256(data) == descriptor["digest"], descriptor
        assert len(data) == descriptor["size"], descriptor
        return data

    index = json.loads(files["index.json"])
    assert index["schemaVersion"] == 2
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    [desc] = index["manifests"]
    assert desc["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert desc["platform"] == {"architecture": "amd64", "os": "linux"}
    manifest = json.loads(blob(desc))
    # umoci 0.4 leaves the manifest's optional mediaType out; the index names it
    assert manifest["schemaVersion"] == 2
    assert manifest.get("mediaType", desc["mediaType"]) == desc["mediaType"]
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    config = json.loads(blob(manifest["config"]))
    [layer_desc] = manifest["layers"]
    raw = blob(layer_desc)
    if layer_desc["mediaType"].endswith("+gzip"):
        layer = gzip.decompress(raw)
    else:
        assert layer_desc["mediaType"] == "application/vnd.oci.image.layer.v1.tar"
        layer = raw
    assert config["rootfs"] == {"type": "layers", "diff_ids": [sha256(layer)]}
    assert (config["architecture"], config["os"]) == ("amd64", "linux")
    used = {desc["digest"], manifest["config"]["digest"], layer_desc["digest"]}
    blobs = {"sha256:" + n.removeprefix("blobs/sha256/") for n in files if n.startswith("blobs/")}
    assert blobs == used, "exactly the referenced blobs"
    ref = desc["annotations"]["io.containerd.image.name"]
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == ref
    [docker] = json.loads(files["manifest.json"])
    assert docker == {
        "Config": "blobs/sha256/" + manifest["config"]["digest"][7:],
        "RepoTags": [ref],
        "Layers": ["blobs/sha256/" + layer_desc["digest"][7:]],
    }
    return {"digest": desc["digest"], "ref": ref, "config": config, "layer": layer}


def layer_entries(layer: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        return tar.getmembers()


# --- Unit tier: pins -------------------------------------------------------------------------


def test_lock_direct_pins_equal_pyproject() -> None:
    """requirements-image.txt (the image's closure) pins pyproject.toml's dependencies exactly,
    each with the hash of one wheel."""
    lock = bi().parse_lock((ROOT / "requirements-image.txt").read_text())
    pins = {w.name: w.version for w in lock}
    assert len(pins) == len(lock) >= 25, "one pin per package, the whole closure"
    with (ROOT / "pyproject.toml").open("rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    for dep in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", dep)
        assert m, f"pyproject.toml dependency not pinned exactly: {dep}"
        name = bi().normalize(m.group(1))
        assert pins.get(name) == m.group(2), f"{name}: image {pins.get(name)} != {m.group(2)}"
    assert all(re.fullmatch(r"[0-9a-f]{64}", w.sha256) for w in lock)


def test_debian_pins() -> None:
    packages = bi().parse_packages((ROOT / "devtools" / "image-packages.txt").read_text())
    names = {image: {d.name for d in debs} for image, debs in packages.items()}
    assert {
        "libc6",
        "python3.11-minimal",
        "libpython3.11-stdlib",
        "ca-certificates",
        "base-files",
    } <= names["plugin"]
    assert "busybox-static" not in names["plugin"], "no shell in the plugin image"
    assert names["pause"] == names["busybox"] == {"busybox-static"}
    for debs in packages.values():
        for d in debs:
            assert re.fullmatch(r"(\d+:)?[0-9][A-Za-z0-9.+~-]*", d.version), d.pin
    with pytest.raises(bi().BuildError, match="IMAGE NAME=VERSION"):
        bi().parse_packages("plugin libc6\n")
    with pytest.raises(bi().BuildError, match="IMAGE NAME=VERSION"):
        bi().parse_packages("other libc6=1\n")


@pytest.mark.integration  # starts a real process
def test_default_references() -> None:
    debs = bi().parse_packages("busybox busybox-static=1:1.35.0-4+deb12u1+b1\n")
    refs = bi().default_refs(debs)
    with (ROOT / "pyproject.toml").open("rb") as f:
        version = tomllib.load(f)["project"]["version"]
    assert refs == {
        "plugin": f"localhost/gpu-fraction-dra:{version}",
        "pause": "localhost/pause:3.10.1",
        "busybox": "localhost/busybox:1.35.0",
        "tenant": f"localhost/gpu-fraction-tenant:{version}",
    }
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--print-ref", "plugin", "--plugin-ref", "r.example/x:1"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "r.example/x:1\n"


def dockerfile_config() -> dict[str, Any]:
    """ENTRYPOINT, CMD, ENV, LABEL, USER and WORKDIR of the Dockerfile's final stage."""
    text = (ROOT / "Dockerfile").read_text().split("FROM scratch", 1)[1]
    text = re.sub(r"#.*\n", "", text).replace("\\\n", " ")
    config: dict[str, Any] = {"Env": [], "Labels": {}}
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word in ("ENTRYPOINT", "CMD"):
            config[word.title()] = json.loads(rest)
        elif word == "USER":
            config["User"] = rest
        elif word == "WORKDIR":
            config["WorkingDir"] = rest
        elif word in ("ENV", "LABEL"):
            for key, value in re.findall(r'(\S+?)=("[^"]*"|\S+)', rest):
                value = value.strip('"')
                if word == "ENV":
                    config["Env"].append(f"{key}={value}")
                else:
                    config["Labels"][key] = value
    return config


def test_dockerfile_has_the_image_configuration() -> None:
    """``docker build`` and ``make image`` give the same configuration."""
    assert dockerfile_config() == bi().image_config("plugin", "any/name:tag")


# --- Unit tier: what apt resolved, trees, umoci options --------------------------------------


def control(name: str, version: str) -> str:
    """A package's control text as ``dpkg-deb -f`` prints it, without the last newline."""
    return f"Package: {name}\nVersion: {version}\nDescription: x\n multi-line: not a field"


def test_apt_must_resolve_exactly_the_pins() -> None:
    debs = [bi().Deb("libc6", "2.36-9"), bi().Deb("zlib1g", "1:1.2.13")]
    bi().check_pins([control("libc6", "2.36-9"), control("zlib1g", "1:1.2.13")], debs)
    with pytest.raises(bi().BuildError) as err:
        bi().check_pins(
            [control("libc6", "2.36-9"), control("zlib1g", "1:1.2.14"), control("tar", "1.34")],
            debs,
        )
    text = str(err.value)
    assert "resolved but not pinned: tar=1.34 zlib1g=1:1.2.14" in text
    assert "pinned but not resolved: zlib1g=1:1.2.13" in text


def test_dpkg_status_lists_every_package_installed(tmp_path: Path) -> None:
    bi().dpkg_status(tmp_path, [control("zlib1g", "1"), control("libc6", "2")])
    text = (tmp_path / "var/lib/dpkg/status").read_text()
    stanzas = text.split("\n\n")
    assert [s.split("\n", 2)[:2] for s in stanzas] == [
        ["Package: libc6", "Status: install ok installed"],
        ["Package: zlib1g", "Status: install ok installed"],
    ]


def tiny_tree(root: Path, mtime: int) -> None:
    (root / "usr/bin").mkdir(parents=True)
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    tool = root / "usr/bin/tool"
    tool.write_text("#!/bin/false\n")
    tool.chmod(0o700)
    data = root / "usr/data"
    data.write_bytes(b"\0" * 3000)
    data.chmod(0o600)
    os.link(data, root / "usr/data-link")
    (root / "bin").symlink_to("usr/bin")
    for p in [*root.rglob("*"), root]:
        os.utime(p, (mtime, mtime), follow_symlinks=False)


def test_normalize_tree_sets_modes_and_times(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tiny_tree(tree, 12345)
    bi().normalize_tree(tree, 7)
    modes = {
        str(p.relative_to(tree)): stat.S_IMODE(p.lstat().st_mode)
        for p in tree.rglob("*")
        if not p.is_symlink()
    }
    assert modes == {
        "tmp": 0o1777,
        "usr": 0o755,
        "usr/bin": 0o755,
        "usr/bin/tool": 0o755,
        "usr/data": 0o644,
        "usr/data-link": 0o644,
    }
    assert {int(p.lstat().st_mtime) for p in [tree, *tree.rglob("*")]} == {7}


def test_normalize_tree_refuses_what_a_layer_cannot_hold(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    os.mkfifo(tree / "fifo")
    with pytest.raises(bi().BuildError, match="/fifo: not a file, directory or symlink"):
        bi().normalize_tree(tree, 0)


def test_a_missing_tool_is_named_with_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A machine without umoci or mmdebstrap (a fresh one that skipped make image) gets one
    line saying what to install, not a FileNotFoundError traceback."""
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(bi().BuildError) as err:
        bi().run(["umoci", "--version"])
    assert "umoci is not installed" in str(err.value)
    assert "hack/install-node-prereqs" in str(err.value)
    monkeypatch.setenv("DRA_DRIVER_CACHE", str(tmp_path / "cache"))
    assert bi().main(["busybox", "--out", str(tmp_path / "out")]) == 1
    assert "mmdebstrap is not installed" in capsys.readouterr().err


# apt's error for a superseded pin, as mmdebstrap (without --quiet) prints it (bookworm,
# mmdebstrap 1.3.5; one run with busybox-static=1:1.35.0-4+deb12u0).
APT_SUPERSEDED = """I: running apt-get update...
I: downloading packages with apt...
E: Version '1:1.35.0-4+deb12u0' for 'busybox-static' was not found
E: apt download failed: E: apt-get --yes -oDebug::pkgDpkgPm=1 install ... failed
E: mmdebstrap failed to run
"""


def test_a_superseded_pin_is_named_with_how_to_update_it() -> None:
    text = bi().mmdebstrap_error(APT_SUPERSEDED, 25)
    assert text.splitlines()[0] == (
        "mmdebstrap failed (exit 25): Version '1:1.35.0-4+deb12u0' for 'busybox-static' "
        "was not found"
    )
    assert "apt-cache policy busybox-static" in text
    assert "devtools/image-packages.txt" in text
    other = bi().mmdebstrap_error("I: x\nE: apt-get update --error-on=any failed\n", 25)
    assert "E: apt-get update --error-on=any failed" in other
    assert "network" in other  # apt could not read the package lists


@pytest.mark.parametrize("value", ["abc", "1.5", "-3"])
def test_a_bad_source_date_epoch_is_one_line(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    with pytest.raises(bi().BuildError, match="SOURCE_DATE_EPOCH"):
        bi().source_date_epoch()


def test_an_empty_source_date_epoch_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "")
    assert bi().source_date_epoch() == 0
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert bi().source_date_epoch() == 1700000000


def test_unusable_paths_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An --out or --rootfs-only that is a file, a cache that cannot be made: the error names
    the path, no traceback."""
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("DRA_DRIVER_CACHE", str(tmp_path / "cache"))
    assert bi().main(["busybox", "--out", str(afile)]) == 1
    assert str(afile) in capsys.readouterr().err
    assert bi().main(["--rootfs-only", str(afile)]) == 1
    assert str(afile) in capsys.readouterr().err
    monkeypatch.setenv("DRA_DRIVER_CACHE", str(afile / "below-a-file"))
    assert bi().main(["busybox", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("build-image: error:") and "Traceback" not in err


def test_a_damaged_archive_is_not_up_to_date(tmp_path: Path) -> None:
    """The stamp says which archive it describes: an archive truncated or replaced after the
    build is rebuilt, not reported up to date."""
    out = tmp_path / "busybox.oci.tar"
    out.write_bytes(b"x" * 100)
    bi().write_stamp(tmp_path / ".busybox.stamp", "key", bi().Built("sha256:d", 100, 7), out)
    assert bi().stamp_matches(tmp_path / ".busybox.stamp", "key", out) is not None
    out.write_bytes(b"")
    assert bi().stamp_matches(tmp_path / ".busybox.stamp", "key", out) is None
    assert bi().stamp_matches(tmp_path / ".busybox.stamp", "other", out) is None


def test_a_build_waiting_for_the_cache_lock_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second build of the same cache waits for the first; it used to wait silently,
    which looked like a hang."""
    monkeypatch.setenv("DRA_DRIVER_CACHE", str(tmp_path))
    lock = tmp_path / "images" / ".lock"
    lock.parent.mkdir(parents=True)
    entered = threading.Event()

    def second_build() -> None:
        with bi().cache_lock():
            entered.set()

    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = threading.Thread(target=second_build)
        waiter.start()
        assert not entered.wait(0.5), "the lock did not hold the second build"
    waiter.join(10)
    assert entered.is_set()
    assert f"waiting for another build that uses {tmp_path / 'images'}" in capsys.readouterr().err


def test_umoci_options_set_the_image_configuration() -> None:
    config = bi().image_config("pause", "localhost/pause:3.10.1")
    args = bi().config_args(config)
    assert args[:4] == [f"--config.entrypoint={a}" for a in config["Entrypoint"]]
    assert f"--config.env={bi().PATH_ENV}" in args
    assert "--config.label=org.opencontainers.image.version=3.10.1" in args
    assert args[-1] == "--config.workingdir=/"
    plugin = bi().config_args(bi().image_config("plugin", "r/x:1"))
    assert "--config.user=0:0" in plugin and "--config.cmd=--help" in plugin


# --- the Debian package cache -----------------------------------------------------------------


def test_the_deb_cache_holds_the_pinned_versions_only(tmp_path: Path) -> None:
    """apt's file names (``:`` of an epoch as ``%3a``) pick the pinned packages out of the cache;
    a superseded version of a pinned package leaves it when the new one comes in."""
    from devtools.buildimage.debian import cached_debs, keep_debs

    pin = buildimage.Deb("busybox-static", "1:1.35.0-4+deb12u1+b1")
    other = buildimage.Deb("libc6", "2.36-9+deb12u13")
    cache, archives = tmp_path / "cache", tmp_path / "archives"
    archives.mkdir()
    fresh = archives / "busybox-static_1%3a1.35.0-4+deb12u1+b1_amd64.deb"
    fresh.write_bytes(b"new")
    (archives / "libc6_2.36-9+deb12u13_amd64.deb").write_bytes(b"libc")
    cache.mkdir()
    (cache / "busybox-static_1%3a1.35.0-4+deb12u0_amd64.deb").write_bytes(b"old")
    (cache / "busybox_1%3a1.35.0-4_amd64.deb").write_bytes(b"another package")
    keep_debs([pin], archives, cache)
    assert sorted(p.name for p in cache.iterdir()) == [
        "busybox-static_1%3a1.35.0-4+deb12u1+b1_amd64.deb",
        "busybox_1%3a1.35.0-4_amd64.deb",
    ]
    assert [p.name for p in cached_debs([pin, other], cache)] == [fresh.name]
    assert cached_debs([other], cache) == []


@pytest.mark.e2e
def test_a_second_build_takes_its_debian_packages_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real mmdebstrap and apt, twice over busybox's pins: the second run downloads no
    package (apt's ``Get:`` lines name only the indexes)."""
    from devtools.buildimage import debian

    downloads: list[list[str]] = []
    real_run = debian.run

    def verbose(argv: list[str], check: bool = True, **kw: Any) -> Any:
        if argv[0] != "mmdebstrap":
            return real_run(argv, check=check, **kw)
        done = real_run([argv[0], "--verbose", *argv[1:]], check=check, **kw)
        lines = (done.stdout + done.stderr).splitlines()
        fetched = [ln for ln in lines if ln.startswith("Get:")]
        downloads.append([ln for ln in fetched if "InRelease" not in ln and " Packages " not in ln])
        return done

    monkeypatch.setattr(debian, "run", verbose)
    debs = bi().parse_packages((ROOT / "devtools" / "image-packages.txt").read_text())["busybox"]
    for n in (1, 2):
        root = tmp_path / f"root{n}"
        root.mkdir()
        debian.debian_root(debs, root, tmp_path / "debs")
    assert len(downloads[0]) == len(debs), downloads[0]
    assert downloads[1] == []


# --- e2e tier: the layer and archive of a tiny tree (umoci, GNU tar) -------------------------


@pytest.mark.e2e
def test_a_superseded_pin_fails_naming_it(tmp_path: Path) -> None:
    """The real mmdebstrap and apt with a version Debian does not serve."""
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(bi().BuildError) as err:
        bi().debian_root([bi().Deb("busybox-static", "1:1.35.0-4+deb12u0")], root)
    first = str(err.value).splitlines()[0]
    assert "Version '1:1.35.0-4+deb12u0' for 'busybox-static' was not found" in first
    assert "apt-cache policy busybox-static" in str(err.value)


@pytest.mark.e2e
def test_sigterm_mid_build_leaves_no_temporary_tree(tmp_path: Path) -> None:
    """A build stopped by SIGTERM (timeout, a CI cancel) while mmdebstrap runs: it exits 130
    and removes its temporary trees; before, ~350 MB per stopped build were left in the
    cache and mmdebstrap kept running."""
    cache = tmp_path / "cache"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "busybox", "--force", "--out", str(tmp_path / "out")],
        env={**os.environ, "DRA_DRIVER_CACHE": str(cache)},
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "busybox: building" in line:
            break
    time.sleep(1.0)  # mmdebstrap is now downloading or extracting
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 130, rest
    assert "interrupted" in rest and "Traceback" not in rest
    assert list((cache / "images" / "tmp").iterdir()) == []
    assert not (tmp_path / "out" / "busybox.oci.tar").exists()
    gone = subprocess.run(["pgrep", "-f", str(cache)], capture_output=True, text=True)
    assert gone.stdout == "", "mmdebstrap still running"


@pytest.mark.e2e
def test_archive_layout_digests_and_layer(tmp_path: Path) -> None:
    config = bi().image_config("busybox", "localhost/busybox:1.0")
    archives = []
    for n, mtime_on_disk in ((1, 1_000_000), (2, 2_000_000)):  # other times, other inodes
        tree = tmp_path / f"tree{n}"
        tiny_tree(tree, mtime_on_disk)
        out = tmp_path / f"{n}.oci.tar"
        built = bi().write_archive(tree, config, "localhost/busybox:1.0", out, 86400)
        image = read_oci_archive(out)
        assert (built.digest, built.size) == (image["digest"], out.stat().st_size)
        assert built.layer_size == len(image["layer"])
        assert image["ref"] == "localhost/busybox:1.0"
        assert image["config"]["config"] == config
        assert image["config"]["created"] == "1970-01-02T00:00:00Z"
        with tarfile.open(out) as tar:
            assert all((m.uid, m.gid, m.mtime) == (0, 0, 86400) for m in tar.getmembers())
        archives.append(out.read_bytes())
        entries = layer_entries(image["layer"])
    assert archives[0] == archives[1]
    assert [e.name for e in entries] == [
        "bin",
        "tmp",
        "usr",
        "usr/bin",
        "usr/bin/tool",
        "usr/data",
        "usr/data-link",
    ]
    by_name = {e.name: e for e in entries}
    assert all((e.uid, e.gid, e.mtime) == (0, 0, 86400) for e in entries)
    assert by_name["tmp"].mode == 0o1777 and by_name["usr"].mode == 0o755
    assert by_name["usr/bin/tool"].mode == 0o755 and by_name["usr/data"].mode == 0o644
    assert by_name["bin"].issym() and by_name["bin"].linkname == "usr/bin"
    assert by_name["usr/data-link"].islnk() and by_name["usr/data-link"].linkname == "usr/data"


def test_wheel_unpacking(tmp_path: Path) -> None:
    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("demo/__init__.py", "X = 1\n")
        z.writestr("demo-1.0.data/purelib/demo_extra.py", "Y = 2\n")
        z.writestr("demo-1.0.dist-info/METADATA", "Name: demo\n")
    site = tmp_path / "site"
    bi().unpack_wheel(whl, site)
    assert (site / "demo/__init__.py").read_text() == "X = 1\n"
    assert (site / "demo_extra.py").is_file()
    assert (site / "demo-1.0.dist-info/INSTALLER").read_text() == "hack/build-image\n"
    bad = tmp_path / "bad-1.0-py3-none-any.whl"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("../escape.py", "")
    with pytest.raises(bi().BuildError, match="unsafe"):
        bi().unpack_wheel(bad, site)


# --- e2e tier: the real images ---------------------------------------------------------------

DIGEST_LINE = re.compile(r"^(\w+): (?:built|up to date): (\S+) (sha256:[0-9a-f]{64}) ", re.M)


def build_images(*args: str) -> dict[str, tuple[str, str]]:
    """Run hack/build-image; {image: (ref, digest)} from its output."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=1200
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {m[0]: (m[1], m[2]) for m in DIGEST_LINE.findall(proc.stdout)}


@pytest.fixture(scope="module")
def images() -> dict[str, tuple[str, str]]:
    built = build_images()
    assert set(built) == {"plugin", "pause", "busybox", "tenant"}
    return built


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("chroot needs root")


def unpack(image: str, dest: Path) -> dict[str, Any]:
    """Check build/images/IMAGE.oci.tar and unpack its layer into dest."""
    oci = read_oci_archive(OUT / f"{image}.oci.tar")
    with tarfile.open(fileobj=io.BytesIO(oci["layer"])) as tar:
        tar.extractall(dest, filter="fully_trusted")
    return oci


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.lstat().st_mtime_ns, p.lstat().st_size)
        for p in root.rglob("*")
    }


def image_env(oci: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in oci["config"]["config"]["Env"])


@pytest.mark.e2e
def test_archives_are_valid_oci_images(images: dict[str, tuple[str, str]]) -> None:
    for image, (ref, digest) in images.items():
        oci = read_oci_archive(OUT / f"{image}.oci.tar")
        assert (oci["ref"], oci["digest"]) == (ref, digest)
        names = [e.name for e in layer_entries(oci["layer"])]
        assert names == sorted(names, key=lambda n: n.split("/")), "sorted, parents first"
        assert all(e.uid == e.gid == 0 for e in layer_entries(oci["layer"]))
    assert (
        images["plugin"][0]
        == bi().default_refs(
            bi().parse_packages((ROOT / "devtools/image-packages.txt").read_text())
        )["plugin"]
    )


@pytest.mark.e2e
def test_images_hold_exactly_their_pinned_packages(images: dict[str, tuple[str, str]]) -> None:
    """dpkg's status in each layer lists the pins of devtools/image-packages.txt, and nothing
    of mmdebstrap's setup (apt's sources and cache, the build host's resolv.conf and
    hostname, device nodes) is left in it."""
    packages = bi().parse_packages((ROOT / "devtools/image-packages.txt").read_text())
    for image in images:
        layer = read_oci_archive(OUT / f"{image}.oci.tar")["layer"]
        with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
            names = set(tar.getnames())
            bin_entry = tar.getmember("bin")
            os_release = None
            if "usr/lib/os-release" in names:
                member = tar.extractfile("usr/lib/os-release")
                os_release = member.read().decode() if member else None
            status = tar.extractfile("var/lib/dpkg/status").read().decode()  # type: ignore[union-attr]
        listed = re.findall(r"^Package: (\S+)\n(?:.*\n)*?Version: (\S+)$", status, flags=re.M)
        assert sorted(f"{n}={v}" for n, v in listed) == sorted(d.pin for d in packages[image])
        left = {"etc/apt", "var/cache/apt", "etc/resolv.conf", "etc/hostname", "etc/fstab"}
        assert not names & left, f"{image}: {sorted(names & left)}"
        assert not [n for n in names if n.startswith("dev/")], image
        assert bin_entry.issym() and bin_entry.linkname == "usr/bin", image
        if image in ("plugin", "tenant"):  # scanners read the OS from /etc/os-release
            assert os_release is not None and "ID=debian" in os_release, image


@pytest.mark.e2e
def test_plugin_runs_under_chroot_without_writing(
    images: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    need_root()
    root = tmp_path / "plugin"
    oci = unpack("plugin", root)
    config = oci["config"]["config"]
    assert config["Entrypoint"] == ["dra-driver"] and config["User"] == "0:0"
    assert not os.path.lexists(root / "usr/bin/sh"), "the plugin needs no shell"
    before = snapshot(root)
    env = image_env(oci)
    # Byte code is precompiled: even allowed to write it, python writes nothing.
    env.pop("PYTHONDONTWRITEBYTECODE")

    def chroot(*argv: str) -> str:
        proc = subprocess.run(
            ["chroot", str(root), *argv], env=env, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    assert "usage: dra-driver" in chroot("/usr/local/bin/dra-driver", "--help")
    slices = json.loads(
        chroot(
            "/usr/local/bin/dra-driver",
            "render-slices",
            "--node",
            "n1",
            "--gpus",
            "simulated:H200x2",
        )
    )
    assert slices and slices[0]["kind"] == "ResourceSlice"
    chroot(
        "/usr/bin/python3",
        "-c",
        "import grpc, kubernetes, structlog, prometheus_client, pynvml, yaml, ssl, ctypes\n"
        "import kubernetes.client, zoneinfo\n"
        "assert ssl.create_default_context().cert_store_stats()['x509_ca'] > 50\n"
        "zoneinfo.ZoneInfo('Europe/Berlin')\n",
    )
    assert snapshot(root) == before, "the plugin wrote to its root filesystem"
    # The MPS emulator of simulated nodes is in the package, not on PATH, and runs on the
    # image's own interpreter (the image has no /usr/bin/env).
    emulator = chroot(
        "/usr/bin/python3",
        "-c",
        "from dra_driver.mpsemu.paths import emulator_path\nprint(emulator_path())",
    ).strip()
    assert "/dra_driver/mpsemu/bin/" in emulator
    assert "server" in chroot(emulator, "-h")
    assert not os.path.lexists(root / "usr/local/bin/nvidia-cuda-mps-control")


@pytest.mark.e2e
def test_tenant_image_runs_the_probe(images: dict[str, tuple[str, str]], tmp_path: Path) -> None:
    need_root()
    root = tmp_path / "tenant"
    oci = unpack("tenant", root)
    assert oci["config"]["config"]["Cmd"] == ["tenant-probe"]
    proc = subprocess.run(
        ["chroot", str(root), "/bin/sh", "-c", "timeout 3 tenant-probe; which sh env grep"],
        env={**image_env(oci), "CUDA_MPS_PIPE_DIRECTORY": "/nonexistent"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("tenant-probe:")]
    states = [line.rsplit("state=", 1)[1] for line in lines]
    assert states[0] == "unreachable" and states[-1] == "stopped", proc.stdout + proc.stderr
    assert "bin/sh" in proc.stdout and "bin/grep" in proc.stdout


@pytest.mark.e2e
def test_busybox_shell(images: dict[str, tuple[str, str]], tmp_path: Path) -> None:
    need_root()
    root = tmp_path / "busybox"
    oci = unpack("busybox", root)
    assert oci["config"]["config"]["Cmd"] == ["sh"]
    applets = ["sh", "ls", "cat", "env", "sleep", "grep", "mount", "wget", "nslookup"]
    proc = subprocess.run(
        ["chroot", str(root), "/bin/sh", "-c", "ls /dev; env; which " + " ".join(applets)],
        env=image_env(oci),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "PATH=/usr/local/sbin:" in proc.stdout
    found = proc.stdout.split()
    assert all(any(f.endswith(f"bin/{a}") for f in found) for a in applets), proc.stdout


def _default_signals() -> None:
    """Start pause with default signal dispositions, as a container runtime does: a runner
    that ignores SIGINT and SIGQUIT (a background job of a shell without job control, e.g.
    ``make test &``) passes that on, and a non-interactive shell cannot trap what it was
    started ignoring, so pause never saw SIGINT."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _signal_state(pid: int) -> str:
    """What the kernel says of a process that did not exit on a signal: its state, signal
    masks (ignored, caught, pending, blocked), what it waits in, and its children."""
    proc = Path(f"/proc/{pid}")
    keys = ("State", "SigIgn", "SigCgt", "SigPnd", "ShdPnd", "SigBlk")
    try:
        lines = [ln for ln in (proc / "status").read_text().splitlines() if ln.startswith(keys)]
        wchan = (proc / "wchan").read_text()
        children = (proc / "task" / str(pid) / "children").read_text().split()
    except OSError as exc:
        return f"no /proc entry ({exc})"
    return f"{'; '.join(lines)}; wchan {wchan}; children {children}"


@pytest.mark.e2e
def test_pause_exits_promptly_on_sigterm(
    images: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    need_root()
    root = tmp_path / "pause"
    oci = unpack("pause", root)
    subprocess.run(["mknod", "-m", "666", str(root / "dev/null"), "c", "1", "3"], check=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        proc = subprocess.Popen(
            ["chroot", str(root), *oci["config"]["config"]["Entrypoint"]],
            env=image_env(oci),
            start_new_session=True,
            preexec_fn=_default_signals,
        )
        try:
            time.sleep(1)
            assert proc.poll() is None, "pause exited by itself"
            t0 = time.monotonic()
            proc.send_signal(sig)
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pytest.fail(f"pause ignored {sig.name} for 5 s: {_signal_state(proc.pid)}")
            assert code == 0, f"{sig.name}: exit {code}"
            assert time.monotonic() - t0 < 1.0
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its background sleep, if left
            proc.wait()


@pytest.mark.e2e
def test_rebuild_gives_the_same_digests(images: dict[str, tuple[str, str]], tmp_path: Path) -> None:
    again = build_images("--force", "--out", str(tmp_path))
    assert again == images


@pytest.mark.e2e
def test_rootfs_only_is_the_plugin_layer(
    images: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    """What the Dockerfile copies into its image: the same files as the plugin layer."""
    target = tmp_path / "rootfs"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--rootfs-only", str(target)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr
    oci = read_oci_archive(OUT / "plugin.oci.tar")
    with tarfile.open(fileobj=io.BytesIO(oci["layer"])) as tar:
        layer = {}
        for e in tar:
            f = tar.extractfile(e) if e.isfile() else None
            digest = hashlib.sha256(f.read()).digest() if f else b""
            layer[e.name] = (e.type, e.mode, e.mtime, e.linkname, digest)
    tree = {}
    for p in sorted(target.rglob("*")):
        st = p.lstat()
        rel, mtime = str(p.relative_to(target)), int(st.st_mtime)
        if stat.S_ISLNK(st.st_mode):
            tree[rel] = (tarfile.SYMTYPE, 0o777, mtime, os.readlink(p), b"")
        elif stat.S_ISDIR(st.st_mode):
            tree[rel] = (tarfile.DIRTYPE, stat.S_IMODE(st.st_mode), mtime, "", b"")
        else:
            digest = hashlib.sha256(p.read_bytes()).digest()
            tree[rel] = (tarfile.REGTYPE, stat.S_IMODE(st.st_mode), mtime, "", digest)
    assert tree == layer


def test_launchers_keep_their_interpreter_options_in_the_image(tmp_path: Path) -> None:
    """The image has no ``env``: a launcher's ``#!/usr/bin/env -S python3 -I -S`` becomes the
    image's interpreter with the options as the one argument a ``#!`` line passes."""
    from devtools.buildimage import (
        CONTROL_CLIENT,
        LAUNCHERS,
        PYTHON,
        BuildError,
        launcher_text,
        package_sources,
    )

    launchers = [p for p in package_sources() if p.parent == LAUNCHERS]
    # the compiled control program is built from its source into the image, never copied
    assert len(launchers) == 2 and CONTROL_CLIENT not in launchers
    assert CONTROL_CLIENT.parent.parent / "control_client.c" in package_sources()
    for launcher in launchers:
        first, rest = launcher_text(launcher).split("\n", 1)
        assert first == f"#!/usr/bin/{PYTHON} -IS", launcher
        assert rest == launcher.read_text().split("\n", 1)[1]
    odd = tmp_path / "odd"
    odd.write_text("#!/usr/bin/env -S python3 -X importtime\nprint()\n")
    with pytest.raises(BuildError, match="single-letter options only"):
        launcher_text(odd)
