"""``dra-driver kubelet-plugin``: wires inventory, slices, Prepare/Unprepare and gRPC together."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import FrameType

import structlog
from prometheus_client import start_http_server

from dra_driver.app.enforcement import make_enforcer
from dra_driver.app.kubeletwatch import watch_registration
from dra_driver.app.nodestate import (
    NodeState,
    PlanCheck,
    police_clients,
    supervise,
    wait_for_driver,
    watch_prepared,
    write_driver_state,
)
from dra_driver.app.sockets import check_socket_paths
from dra_driver.config import CapPolicy, NodeConfig, load_node_config, warn_unmatched_selectors
from dra_driver.enforce import (
    EnforcementReport,
    FractionEnforcer,
    MpsEnforcer,
    MpsOptions,
    detect_enforcement,
)
from dra_driver.gpus import open_source, simnode
from dra_driver.infra import (
    DEFAULT_CALL_BUDGET_S,
    ApiClient,
    Metrics,
    PrepareLock,
    api_client,
    private_dir,
)
from dra_driver.kubelet import PluginServer, SocketPaths
from dra_driver.model import defaults
from dra_driver.observe import (
    ClaimStatusWriter,
    ConsumerWatch,
    MpsOutageReport,
    NoUsage,
    PodEvents,
    UsageSampler,
    event_on_terminations,
    register_accounting,
)
from dra_driver.prepare import (
    CLAIM_READERS,
    ApiClaimReader,
    ClaimPreparation,
    OrphanSweep,
    read_boot_id,
)
from dra_driver.publish import NodeOwner, SlicePublisher, build_slices

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class PluginOptions:
    """Everything ``kubelet-plugin`` takes from its flags (see ``dra-driver kubelet-plugin -h``)."""

    driver_name: str
    node_name: str
    gpus: str
    kubeconfig: str | None
    plugin_dir: str
    registry_dir: str
    cdi_root: str
    state_dir: str
    node_config: str | None
    rolling_update_uid: str = ""
    metrics_port: int = 0
    metrics_bind_address: str = "127.0.0.1"
    publish_interval: float = 30.0
    health_interval: float = 20.0
    orphan_sweep_interval: float = defaults.SWEEP_INTERVAL_S
    orphan_sweep_first: float = defaults.FIRST_SWEEP_AFTER_S
    registration_timeout: float = defaults.REGISTRATION_TIMEOUT_S
    usage_interval: float = defaults.USAGE_INTERVAL_S
    call_budget: float = DEFAULT_CALL_BUDGET_S
    claim_device_status: bool = True
    mps: MpsOptions = field(default_factory=MpsOptions)
    host_root: str = "/"
    simulation_root: str = ""
    simulated_cdi_hook: str = ""
    simulated_enforcer: str = "mps"

    @property
    def simulated(self) -> bool:
        """Whether the GPUs are simulated (then NVML is simulated and MPS is the emulator's)."""
        return self.gpus.startswith("simulated:")

    @property
    def sim_root(self) -> Path:
        """Simulated nodes' hardware root (``--simulation-root``, default under the state dir)."""
        return Path(self.simulation_root or Path(self.state_dir) / "simulated")


RESTART_EXIT_CODE = 3
"""Exit code of a plugin that stopped to start afresh (not a failure)."""


def run(opts: PluginOptions, stop: threading.Event | None = None) -> int:
    """Run the plugin until SIGTERM/SIGINT (or ``stop``); returns the exit code: 0, or
    :data:`RESTART_EXIT_CODE` when the plugin stopped to start afresh (the NVIDIA driver
    answered again after discovery failed; the kubelet restarts the container).

    Raises:
        DriverError, OSError: start-up failed; whatever had started (servers,
            sockets, threads, the metrics endpoint) was released first (:class:`RunningPlugin`).
    """
    stop = stop or threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal received; stopping", signal=signum)
        stop.set()

    # First: a SIGTERM that arrives while the sockets are being created (a kubelet or a
    # rolling update stopping a pod that just started) must stop the plugin cleanly.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    with RunningPlugin(opts, stop) as plugin:
        log.info("kubelet plugin running", node=opts.node_name, gpus=plugin.gpu_count)
        stop.wait()
    return plugin.exit_code


@dataclass(frozen=True)
class OpenedNode:
    """What the plugin's start learned of its node: the options (on simulated GPUs with the
    installed CDI hook), the GPU state, the node configuration, the kubelet socket paths, and
    the device root that CDI specs name (``device_root``) and where the plugin sees it
    (``device_root_view``)."""

    opts: PluginOptions
    state: NodeState
    config: NodeConfig
    paths: SocketPaths
    device_root: str
    device_root_view: str


class RunningPlugin:
    """The running plugin: owns its servers, sockets, threads and the metrics endpoint.

    Entering starts everything in order; each part registers how it is released, so a
    failure at any step (a busy metrics port, an unwritable directory) releases what had
    started (sockets removed, gRPC servers stopped, threads told to stop) before the error
    propagates. Leaving stops everything in reverse order.

    Args:
        opts: the plugin's options.
        stop: set to stop the threads (also set when the object is left).
    """

    def __init__(self, opts: PluginOptions, stop: threading.Event) -> None:
        self.opts = opts
        self.stop = stop
        self.gpu_count = 0
        self.exit_code = 0
        self._stack = ExitStack()

    def restart(self, reason: str) -> None:
        """Stop the plugin with :data:`RESTART_EXIT_CODE`, so that it starts afresh."""
        log.warning("stopping the plugin to start afresh", reason=reason)
        self.exit_code = RESTART_EXIT_CODE
        self.stop.set()

    def __enter__(self) -> RunningPlugin:
        try:
            self._start()
        except BaseException:
            self.stop.set()
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._stack.close()

    def _start(self) -> None:
        """Start every part in order: the node (GPUs, configuration, sockets), enforcement,
        the kubelet services, the MPS supervisor and client check, metrics, then slice
        publishing."""
        node = self._open_node()
        report = detect_enforcement(
            node.state.inventory,
            simulated=node.opts.simulated,
            root=node.opts.host_root,
            control_binary=node.opts.mps.control_binary,
            hook_path=node.opts.mps.ctk_hook_path,
        )
        opts = node.opts
        sim_root = opts.sim_root if opts.simulated else None
        recording = opts.simulated_enforcer == "recording"
        enforcer, usage = make_enforcer(opts.mps, report, node.state, sim_root, recording)
        api = api_client(node.opts.kubeconfig, CLAIM_READERS, "kubelet-plugin")
        metrics = Metrics()
        preparation = self._serve_kubelet(node, report, enforcer, api, metrics)
        sampler = UsageSampler(preparation.prepared_plans, usage or NoUsage(), opts.usage_interval)
        register_accounting(metrics.registry, preparation.prepared_plans, sampler)
        self._thread("usage-sampler", sampler.run, self.stop)
        self._thread(
            "gpu-driver",
            wait_for_driver,
            node.state,
            node.state.driver_problem is not None,
            self.restart,
            self.stop,
        )
        self._thread("mps-supervisor", supervise, enforcer, node.state, self.stop)
        self._thread("mps-client-cap", police_clients, enforcer, metrics, self.stop)
        if node.opts.metrics_port:
            http, _ = start_http_server(
                node.opts.metrics_port,
                addr=node.opts.metrics_bind_address,
                registry=metrics.registry,
            )
            self._stack.callback(http.server_close)
            self._stack.callback(http.shutdown)
        self._publish(node, report, api, metrics)

    def _open_node(self) -> OpenedNode:
        """The state directory, the node configuration, the GPU inventory and the socket
        paths, checked; on simulated GPUs, their device nodes and CDI hook installed."""
        opts = self.opts
        private_dir(Path(opts.state_dir))  # owner-only before anything is put in it
        config = load_node_config(opts.node_config)
        sim_root = opts.sim_root if opts.simulated else None
        source = open_source(
            opts.gpus,
            seed=opts.node_name,
            lost_file=sim_root / simnode.LOST_GPUS if sim_root else None,
            unloaded_file=sim_root / simnode.DRIVER_UNLOADED if sim_root else None,
            reloaded_file=sim_root / simnode.DRIVER_RELOADED if sim_root else None,
        )
        state = NodeState(source, config, on_driver=partial(write_driver_state, opts.state_dir))
        state.refresh()
        self.gpu_count = len(state.inventory.gpus)
        paths = SocketPaths.for_driver(
            opts.driver_name, opts.plugin_dir, opts.registry_dir, opts.rolling_update_uid
        )
        check_socket_paths(paths, opts.mps, (g.index for g in state.inventory.gpus))
        for records in (opts.mps.user_record_root, opts.mps.record_root):
            private_dir(records)  # the hooks' records name every tenant's containers
        warn_unmatched_selectors(config, state.inventory.gpus, source=opts.node_config)
        device_root = "/"
        # A privileged container's /dev is a copy made at its start; --host-root shows the
        # host's live /dev, where the runtime will look for the nodes a CDI spec names.
        device_root_view = opts.host_root
        if opts.simulated:
            # A real runtime reads our CDI specs: give it device nodes and a hook that exist.
            hook = opts.simulated_cdi_hook or None
            sim = simnode.install(opts.sim_root, state.inventory.gpus, hook)
            opts = replace(opts, mps=replace(opts.mps, ctk_hook_path=str(sim.hook_path)))
            device_root = device_root_view = str(sim.device_root)
            log.info("simulated node hardware ready", root=str(sim.root), hook=str(sim.hook_path))
        return OpenedNode(opts, state, config, paths, device_root, device_root_view)

    def _serve_kubelet(
        self,
        node: OpenedNode,
        report: EnforcementReport,
        enforcer: FractionEnforcer,
        api: ApiClient,
        metrics: Metrics,
    ) -> ClaimPreparation:
        """The claim status writer, Prepare/Unprepare, the kubelet's gRPC services, the
        consumer watch and the MPS outage report (events, condition, metric), started; returns
        the ClaimPreparation."""
        opts = node.opts
        writer: ClaimStatusWriter | None = None
        if opts.claim_device_status:
            writer = ClaimStatusWriter.of(
                api,
                opts.driver_name,
                opts.node_name,
                report,
                metrics,
                opts.mps.default_active_thread_percentage,
            )
            self._thread("claim-status", writer.run, self.stop)
        preparation = ClaimPreparation(
            driver_name=opts.driver_name,
            pool=opts.node_name,
            reader=ApiClaimReader(api, writer.remember if writer else None),
            devices=node.state.devices,
            enforcer=enforcer,
            cdi_root=opts.cdi_root,
            state_dir=opts.state_dir,
            lock=PrepareLock(Path(opts.plugin_dir) / opts.driver_name / "prepare.lock"),
            boot_id=read_boot_id(),
            metrics=metrics,
            device_root=node.device_root,
            call_budget=opts.call_budget,
            device_root_view=node.device_root_view,
            on_prepared=writer.submit if writer else None,
            caps=CapPolicy(node.config.claim_limits, opts.mps.default_active_thread_percentage),
            node_problem=lambda: node.state.driver_problem,
        )
        self._stack.callback(preparation.close)
        preparation.start()
        server = PluginServer(preparation, node.paths, node.state.health, opts.health_interval)
        self._stack.callback(server.stop)
        server.start()
        self._thread(
            "kubelet-registration",
            watch_registration,
            server.registration.called,
            node.paths.registration,
            opts.state_dir,
            metrics.kubelet_registered,
            self.stop,
            opts.registration_timeout,
        )
        watch = ConsumerWatch(Path(opts.mps.user_record_root), writer.observe if writer else None)
        checks: dict[str, PlanCheck] = {"consumers": watch.check}
        if isinstance(enforcer, MpsEnforcer):
            events = PodEvents.of(api, opts.driver_name, opts.node_name)
            self._thread("pod-events", events.run, self.stop)
            outages = MpsOutageReport(
                events, metrics, watch.running_before, writer.flag_clients if writer else None
            )
            enforcer.report_outages(outages.report)
            enforcer.report_terminations(event_on_terminations(events))
            checks["mps-outages"] = outages.check
        self._thread(
            "prepared-claims", watch_prepared, checks, preparation.prepared_plans, self.stop
        )
        if opts.orphan_sweep_interval > 0:
            sweep = OrphanSweep(
                preparation,
                preparation.prepared_refs,
                ApiClaimReader(api),
                lambda uid: bool(watch.running(watch.records(uid))),
                opts.driver_name,
                opts.node_name,
                metrics,
            )
            self._thread(
                "orphan-sweep",
                sweep.run,
                self.stop,
                opts.orphan_sweep_first,
                opts.orphan_sweep_interval,
            )
        return preparation

    def _publish(
        self, node: OpenedNode, report: EnforcementReport, api: ApiClient, metrics: Metrics
    ) -> None:
        """The slice publisher and its watch, started."""
        opts, state = node.opts, node.state
        publisher = SlicePublisher.of_client(api, opts.driver_name, opts.node_name, metrics)
        owner = NodeOwner(api, opts.node_name)

        def changed(event_type: str) -> None:
            if event_type == "DELETED":  # the garbage collector's, when the Node went away
                owner.forget()
            state.wake.set()

        def desired() -> list[dict[str, object]]:
            state.refresh()
            inventory, taints = state.published(opts.driver_name)
            return build_slices(
                inventory,
                node.config,
                opts.driver_name,
                opts.node_name,
                enforcement=report.tiers,
                node_uid=owner.uid(),  # read once; again after a slice was deleted
                taints=taints,
            )

        publishing = self._thread(
            "publisher", publisher.run, self.stop, desired, opts.publish_interval, state.wake
        )
        self._stack.callback(publishing.join, 5)
        self._stack.callback(state.wake.set)  # released first: wakes the publisher to see the stop
        self._thread("slice-watch", publisher.watch, self.stop, changed)

    def _thread(self, name: str, target: Callable[..., object], *args: object) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        return thread
