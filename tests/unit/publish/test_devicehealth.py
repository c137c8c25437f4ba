"""Device health decisions."""

from __future__ import annotations

from dra_driver.config.load import load_node_config
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.publish.devicehealth import device_health
from dra_driver.publish.offer import offered_devices


def test_present_lost_and_failing_gpus() -> None:
    source = SimulatedGpuSource("simulated:H200x3", seed="n")
    seen = {d.name: d for d in offered_devices(source.discover(), load_node_config(None))}
    source.vanished.add(2)
    current = {d.name: d for d in offered_devices(source.discover(), load_node_config(None))}
    uuid1 = next(d.gpu.uuid for d in seen.values() if d.gpu.index == 1)
    health = device_health(current, seen, {uuid1: "daemon down"})
    assert set(health) == set(seen)
    by_gpu = {i: {health[n].healthy for n, d in seen.items() if d.gpu.index == i} for i in range(3)}
    assert by_gpu == {0: {True}, 1: {False}, 2: {False}}
    assert all("daemon down" in health[n].message for n, d in seen.items() if d.gpu.index == 1)
    assert all(
        "no longer in the node's GPU inventory" in health[n].message
        for n, d in seen.items()
        if d.gpu.index == 2
    )
