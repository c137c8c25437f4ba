"""The ``dra-driver`` command line (also ``python -m dra_driver``): dispatch to the
subcommands, whose arguments :mod:`dra_driver.app.args` defines. Each subcommand imports what
it needs when it runs: ``mps-service`` never loads gRPC or the Kubernetes client."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from dra_driver.app.args import build_parser
from dra_driver.infra import logs
from dra_driver.model.errors import DriverError


def mps_control(binary: str | None, gpus: str) -> str:
    """The MPS control program: ``--mps-control``, else the emulator for simulated GPUs, else
    ``nvidia-cuda-mps-control``.

    Raises:
        EmulatorBuildError: the emulator's control program is missing and cannot be built.
    """
    if binary:
        return binary
    if gpus.startswith("simulated:"):
        from dra_driver.mpsemu.paths import emulator_path

        return str(emulator_path())
    return "nvidia-cuda-mps-control"


def _mps_service(args: argparse.Namespace) -> int:
    """``dra-driver mps-service``."""
    from dra_driver.enforce import ServiceOptions, run_service

    if not args.node_name:
        print("error: --node-name (or NODE_NAME) is required", file=sys.stderr)
        return 2
    try:
        control = mps_control(args.mps_control, args.gpus)
    except DriverError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    env: dict[str, str] = {}
    if args.gpus.startswith("simulated:"):
        from dra_driver.gpus import open_source
        from dra_driver.mpsemu.daemon import VISIBLE_GPUS_ENV

        try:
            gpus = open_source(args.gpus, seed=args.node_name).discover().gpus
        except DriverError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        env[VISIBLE_GPUS_ENV] = ",".join(g.uuid for g in gpus)
    opts = ServiceOptions(
        node=args.node_name,
        root=Path(args.mps_root),
        binary=control,
        env=env,
        interval=args.interval,
    )
    return run_service(opts)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code (2 for usage/config errors)."""
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    if args.command == "render-slices":
        from dra_driver.app.readcmds import print_to_pipe, render_slices_json
        from dra_driver.enforce import detect_enforcement
        from dra_driver.gpus import Inventory

        def tiers(inventory: Inventory) -> dict[str, str]:
            simulated = args.gpus.startswith("simulated:")
            return detect_enforcement(inventory, simulated=simulated).tiers

        try:
            text = render_slices_json(args.node, args.gpus, args.config, args.driver, tiers)
        except (DriverError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return print_to_pipe(text)
    if args.command == "status":
        from dra_driver.app.readcmds import status_command

        return status_command(Path(args.state_dir))
    if args.command == "occupancy":
        from dra_driver.app.readcmds import occupancy_command

        return occupancy_command(
            args.kubeconfig,
            args.driver,
            args.node,
            args.output,
            args.plugin_selector if args.usage else None,
        )
    if args.command == "mps-service":
        return _mps_service(args)
    from dra_driver.app.plugin import PluginOptions, run
    from dra_driver.enforce import MpsOptions

    if not args.node_name:
        print("error: --node-name (or NODE_NAME) is required", file=sys.stderr)
        return 2
    try:
        control = mps_control(args.mps_control, args.gpus)
    except DriverError as exc:
        print(f"error: cannot start the kubelet plugin: {exc}", file=sys.stderr)
        return 2
    options = PluginOptions(
        driver_name=args.driver,
        node_name=args.node_name,
        gpus=args.gpus,
        kubeconfig=args.kubeconfig,
        plugin_dir=args.plugin_dir,
        registry_dir=args.registry_dir,
        cdi_root=args.cdi_root,
        state_dir=args.state_dir,
        node_config=args.node_config,
        rolling_update_uid=args.rolling_update_uid,
        metrics_port=args.metrics_port,
        metrics_bind_address=args.metrics_bind_address,
        publish_interval=args.publish_interval,
        orphan_sweep_interval=args.orphan_sweep_interval,
        orphan_sweep_first=args.orphan_sweep_first,
        registration_timeout=args.registration_timeout,
        usage_interval=args.usage_interval,
        call_budget=args.call_budget,
        claim_device_status=args.claim_device_status,
        host_root=args.host_root,
        simulation_root=args.simulation_root,
        simulated_cdi_hook=args.simulated_cdi_hook,
        simulated_enforcer=args.simulated_enforcer,
        mps=MpsOptions(
            root=args.mps_root,
            control_binary=control,
            service=args.mps_service == "separate",
            ctk_hook_path=args.cdi_hook,
            driver_root=args.driver_root,
            default_active_thread_percentage=args.default_active_thread_percentage,
            time_slicing_compute_mode=args.time_slicing_compute_mode,
            sm_sharing_compute_mode=args.sm_sharing_compute_mode,
        ),
    )
    try:
        return run(options)
    except (DriverError, OSError) as exc:
        print(f"error: cannot start the kubelet plugin: {exc}", file=sys.stderr)
        return 2
