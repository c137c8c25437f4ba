"""CDI spec files: one per claim under the CDI root, written atomically, found and removed by
claim UID. The spec's content is built by :mod:`dra_driver.cdi` (pure)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_driver import cdi
from dra_driver.atomicfile import write_atomic
from dra_driver.cdi import CDI_CLASS
from dra_driver.checkpoint import ClaimRecord, PreparedDevice
from dra_driver.claimplan import ClaimPlan
from dra_driver.ids import validate_uid


def spec_path(cdi_root: str | Path, vendor: str, claim_uid: str) -> Path:
    """``<cdi-root>/<vendor>-claim_<uid>.json`` (UID validated first).

    Raises:
        PrepareError: when the claim UID is malformed.
    """
    validate_uid(claim_uid)
    return Path(cdi_root) / f"{vendor}-{CDI_CLASS}_{claim_uid}.json"


def claim_uids_on_disk(cdi_root: str | Path, vendor: str) -> set[str]:
    """Claim UIDs that have a spec file of ours under ``cdi_root``."""
    prefix = f"{vendor}-{CDI_CLASS}_"
    root = Path(cdi_root)
    if not root.is_dir():
        return set()
    return {
        p.name[len(prefix) : -len(".json")]
        for p in root.iterdir()
        if p.name.startswith(prefix) and p.name.endswith(".json")
    }


def write_spec(cdi_root: str | Path, vendor: str, claim_uid: str, spec: Mapping[str, Any]) -> Path:
    """Atomically write the claim's spec (temp file, rename) and return its path.

    No fsync: CDI specs live on the ``/var/run`` tmpfs and are boot-scoped like the
    checkpoint, so only atomicity against a killed process matters, which rename gives.
    """
    path = spec_path(cdi_root, vendor, claim_uid)
    write_atomic(path, json.dumps(spec, indent=2, sort_keys=True).encode(), durable=False)
    return path


def spec_device_ids(cdi_root: str | Path, vendor: str, claim_uid: str) -> frozenset[str] | None:
    """Fully qualified CDI device IDs (``<vendor>/claim=<name>``) that the claim's spec on
    disk lists; None when there is no spec or it is not a readable spec.

    Raises:
        PrepareError: when the claim UID is malformed.
    """
    try:
        spec = json.loads(spec_path(cdi_root, vendor, claim_uid).read_bytes())
        return frozenset(f"{spec['kind']}={d['name']}" for d in spec["devices"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove_spec(cdi_root: str | Path, vendor: str, claim_uid: str) -> bool:
    """Remove the claim's spec file; return whether one existed (idempotent)."""
    try:
        os.unlink(spec_path(cdi_root, vendor, claim_uid))
    except FileNotFoundError:
        return False
    return True


ADMIN_ENV = ("GPU_FRACTION_ADMIN_ACCESS=true",)
"""What an admin-access device's containers get besides the GPU's device nodes: no MPS pipe,
no memory variables (monitoring access, e.g. ``nvidia-smi``)."""


def write_claim_spec(
    cdi_root: Path,
    driver_name: str,
    device_root: Path,
    plan: ClaimPlan,
    edits: Mapping[str, cdi.ContainerEdits],
) -> tuple[PreparedDevice, ...]:
    """Write the claim's CDI spec (one CDI device per allocated device or share, with its
    enforcement's ``edits`` and the GPU's device nodes under ``device_root``); return the
    prepared devices the kubelet gets, with their CDI device IDs.

    Raises:
        OSError: when the spec cannot be written.
    """
    cdi_devices = []
    prepared = []
    for d in plan.devices:
        name = cdi.device_name(plan.claim.uid, d.device, d.share_id)
        extra = edits.get(d.key, cdi.ContainerEdits(env=ADMIN_ENV if d.admin_access else ()))
        nodes = tuple(
            cdi.DeviceNode(p, str(device_root / p.lstrip("/")))
            for p in (d.gpu.device_node, *cdi.CONTROL_DEVICE_NODES)
        )
        cdi_devices.append(
            cdi.CdiDevice(name, cdi.ContainerEdits(extra.env, nodes, extra.mounts, extra.hooks))
        )
        prepared.append(
            PreparedDevice(
                request_names=d.request_names,
                pool=d.pool,
                device=d.device,
                share_id=d.share_id,
                cdi_device_ids=(cdi.qualified_name(driver_name, name),),
            )
        )
    spec = cdi.build_spec(driver_name, cdi_devices)
    write_spec(cdi_root, driver_name, plan.claim.uid, spec)
    return tuple(prepared)


def spec_matches(cdi_root: Path, vendor: str, record: ClaimRecord) -> bool:
    """Whether the claim's spec on disk lists exactly the CDI devices its record names."""
    listed = spec_device_ids(cdi_root, vendor, record.plan.claim.uid)
    return listed == frozenset(i for d in record.devices for i in d.cdi_device_ids)
