"""Which GPUs are published after GPUs are lost: one per index, never two devices of one name."""

from __future__ import annotations

from dataclasses import replace

from dra_driver.app.plugin import NodeState
from dra_driver.config.load import parse_node_config
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.model.gpu import Inventory
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
