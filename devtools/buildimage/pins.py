"""The pins: Debian packages per image (devtools/image-packages.txt), wheels by version and sha256
(requirements-image.txt), and the check that apt resolved exactly the pinned packages."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from typing import Any

from devtools.buildimage.common import IMAGES, LOCK_FILE, PACKAGES_FILE, ROOT, BuildError


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
