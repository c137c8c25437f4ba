"""The read-only commands of ``dra-driver``: ``status`` (this node's checkpoint) and
``occupancy`` (the cluster's GPUs, their holders and why pods wait)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def status_command(state_dir: Path) -> int:
    """``dra-driver status``: print the checkpoint read-only; exit 2 when it is unusable."""
    from dra_driver.checkpoint import CheckpointFormatError, parse, read_boot_id

    if not state_dir.is_dir():
        print(f"error: state directory {state_dir} does not exist", file=sys.stderr)
        return 2
    path = state_dir / "checkpoint.json"
    if not path.exists():
        print(json.dumps({"claims": {}}))
        return 0
    try:
        doc = parse(path.read_bytes())
    except (OSError, CheckpointFormatError) as exc:
        print(f"error: checkpoint {path} is unusable: {exc}", file=sys.stderr)
        return 2
    current = doc.get("bootId") == read_boot_id()
    summary = {
        uid: {k: rec.get(k) for k in ("namespace", "name", "devices")}
        for uid, rec in doc["claims"].items()
    }
    out = {"bootId": doc.get("bootId"), "currentBoot": current, "claims": summary}
    if not current:
        out["note"] = "checkpoint is from an earlier boot; the plugin discards it at start"
    print(json.dumps(out, indent=2))
    return 0


def occupancy_command(kubeconfig: str | None, driver: str, node: str | None, output: str) -> int:
    """``dra-driver occupancy``: print the report; exit 2 when the API cannot be read."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    from dra_driver.occupancy import render_json, render_table
    from dra_driver.occupancyread import api_client, read_cluster
    from dra_driver.occupancywait import build_report

    try:
        with api_client(kubeconfig) as api:
            cluster = read_cluster(api, driver)
    except ApiException as exc:
        print(
            f"error: the API server refused a list call: {exc.status} {exc.reason}; "
            "occupancy needs list on resourceslices, resourceclaims, resourceclaimtemplates, "
            "deviceclasses, pods, resourcequotas and nodes",
            file=sys.stderr,
        )
        return 2
    except ConfigException as exc:  # names the file and what to do
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except (HTTPError, OSError) as exc:
        message = " ".join(str(exc).split())
        print(
            f"error: cannot read the API server: {message}; check the kubeconfig's server "
            "address and that the API server runs",
            file=sys.stderr,
        )
        return 2
    report = build_report(cluster, driver, node)
    print(render_json(report) if output == "json" else render_table(report))
    return 0
