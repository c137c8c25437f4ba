"""Between builds: the images' file times, the cache directory and its lock, the inputs hash and
the stamp that says an archive is still what those inputs make."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from devtools.buildimage.archive import Built, image_config
from devtools.buildimage.assemble import package_sources
from devtools.buildimage.common import (
    BUILD_SOURCES,
    LOCK_FILE,
    PROBE,
    ROOT,
    BuildError,
    dumps,
    log,
    remove,
    run,
)
from devtools.buildimage.pins import Deb


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


def tool_versions() -> list[str]:
    """The versions of the Debian tools and the C compiler that write the bytes (part of the
    inputs)."""
    tools = ("mmdebstrap", "umoci", "tar", os.environ.get("CC", "cc"))
    return [run([tool, "--version"]).stdout.strip() for tool in tools]


def inputs_hash(image: str, ref: str, debs: list[Deb], mtime: int, tools: list[str]) -> str:
    """What determines the image: if it did not change, neither did the archive."""
    h = hashlib.sha256()
    for src in sorted(BUILD_SOURCES.glob("*.py")):
        h.update(src.name.encode() + b"\0" + src.read_bytes())
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
