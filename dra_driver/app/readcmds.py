"""The read-only commands of ``dra-driver``: ``status`` (this node's checkpoint), ``occupancy``
(the cluster's GPUs, their holders and why pods wait) and ``render-slices`` (what a plugin
would publish)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from dra_driver.config import load_node_config, warn_unmatched_selectors
from dra_driver.model.gpu import Inventory
from dra_driver.publish import build_slices


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
    "claims": {uid: {"namespace", "name", "devices"}}, "gpuDriver"?: {"available": bool,
    "problem": str | null, "since": str}, "kubeletRegistration"?: {"registered": bool,
    "socket": str, "problem": str | null, "since": str}}``; a directory without a checkpoint
    prints ``{"stateDir", "checkpoint", "claims": {}}`` (and the two others) and says so on
    stderr (exit 0: no plugin using that directory has prepared a claim). ``gpuDriver`` is what
    the plugin's last GPU discovery found (absent before a plugin ran); when the NVIDIA driver
    is not available it says why, and the plugin publishes no devices. ``kubeletRegistration``
    says whether the kubelet has called the plugin since it started (``registered`` false
    with ``problem`` null: not yet, and the registration timeout has not passed).
    """
    from dra_driver.app.kubeletwatch import REGISTRATION_STATE_FILE as REGISTRATION
    from dra_driver.app.nodestate import DRIVER_STATE_FILE
    from dra_driver.prepare import CheckpointFormatError, parse_checkpoint, read_boot_id

    if not state_dir.is_dir():
        print(
            f"error: state directory {state_dir} does not exist; pass the plugin's "
            "--state-dir (the chart's stateDir, default /var/lib/gpu-fraction-dra)",
            file=sys.stderr,
        )
        return 2
    path = state_dir / "checkpoint.json"
    where: dict[str, object] = {"stateDir": str(state_dir), "checkpoint": str(path)}
    # absent until a plugin has run with this directory
    for key, name in (("gpuDriver", DRIVER_STATE_FILE), ("kubeletRegistration", REGISTRATION)):
        with contextlib.suppress(OSError, ValueError):
            where[key] = json.loads((state_dir / name).read_text())
    if not path.exists():
        print(
            f"note: {state_dir} holds no checkpoint ({path.name}): no plugin with this "
            "--state-dir has prepared a claim on this node",
            file=sys.stderr,
        )
        return print_to_pipe(json.dumps({**where, "claims": {}}))
    try:
        doc = parse_checkpoint(path.read_bytes())
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


def occupancy_command(
    kubeconfig: str | None,
    driver: str,
    node: str | None,
    output: str,
    plugin_selector: str | None = None,
) -> int:
    """``dra-driver occupancy``: print the report
    (:func:`~dra_driver.cluster.occupancycmd.occupancy_report`); exit 2, with one line, when
    the API cannot be read."""
    from dra_driver.cluster import OccupancyError, occupancy_report, render_json, render_table

    try:
        report = occupancy_report(kubeconfig, driver, node, plugin_selector)
    except OccupancyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = render_json(report) if output == "json" else render_table(report)
    return print_to_pipe(text)


def render_slices_json(
    node: str,
    gpus_spec: str,
    config_path: str | None,
    driver: str,
    tiers: Callable[[Inventory], Mapping[str, str]] | None = None,
) -> str:
    """JSON array of the slices the plugin would publish for ``node`` (``render-slices`` CLI).

    ``gpus_spec`` is a ``--gpus`` value (``nvml`` or ``simulated:H200x8``; simulated UUIDs are
    seeded with the node name, as in the plugin). ``tiers`` maps the discovered inventory to
    each GPU's memory-enforcement tier (as the plugin detects it; default: none). A ``gpus[]``
    entry of the configuration that matches no discovered GPU is logged as a warning, as the
    plugin logs it at start (:func:`~dra_driver.config.node.warn_unmatched_selectors`). No trailing
    newline (``print`` adds one).

    Raises:
        ConfigError: invalid configuration file.
        SimulatedSpecError: invalid ``gpus_spec``.
        GpuSourceError: NVML unusable.
        ValueError: invalid node or driver name.
    """
    from dra_driver.gpus import open_source

    config = load_node_config(config_path)
    inventory = open_source(gpus_spec, seed=node).discover()
    warn_unmatched_selectors(config, inventory.gpus, source=config_path)
    enforcement = tiers(inventory) if tiers else {}
    slices = build_slices(inventory, config, driver, node, enforcement=enforcement)
    return json.dumps(slices, indent=2)
