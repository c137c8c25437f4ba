"""The wheels of requirements-image.txt: downloaded by ``pip download`` into the cache, checked by
sha256, unpacked into the image's site-packages; ``--lock-hashes`` re-pins them."""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from devtools.buildimage.common import LOCK_FILE, WHEEL_PLATFORMS, BuildError, log, run
from devtools.buildimage.pins import Wheel, normalize


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
