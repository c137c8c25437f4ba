"""The driver's CDI spec files: one per claim under the CDI root, written atomically, found and
removed by claim UID. Their content is built by :mod:`dra_driver.model.cdi` (pure)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dra_driver.infra.atomicfile import write_atomic
from dra_driver.model import cdi
from dra_driver.model.cdi import CDI_CLASS
from dra_driver.model.ids import validate_uid
from dra_driver.model.plans import ClaimPlan, PreparedDevice

ADMIN_ENV = ("GPU_FRACTION_ADMIN_ACCESS=true",)
"""What an admin-access device's containers get besides the GPU's device nodes: no MPS pipe,
no memory variables (monitoring access, e.g. ``nvidia-smi``)."""


@dataclass
class CdiSpecs:
    """The spec files of one vendor under one CDI root.

    Attributes:
        root: the CDI spec directory (``/var/run/cdi``).
        vendor: the CDI vendor, the driver name: files ``<vendor>-claim_<uid>.json``, device
            IDs ``<vendor>/claim=<name>``.
        device_root: the host directory the GPUs' device nodes are under (``/`` on a real node,
            a simulated node's simulation root).
    """

    root: Path
    vendor: str
    device_root: Path = Path("/")

    def path(self, claim_uid: str) -> Path:
        """``<root>/<vendor>-claim_<uid>.json`` (UID validated first).

        Raises:
            PrepareError: when the claim UID is malformed.
        """
        validate_uid(claim_uid)
        return self.root / f"{self.vendor}-{CDI_CLASS}_{claim_uid}.json"

    def claim_uids(self) -> set[str]:
        """Claim UIDs that have a spec file of this vendor under the root."""
        prefix = f"{self.vendor}-{CDI_CLASS}_"
        if not self.root.is_dir():
            return set()
        return {
            p.name[len(prefix) : -len(".json")]
            for p in self.root.iterdir()
            if p.name.startswith(prefix) and p.name.endswith(".json")
        }

    def write(self, plan: ClaimPlan, edits: Mapping[str, cdi.ContainerEdits]) -> dict[str, str]:
        """Write the claim's spec atomically: one CDI device per allocated device or share,
        with its enforcement's ``edits`` and the GPU's device nodes under :attr:`device_root`.

        No fsync: CDI specs live on the ``/var/run`` tmpfs and are boot-scoped like the
        checkpoint, so only atomicity against a killed process matters, which rename gives.

        Returns:
            Device plan key -> its fully qualified CDI device ID.

        Raises:
            OSError: when the spec cannot be written.
        """
        devices, ids = [], {}
        for d in plan.devices:
            name = cdi.device_name(plan.claim.uid, d.device, d.share_id)
            extra = edits.get(d.key, cdi.ContainerEdits(env=ADMIN_ENV if d.admin_access else ()))
            nodes = tuple(
                cdi.DeviceNode(p, str(self.device_root / p.lstrip("/")))
                for p in (d.gpu.device_node, *cdi.CONTROL_DEVICE_NODES)
            )
            edit = cdi.ContainerEdits(extra.env, nodes, extra.mounts, extra.hooks)
            devices.append(cdi.CdiDevice(name, edit))
            ids[d.key] = cdi.qualified_name(self.vendor, name)
        spec = cdi.build_spec(self.vendor, devices)
        body = json.dumps(spec, indent=2, sort_keys=True).encode()
        write_atomic(self.path(plan.claim.uid), body, 0o600, durable=False)
        return ids

    def device_ids(self, claim_uid: str) -> frozenset[str] | None:
        """Fully qualified CDI device IDs the claim's spec on disk lists; None when there is no
        spec or it is not a readable spec.

        Raises:
            PrepareError: when the claim UID is malformed.
        """
        try:
            spec = json.loads(self.path(claim_uid).read_bytes())
            return frozenset(f"{spec['kind']}={d['name']}" for d in spec["devices"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def lists(self, claim_uid: str, devices: tuple[PreparedDevice, ...]) -> bool:
        """Whether the claim's spec on disk lists exactly the CDI devices of ``devices``."""
        wanted = frozenset(i for d in devices for i in d.cdi_device_ids)
        return self.device_ids(claim_uid) == wanted

    def remove(self, claim_uid: str) -> bool:
        """Remove the claim's spec file; return whether one existed (idempotent)."""
        try:
            os.unlink(self.path(claim_uid))
        except FileNotFoundError:
            return False
        return True
