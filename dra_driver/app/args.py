"""The ``dra-driver`` command line's arguments: every subcommand, flag, default and help text
(``dra-driver <command> --help`` prints them); :func:`build_parser` builds the parser."""

from __future__ import annotations

import argparse
import os
from typing import TypeAlias

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.infra import DEFAULT_CALL_BUDGET_S, KUBELET_CALL_TIMEOUT_S, logs
from dra_driver.model import defaults

DEFAULT_CDI_ROOT = "/var/run/cdi"
DEFAULT_STATE_DIR = "/var/lib/gpu-fraction-dra"
DEFAULT_METRICS_BIND_ADDRESS = "127.0.0.1"
"""Loopback only unless told otherwise: the metrics name claims and namespaces."""


Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What ``add_subparsers`` returns (argparse names the class privately)."""


def positive_seconds(text: str) -> float:
    """argparse type: seconds above 0 (else :class:`argparse.ArgumentTypeError`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 seconds")
    return value


def _percentage(text: str) -> int:
    """argparse type: an integer percentage 1..100."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{value} is outside 1..100")
    return value


def _call_budget(text: str) -> float:
    """argparse type: seconds, at least 1 and below the kubelet's 45 s call timeout."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 1 <= value < KUBELET_CALL_TIMEOUT_S:
        raise argparse.ArgumentTypeError(
            f"{value:g} s is outside [1, {KUBELET_CALL_TIMEOUT_S:g}): the kubelet gives each "
            f"call {KUBELET_CALL_TIMEOUT_S:g} s"
        )
    return value


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--driver",
        default=os.environ.get("DRA_DRIVER_NAME", DEFAULT_DRIVER_NAME),
        help=f"DRA driver name (default {DEFAULT_DRIVER_NAME}; env DRA_DRIVER_NAME)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=logs.LEVELS,
        help="least severe level logged, to stderr (default %(default)s)",
    )
    p.add_argument(
        "--log-format",
        default="json",
        choices=("json", "console"),
        help="json: one JSON object per line, for log collectors; console: text for humans "
        "(default %(default)s)",
    )


def _add_node(p: argparse.ArgumentParser, gpus_note: str) -> None:
    """``--node-name`` and ``--gpus`` (env NODE_NAME, GPUS), for the commands that run on a
    node; ``gpus_note`` is added to the ``--gpus`` help."""
    p.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="this node (required; or env NODE_NAME)",
    )
    p.add_argument(
        "--gpus",
        default=os.environ.get("GPUS", "nvml"),
        help=f"GPU source: 'nvml' (default) or 'simulated:H200x8' etc.{gpus_note} (env GPUS)",
    )


def _add_mps_control(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mps-control",
        default=None,
        help="MPS control program (default nvidia-cuda-mps-control; with simulated GPUs the "
        "MPS emulator shipped with the package)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``dra-driver`` subcommand."""
    parser = argparse.ArgumentParser(
        prog="dra-driver",
        description="Kubernetes DRA driver that shares NVIDIA GPUs as memory-capped fractions.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _kubelet_plugin_parser(sub)
    _mps_service_parser(sub)
    _render_slices_parser(sub)
    _status_parser(sub)
    _occupancy_parser(sub)
    return parser


def _kubelet_plugin_parser(sub: Subparsers) -> None:
    """``kubelet-plugin``: the node, its directories and metrics (then
    :func:`_add_plugin_enforcement`)."""
    p = sub.add_parser(
        "kubelet-plugin",
        help="run the node plugin (the main job)",
        description="Serve the kubelet (registration, DRA v1/v1beta1, health), publish this "
        "node's ResourceSlices, and prepare/unprepare claims.",
    )
    _add_common(p)
    _add_node(p, "")
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: $KUBECONFIG, else the pod's service account)",
    )
    p.add_argument(
        "--plugin-dir",
        default=defaults.DEFAULT_PLUGIN_DIR,
        help="kubelet plugin directory; the DRA socket goes into <dir>/<driver> (default "
        "%(default)s; change it when the kubelet's --root-dir is not /var/lib/kubelet)",
    )
    p.add_argument(
        "--registry-dir",
        default=defaults.DEFAULT_REGISTRY_DIR,
        help="kubelet plugin registration directory (default %(default)s)",
    )
    p.add_argument(
        "--cdi-root",
        default=DEFAULT_CDI_ROOT,
        help="where CDI specs are written: a directory the container runtime reads CDI specs "
        "from (default %(default)s)",
    )
    p.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        help="checkpoint of prepared claims; a host path that survives plugin restarts "
        "(default %(default)s)",
    )
    p.add_argument("--node-config", default=None, help="node configuration YAML file")
    p.add_argument(
        "--rolling-update-uid",
        default=os.environ.get("POD_UID", ""),
        help="pod UID for rolling-update socket names (env POD_UID); empty: classic names",
    )
    p.add_argument(
        "--metrics-port", type=int, default=0, help="serve /metrics here (default 0: off)"
    )
    p.add_argument(
        "--metrics-bind-address",
        default=DEFAULT_METRICS_BIND_ADDRESS,
        help="address /metrics listens on (default 127.0.0.1: this host only; the Helm chart "
        "passes 0.0.0.0 so that probes and Prometheus reach the pod IP)",
    )
    _add_plugin_enforcement(p)


def _add_plugin_enforcement(p: argparse.ArgumentParser) -> None:
    """``kubelet-plugin``: MPS, the memory-limit hook, simulation, compute modes, publishing."""
    p.add_argument(
        "--mps-root",
        default="/run/gpu-fraction",
        help="MPS pipe/log/state root (default %(default)s)",
    )
    _add_mps_control(p)
    p.add_argument(
        "--mps-service",
        default="separate",
        choices=("separate", "in-plugin"),
        help="who runs the MPS control daemons: 'separate' (default), the MPS node service "
        "(dra-driver mps-service; the plugin never starts or stops a daemon, so tenants keep "
        "their MPS servers across plugin restarts); 'in-plugin': the plugin starts them, and "
        "they die with the plugin's container (single-node trials)",
    )
    p.add_argument(
        "--simulated-enforcer",
        default="mps",
        choices=("mps", "recording"),
        help="simulated GPUs only: 'mps' (default) enforces through MPS, i.e. the MPS emulator "
        "on this node; 'recording' runs no MPS and records what it would be told (for tests "
        "that are not about MPS)",
    )
    p.add_argument(
        "--cdi-hook",
        default="/usr/bin/nvidia-cdi-hook",
        help="host path of the NVIDIA container toolkit's CDI hook, hard enforcement tier "
        "(default %(default)s)",
    )
    p.add_argument(
        "--simulation-root",
        default="",
        help="simulated GPUs only: where the node's device nodes and the recording hook are "
        "created (a host path, the same inside the plugin's container; default: "
        "<state-dir>/simulated)",
    )
    p.add_argument(
        "--simulated-cdi-hook",
        default="",
        help="simulated GPUs only: path of the recording stand-in for nvidia-cdi-hook that the "
        "hard tier's specs name (default: <simulation-root>/bin/nvidia-cdi-hook)",
    )
    p.add_argument(
        "--driver-root", default="/", help="host root of the NVIDIA driver files (default /)"
    )
    p.add_argument(
        "--host-root", default="/", help="where the host's / is visible, for detection (default /)"
    )
    p.add_argument(
        "--default-active-thread-percentage",
        type=_percentage,
        default=100,
        help="SM ceiling (1..100) of sm-sharing claims that set none (default 100)",
    )
    p.add_argument(
        "--time-slicing-compute-mode",
        default="EXCLUSIVE_PROCESS",
        choices=("EXCLUSIVE_PROCESS", "DEFAULT"),
        help="NVML compute mode of time-slicing GPUs while MPS serves them (default %(default)s)",
    )
    p.add_argument(
        "--sm-sharing-compute-mode",
        default="EXCLUSIVE_PROCESS",
        choices=("EXCLUSIVE_PROCESS", "DEFAULT"),
        help="NVML compute mode of sm-sharing GPUs while MPS serves them (default %(default)s)",
    )
    p.add_argument(
        "--publish-interval",
        type=float,
        default=30.0,
        help="seconds between slice syncs (default %(default)g)",
    )
    p.add_argument(
        "--orphan-sweep-interval",
        type=float,
        default=defaults.SWEEP_INTERVAL_S,
        help="seconds between two sweeps for prepared claims that will never get their "
        "Unprepare (claim deleted or no longer allocated here, no container of it running); "
        f"0 turns the sweep off (default %(default)g; the first sweep runs "
        f"{defaults.FIRST_SWEEP_AFTER_S:g} s after start, or --orphan-sweep-first)",
    )
    p.add_argument(
        "--orphan-sweep-first",
        type=float,
        default=defaults.FIRST_SWEEP_AFTER_S,
        help="seconds after start before the first orphan sweep (default %(default)g)",
    )
    p.add_argument(
        "--registration-timeout",
        type=float,
        default=defaults.REGISTRATION_TIMEOUT_S,
        help="seconds after the registration socket is created without a call from the kubelet "
        "before the plugin reports that the kubelet does not find it (its --root-dir is not "
        "the one of --registry-dir; default %(default)g)",
    )
    p.add_argument(
        "--usage-interval",
        type=positive_seconds,
        default=defaults.USAGE_INTERVAL_S,
        help="seconds between two readings of the fractions' usage (MPS clients, NVML memory "
        "and SM utilization) for the metrics; a scrape reports the last one (default "
        "%(default)g)",
    )
    p.add_argument(
        "--claim-device-status",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after Prepare, write each claim's status.devices (GPU, memory, compute mode, "
        "enforcement; needs the RBAC of the chart's rbac.claimDeviceStatus; default "
        "%(default)s)",
    )
    p.add_argument(
        "--call-budget",
        type=_call_budget,
        default=DEFAULT_CALL_BUDGET_S,
        help="seconds each NodePrepareResources/NodeUnprepareResources call may take, shared "
        f"by its claims (default {DEFAULT_CALL_BUDGET_S:g}; below the kubelet's "
        f"{KUBELET_CALL_TIMEOUT_S:g} s)",
    )


def _mps_service_parser(sub: Subparsers) -> None:
    """``mps-service``."""
    p = sub.add_parser(
        "mps-service",
        help="run the node's MPS control daemons (the MPS node service)",
        description="Run one MPS control daemon per compute mode in the foreground, restart "
        "any that exits or stops answering, and publish which run in "
        "<mps-root>/mps/service.json for the kubelet plugin. SIGTERM stops the daemons: every "
        "MPS client on the node loses its server.",
    )
    _add_common(p)
    _add_node(p, "; with simulated GPUs the MPS emulator runs, serving exactly their UUIDs")
    p.add_argument(
        "--mps-root",
        default="/run/gpu-fraction",
        help="the plugin's --mps-root (default %(default)s)",
    )
    _add_mps_control(p)
    p.add_argument(
        "--interval",
        type=float,
        default=2.0,
        help="seconds between two checks of the daemons (default %(default)g)",
    )


def _render_slices_parser(sub: Subparsers) -> None:
    """``render-slices``."""
    p = sub.add_parser(
        "render-slices",
        help="print the ResourceSlices a node would publish (JSON array)",
        description="Print, as a JSON array of resource.k8s.io/v1 objects, exactly the "
        "ResourceSlices the plugin would publish for this node.",
    )
    _add_common(p)
    p.add_argument("--node", required=True, help="node name (also the pool name)")
    p.add_argument("--gpus", required=True, help="GPU source, e.g. simulated:H200x8 or nvml")
    p.add_argument("--config", default=None, help="node configuration YAML file")


def _status_parser(sub: Subparsers) -> None:
    """``status``."""
    p = sub.add_parser(
        "status",
        help="show the claims prepared on this node (from the checkpoint)",
        description="Print the claims recorded in the checkpoint (namespace, name, devices "
        "with their CDI device IDs) as JSON. Read-only; exit 2 if the checkpoint is unreadable.",
    )
    _add_common(p)
    p.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        help="the plugin's --state-dir, where the checkpoint is (default %(default)s)",
    )


def _occupancy_parser(sub: Subparsers) -> None:
    """``occupancy``."""
    p = sub.add_parser(
        "occupancy",
        help="show each GPU's mode, promised and free memory, its claims, and why pods wait",
        description="Read-only, from the API server only (ResourceSlices, ResourceClaims, "
        "ResourceClaimTemplates, Pods, ResourceQuotas, DeviceClasses, Nodes): per node and "
        "GPU its compute mode, enforcement tier, memory promised to claims and free (GiB "
        "rounded down), its device taints, the claims and pods holding it; then each "
        "Pending pod waiting for one of the driver's classes with the likely reason. What "
        "each claim uses (USED, SM%, NOTE) comes from each node's plugin metrics through the "
        "API server's pod proxy (get pods/proxy). Exit 2 when the API server cannot be read.",
    )
    _add_common(p)
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="default: $KUBECONFIG, else ~/.kube/config, else in-cluster",
    )
    p.add_argument("--node", default=None, help="show only this node's GPUs")
    p.add_argument(
        "--usage",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="read each plugin's metrics for USED, SM%% and NOTE (--no-usage: show -; "
        "default %(default)s)",
    )
    p.add_argument(
        "--plugin-selector",
        default=defaults.PLUGIN_SELECTOR,
        help="label selector of the kubelet plugin pods (default %(default)s)",
    )
    p.add_argument(
        "-o",
        "--output",
        default="table",
        choices=("table", "json"),
        help="table (aligned columns) or json (stable keys, exact bytes) (default table)",
    )
