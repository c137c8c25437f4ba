"""Which GPUs are published after GPUs are lost (one per index, never two devices of one name)
or while the NVIDIA driver is not loaded (none)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

from dra_driver.app.nodestate import NodeState, wait_for_driver
from dra_driver.config.load import load_node_config, parse_node_config
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.model.gpu import NVML_INIT_FAILED, GpuSourceError, Inventory, driver_change
from dra_driver.publish.slices import build_slices

DRIVER = "gpu-fraction.dra.dev"


def test_a_swapped_then_lost_gpu_does_not_publish_duplicate_device_names() -> None:
    g0, g1, spare = SimulatedGpuSource("simulated:H200x3", seed="n").discover().gpus
    g2 = replace(spare, index=1, minor=g1.minor)  # a new card (new UUID) in slot 1
    config = parse_node_config(
        {
            "apiVersion": "gpu-fraction.dra.dev/v1alpha1",
            "kind": "NodeConfig",
            "gpus": [{"selector": {"uuid": g2.uuid}, "computeMode": "sm-sharing"}],
        }
    )
    inventories = [Inventory((g0, g1)), Inventory((g0, g2)), Inventory((g0,))]

    class Source:
        def discover(self) -> Inventory:
            return inventories.pop(0)

    state = NodeState(Source(), config)
    for _ in range(3):  # g1 present; g1 swapped for g2; g2 lost as well
        state.refresh()
    inventory, taints = state.published(DRIVER)
    indexes = [g.index for g in inventory.gpus]
    assert len(indexes) == len(set(indexes)), f"published GPU indexes {indexes}"
    slices = build_slices(inventory, config, DRIVER, "n", taints=taints)
    names = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    assert len(names) == len(set(names)), names


def test_without_its_driver_the_node_publishes_nothing_and_says_why() -> None:
    """NVML cannot start (the NVIDIA driver is not loaded after a reboot): discovery failed and
    the plugin exited before it could unprepare anything (NVIDIA/k8s-driver-manager#213). The
    node now offers no GPU and records why; once the driver answers, the watcher restarts the
    plugin."""
    unloaded = [True]
    source = SimulatedGpuSource("simulated:H200x2", seed="n")

    class Source:
        def discover(self) -> Inventory:
            if unloaded[0]:
                raise GpuSourceError(f"{NVML_INIT_FAILED}: Driver Not Loaded")
            return source.discover()

    seen: list[str | None] = []
    state = NodeState(Source(), load_node_config(None), on_driver=seen.append)
    state.refresh()
    assert state.driver_problem is not None and "Driver Not Loaded" in state.driver_problem
    assert state.devices() == {} and seen == [state.driver_problem]
    inventory, taints = state.published(DRIVER)
    slices = build_slices(inventory, state.config, DRIVER, "n", taints=taints)
    assert [d for s in slices for d in s["spec"].get("devices", [])] == []
    restarts: list[str] = []
    stop = threading.Event()
    watcher = threading.Thread(
        target=wait_for_driver, args=(state, True, restarts.append, stop, 0.01)
    )
    watcher.start()
    time.sleep(0.05)
    assert restarts == []  # still no driver: keeps waiting
    unloaded[0] = False
    watcher.join(5)
    stop.set()
    assert len(restarts) == 1 and state.driver_problem is None
    assert seen[-1] is None and state.devices()


def test_a_driver_reloaded_between_two_discoveries_restarts_the_plugin(tmp_path: Path) -> None:
    """The NVIDIA driver was reloaded between two publish rounds (no failed discovery seen):
    its GPUs have other device minors now. The watcher restarts the plugin, whose start
    rewrites the prepared claims' CDI specs (dra-driver-nvidia-gpu#1144's variant)."""
    reloaded = tmp_path / "driver-reloaded"
    source = SimulatedGpuSource("simulated:H200x2", seed="n", reloaded_file=reloaded)
    state = NodeState(source, load_node_config(None))
    state.refresh()
    before = {g.uuid: g.minor for g in state.inventory.gpus}
    restarts: list[str] = []
    stop = threading.Event()
    watcher = threading.Thread(
        target=wait_for_driver, args=(state, False, restarts.append, stop, 0.01)
    )
    watcher.start()
    state.refresh()
    time.sleep(0.05)
    assert restarts == [] and state.driver_changed is None  # same driver: nothing to do
    reloaded.write_text("16\n")
    state.refresh()  # a publish round
    watcher.join(5)
    stop.set()
    assert {g.uuid: g.minor for g in state.inventory.gpus} == {u: m + 16 for u, m in before.items()}
    [reason] = restarts
    assert "the NVIDIA driver changed" in reason and "/dev/nvidia16 now, was /dev/nvidia0" in reason


def test_driver_change_names_minors_and_versions_not_new_or_lost_gpus() -> None:
    g0, g1 = SimulatedGpuSource("simulated:H200x2", seed="n").discover().gpus
    assert driver_change(Inventory((g0, g1)), Inventory((g0,))) is None  # a lost GPU
    assert driver_change(Inventory((g0,)), Inventory((g0, g1))) is None  # a new one
    moved = replace(g1, minor=9)
    assert driver_change(Inventory((g0, g1)), Inventory((g0, moved))) == (
        f"GPU {g1.uuid} is /dev/nvidia9 now, was /dev/nvidia1"
    )
    upgraded = replace(g0, driver_version="620.1.1")
    assert driver_change(Inventory((g0,)), Inventory((upgraded,))) == (
        f"NVIDIA driver 620.1.1 now, was {g0.driver_version}"
    )
