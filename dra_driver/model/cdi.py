"""CDI spec content (pure): devices, containerEdits and the spec document of one claim.

Spec kind is ``<vendor>/claim``; each allocated device becomes one CDI device named
``claim-<claimUID>-<device>[-<shareID>]`` so a runtime never reuses a stale cached spec.
Files are ``<cdi-root>/<vendor>-claim_<claimUID>.json`` (the CDI transient-spec naming),
written and removed by :mod:`dra_driver.prepare.cdispecs`.
Rules per the CDI spec (github.com/cncf-tags/container-device-interface, SPEC.md and
specs-go/version.go): the lowest ``cdiVersion`` whose features the spec uses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.model.errors import ClaimError
from dra_driver.model.ids import validate_uid
from dra_driver.model.textlimits import shown

CDI_CLASS = "claim"
CONTROL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
"""Device nodes every CUDA container needs besides its GPU's ``/dev/nvidia<minor>``."""

_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
_VENDOR = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?")


class CdiError(ClaimError, ValueError):
    """A CDI name or spec that would be invalid."""


@dataclass(frozen=True)
class Mount:
    """A bind mount into the container (paths absolute)."""

    host_path: str
    container_path: str
    options: tuple[str, ...] = ("rbind", "rw", "nosuid", "nodev")


@dataclass(frozen=True)
class DeviceNode:
    """A device node for the container: ``path`` inside it, ``host_path`` where the runtime
    finds it (None: the same path; a simulated node keeps its nodes elsewhere)."""

    path: str
    host_path: str | None = None

    def to_json(self) -> dict[str, str]:
        """The CDI ``deviceNodes`` entry (``hostPath`` needs cdiVersion 0.5.0)."""
        out = {"path": self.path}
        if self.host_path is not None and self.host_path != self.path:
            out["hostPath"] = self.host_path
        return out


@dataclass(frozen=True)
class Hook:
    """An OCI hook run by the runtime (e.g. ``createRuntime`` for memory limits)."""

    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContainerEdits:
    """CDI containerEdits for one device: env (``NAME=value``), device nodes, mounts, hooks."""

    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Return the CDI JSON ``containerEdits`` object, omitting empty lists."""
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [n.to_json() for n in self.device_nodes]
        if self.mounts:
            out["mounts"] = [
                {
                    "hostPath": m.host_path,
                    "containerPath": m.container_path,
                    "options": list(m.options),
                }
                for m in self.mounts
            ]
        if self.hooks:
            hooks = []
            for h in self.hooks:
                hook: dict[str, Any] = {"hookName": h.hook_name, "path": h.path}
                if h.args:
                    hook["args"] = list(h.args)
                if h.env:
                    hook["env"] = list(h.env)
                hooks.append(hook)
            out["hooks"] = hooks
        return out


@dataclass(frozen=True)
class CdiDevice:
    """One CDI device of a claim spec: its name and its edits."""

    name: str
    edits: ContainerEdits = field(default_factory=ContainerEdits)


def device_name(claim_uid: str, device: str, share_id: str | None = None) -> str:
    """CDI device name for one allocated device: ``claim-<uid>-<device>[-<shareID>]``.

    Raises:
        PrepareError: when the claim UID is malformed.
        CdiError: when the result is not a valid CDI device name.
    """
    validate_uid(claim_uid)
    name = f"claim-{claim_uid}-{device}" + (f"-{share_id}" if share_id else "")
    if not _NAME.fullmatch(name):
        raise CdiError(f"CDI device name {shown(name)} has characters outside [A-Za-z0-9_.:-]")
    return name


def qualified_name(vendor: str, name: str) -> str:
    """Fully qualified CDI device ID ``<vendor>/claim=<name>``."""
    return f"{vendor}/{CDI_CLASS}={name}"


def minimum_version(spec: Mapping[str, Any]) -> str:
    """Lowest ``cdiVersion`` that admits every field ``spec`` uses.

    Source: CDI specs-go/version.go: 0.4.0 mount ``type``; 0.5.0 device names not starting
    with a letter or device nodes with ``hostPath``; 0.6.0 annotations or a dot in the class;
    0.7.0 ``intelRdt`` or ``additionalGids``; 1.1.0 ``netDevices``.
    """
    edits = [spec.get("containerEdits") or {}] + [
        d.get("containerEdits") or {} for d in spec.get("devices", [])
    ]
    version = (0, 3, 0)

    def need(v: tuple[int, int, int]) -> None:
        nonlocal version
        version = max(version, v)

    if any(m.get("type") for e in edits for m in e.get("mounts", [])):
        need((0, 4, 0))
    if any(not d["name"][:1].isalpha() for d in spec.get("devices", [])) or any(
        n.get("hostPath") for e in edits for n in e.get("deviceNodes", [])
    ):
        need((0, 5, 0))
    if spec.get("annotations") or any(d.get("annotations") for d in spec.get("devices", [])):
        need((0, 6, 0))
    if "." in str(spec.get("kind", "")).partition("/")[2]:
        need((0, 6, 0))
    if any(e.get("intelRdt") or e.get("additionalGids") for e in edits):
        need((0, 7, 0))
    if any(e.get("netDevices") for e in edits):
        need((1, 1, 0))
    return ".".join(map(str, version))


def build_spec(vendor: str, devices: Iterable[CdiDevice]) -> dict[str, Any]:
    """Return a CDI spec (JSON object) of kind ``<vendor>/claim`` holding ``devices``.

    Raises:
        CdiError: invalid vendor name or no devices.
    """
    if not _VENDOR.fullmatch(vendor):
        raise CdiError(f"CDI vendor {shown(vendor)} is invalid")
    body: dict[str, Any] = {
        "kind": f"{vendor}/{CDI_CLASS}",
        "devices": [{"name": d.name, "containerEdits": d.edits.to_json()} for d in devices],
    }
    if not body["devices"]:
        raise CdiError("a CDI spec needs at least one device")
    return {"cdiVersion": minimum_version(body), **body}
