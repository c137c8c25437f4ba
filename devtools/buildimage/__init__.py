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
${DRA_DRIVER_CACHE:-~/.cache/dra-driver}/images/wheels; the pinned .deb files apt downloaded are
kept beside them in debs/ and handed to apt again by a setup hook, so a second build downloads
only the package indexes), the driver's files, byte code, the image
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
mirror on every build of an image (for the package indexes, and for the packages not cached
yet), and the Python package index when a wheel is not cached yet.
"""

from __future__ import annotations

from devtools.buildimage.archive import (
    Built,
    config_args,
    image_config,
    normalize_tree,
    write_archive,
)
from devtools.buildimage.assemble import launcher_text, package_sources
from devtools.buildimage.cache import cache_lock, source_date_epoch, stamp_matches, write_stamp
from devtools.buildimage.cli import interrupt_on_sigterm, main
from devtools.buildimage.common import CONTROL_CLIENT, LAUNCHERS, PATH_ENV, PYTHON, BuildError, run
from devtools.buildimage.debian import debian_root, dpkg_status, mmdebstrap_error
from devtools.buildimage.pins import (
    Deb,
    check_pins,
    default_refs,
    normalize,
    parse_lock,
    parse_packages,
)
from devtools.buildimage.wheels import unpack_wheel

__all__ = [
    "BuildError",
    "Built",
    "CONTROL_CLIENT",
    "Deb",
    "LAUNCHERS",
    "PATH_ENV",
    "PYTHON",
    "cache_lock",
    "check_pins",
    "config_args",
    "debian_root",
    "default_refs",
    "dpkg_status",
    "image_config",
    "interrupt_on_sigterm",
    "launcher_text",
    "main",
    "mmdebstrap_error",
    "normalize",
    "normalize_tree",
    "package_sources",
    "parse_lock",
    "parse_packages",
    "run",
    "source_date_epoch",
    "stamp_matches",
    "unpack_wheel",
    "write_archive",
    "write_stamp",
]
