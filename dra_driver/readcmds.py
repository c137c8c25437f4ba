"""The read-only commands of ``dra-driver``: ``status`` (this node's checkpoint) and
``occupancy`` (the cluster's GPUs, their holders and why pods wait)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def print_to_pipe(text: str) -> int:
    """Print ``text`` and a newline to stdout; returns 0. A reader that stops early (``| head``)
    ends the output quietly instead of a ``BrokenPipeError`` traceback: stdout is pointed at
    ``/dev/null`` so the interpreter's final flush cannot fail again (Python docs, "Note on
    SIGPIPE")."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0


def status_command(state_dir: Path) -> int:
    """``dra-driver status``: print the checkpoint read-only; exit 2 when it is unusable.

    Output (JSON): ``{"stateDir": str, "checkpoint": str, "bootId": str, "currentBoot": bool,
    "claims": {uid: {"namespace", "name", "devices"}}}``; a directory without a checkpoint
    prints ``{"stateDir", "checkpoint", "claims": {}}`` and says so on stderr (exit 0: no
    plugin using that directory has prepared a claim).
    """
    from dra_driver.checkpoint import CheckpointFormatError, parse, read_boot_id

    if not state_dir.is_dir():
        print(
            f"error: state directory {state_dir} does not exist; pass the plugin's "
            "--state-dir (the chart's stateDir, default /var/lib/gpu-fraction-dra)",
            file=sys.stderr,
        )
        return 2
    path = state_dir / "checkpoint.json"
    where = {"stateDir": str(state_dir), "checkpoint": str(path)}
    if not path.exists():
        print(
            f"note: {state_dir} holds no checkpoint ({path.name}): no plugin with this "
            "--state-dir has prepared a claim on this node",
            file=sys.stderr,
        )
        return print_to_pipe(json.dumps({**where, "claims": {}}))
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
    out = {**where, "bootId": doc.get("bootId"), "currentBoot": current, "claims": summary}
    if not current:
        out["note"] = "checkpoint is from an earlier boot; the plugin discards it at start"
    return print_to_pipe(json.dumps(out, indent=2))


def occupancy_command(kubeconfig: str | None, driver: str, node: str | None, output: str) -> int:
    """``dra-driver occupancy``: print the report; exit 2 when the API cannot be read."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    from dra_driver.occupancy import render_json, render_table
    from dra_driver.occupancyread import api_client, config_source, read_cluster
    from dra_driver.occupancywait import build_report

    source = config_source(kubeconfig, os.environ, Path.home())
    server = "the API server"
    try:
        with api_client(source) as api:
            server = f"the API server {api.configuration.host} (from {source.label})"
            cluster = read_cluster(api, driver)
    except ApiException as exc:
        print(
            f"error: {server} refused a list call: {exc.status} {exc.reason}; "
            "occupancy needs list on resourceslices, resourceclaims, resourceclaimtemplates, "
            "deviceclasses, pods, resourcequotas and nodes",
            file=sys.stderr,
        )
        return 2
    except ConfigException as exc:  # names the file, where it came from and what to do
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except (HTTPError, OSError) as exc:
        message = " ".join(str(exc).split())
        print(
            f"error: cannot read {server}: {message}; check that this is the cluster you "
            "mean and that its API server runs",
            file=sys.stderr,
        )
        return 2
    report = build_report(cluster, driver, node)
    text = render_json(report) if output == "json" else render_table(report)
    return print_to_pipe(text)
