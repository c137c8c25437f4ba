"""Whether a claim is all there or all gone on disk: checkpoint record, CDI spec, pipe dirs.

Reads only files, as an operator would after a crash: ``<state-dir>/checkpoint.json``, the
claim's spec under the CDI root and, for the simulated enforcer, the claim's MPS namespace pipe
directories under ``<mps-root>/mps/<mode>/pipe/<server>/``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.enforce.rules.edits import CONTAINER_PIPE_DIR
from dra_driver.enforce.rules.names import (
    DEDICATED_NAMESPACE,
    dedicated_server_name,
    namespace_name,
)

PREPARED = "prepared"
ABSENT = "absent"


def records(state_dir: Path) -> dict[str, Any]:
    """The checkpoint's records by claim UID ({} when there is no checkpoint)."""
    path = state_dir / "checkpoint.json"
    if not path.exists():
        return {}
    claims: dict[str, Any] = json.loads(path.read_text())["claims"]
    return claims


def spec_path(cdi_root: Path, uid: str) -> Path:
    return cdi_root / f"{DEFAULT_DRIVER_NAME}-claim_{uid}.json"


def spec_device_ids(cdi_root: Path, uid: str) -> set[str]:
    """The qualified CDI device IDs the claim's spec lists ({} without a spec)."""
    path = spec_path(cdi_root, uid)
    if not path.exists():
        return set()
    spec = json.loads(path.read_text())
    return {f"{spec['kind']}={d['name']}" for d in spec["devices"]}


def pipe_dirs(mps_root: Path, uid: str) -> set[Path]:
    """The claim's namespace pipe directories that exist under ``mps_root``."""
    shared = (mps_root / "mps").glob(f"*/pipe/*/{namespace_name(uid)}")
    own = (mps_root / "mps").glob(f"*/pipe/{dedicated_server_name(uid)}/{DEDICATED_NAMESPACE}")
    return {*shared, *own}


def server_dirs(mps_root: Path, uid: str) -> set[Path]:
    """The pipe directories of the claim's own MPS servers (multi-GPU claims) that exist."""
    return set((mps_root / "mps").glob(f"*/pipe/{dedicated_server_name(uid)}"))


def claim_state(state_dir: Path, cdi_root: Path, mps_root: Path, uid: str) -> str:
    """``prepared`` (record, spec with the recorded CDI devices, every pipe directory the spec
    mounts and no other), ``absent`` (none of them), or ``inconsistent: <what is wrong>``."""
    record = records(state_dir).get(uid)
    spec_file = spec_path(cdi_root, uid)
    spec = json.loads(spec_file.read_text()) if spec_file.exists() else None
    listed = spec_device_ids(cdi_root, uid)
    pipes = pipe_dirs(mps_root, uid)
    servers = server_dirs(mps_root, uid)
    if record is None and spec is None and not pipes and not servers:
        return ABSENT
    problems = []
    if servers - {p.parent for p in pipes}:
        problems.append(f"claim server dirs without namespace: {sorted(map(str, servers))}")
    if record is None:
        problems.append("no checkpoint record")
    if spec is None:
        problems.append("no CDI spec")
    else:
        if record is not None:
            recorded = {i for d in record["devices"] for i in d["cdi_device_ids"]}
            if listed != recorded:
                problems.append(f"spec devices {sorted(listed)} != recorded {sorted(recorded)}")
        mounted = {
            Path(m["hostPath"])
            for d in spec["devices"]
            for m in d["containerEdits"].get("mounts", [])
            if m["containerPath"] == CONTAINER_PIPE_DIR
        }
        if mounted != pipes:
            problems.append(
                f"pipe dirs {sorted(map(str, pipes))} != mounted {sorted(map(str, mounted))}"
            )
    if spec is None and pipes:
        problems.append(f"pipe dirs without spec: {sorted(map(str, pipes))}")
    return PREPARED if not problems else "inconsistent: " + "; ".join(problems)
