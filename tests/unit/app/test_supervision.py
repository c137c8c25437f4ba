"""The plugin supervises any enforcer through its ``check_health`` (issue 13, item 4): the MPS
enforcer is checked every interval, an enforcer with nothing to supervise ends the loop. GPUs
failing the check, and lost GPUs, get a taint on their published devices."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

from structlog.testing import capture_logs

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.app.nodestate import NodeState, check_mps, supervise
from dra_driver.config.node import NodeConfig
from dra_driver.enforce import GpuHealth, MpsEnforcer, MpsOptions, RecordingEnforcer
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.publish.devicetaints import GPU_LOST, MPS_CHECK_FAILED, taint_key
from dra_driver.publish.slices import build_slices, slice_devices
from tests.support.fakes.mps_control import FakeMpsControl, FakeNvml


class Counting(MpsEnforcer):
    """The MPS enforcer, counting its health checks."""

    checks = 0

    def check_health(self) -> dict[str, GpuHealth]:
        self.checks += 1
        return super().check_health()


def test_recording_enforcer_has_nothing_to_supervise() -> None:
    state = SimpleNamespace(unhealthy_gpus={"GPU-x": "left from before"})
    assert RecordingEnforcer().check_health() is None
    assert check_mps(RecordingEnforcer(), state) is False  # type: ignore[arg-type]
    assert state.unhealthy_gpus == {"GPU-x": "left from before"}


def test_supervise_ends_for_an_enforcer_with_nothing_to_supervise() -> None:
    state = SimpleNamespace(unhealthy_gpus={})
    returned = threading.Event()

    def run() -> None:
        supervise(RecordingEnforcer(), state, threading.Event(), 0.01)  # type: ignore[arg-type]
        returned.set()

    threading.Thread(target=run, daemon=True).start()
    assert returned.wait(5.0)


def test_supervise_checks_the_mps_enforcer_until_stopped(tmp_path: Path) -> None:
    enforcer = Counting({}, FakeNvml({}), FakeMpsControl([]), MpsOptions(root=str(tmp_path)))
    state = SimpleNamespace(unhealthy_gpus={"GPU-x": "stale"}, wake=threading.Event())
    stop = threading.Event()
    loop = threading.Thread(target=supervise, args=(enforcer, state, stop, 0.01))
    loop.start()
    try:
        loop.join(0.5)
        assert loop.is_alive()
    finally:
        stop.set()
        loop.join(5.0)
    assert not loop.is_alive()
    assert enforcer.checks >= 2
    assert state.unhealthy_gpus == {}
    assert state.wake.is_set()  # GPU-x healthy again: its taint goes at once


class Scripted:
    """An enforcer whose health checks return the given results, one per call."""

    def __init__(self, *results: dict[str, GpuHealth]) -> None:
        self.results = list(results)

    def check_health(self) -> dict[str, GpuHealth]:
        return self.results.pop(0)


def node(spec: str = "simulated:H200x3") -> tuple[NodeState, SimulatedGpuSource]:
    source = SimulatedGpuSource(spec, seed="node-a")
    state = NodeState(source, NodeConfig())
    state.refresh()
    return state, source


def taints_by_gpu(state: NodeState) -> dict[int, set[str]]:
    """GPU index -> the taint values over its published devices ("" for none)."""
    inventory, taints = state.published(DEFAULT_DRIVER_NAME)
    slices = build_slices(inventory, state.config, DEFAULT_DRIVER_NAME, "node-a", taints=taints)
    out: dict[int, set[str]] = {}
    for d in slice_devices(slices):
        values = {t["value"] for t in d.get("taints", [])} or {""}
        out.setdefault(d["attributes"]["index"]["int"], set()).update(values)
    return out


def test_a_failed_mps_check_taints_the_gpu_at_once_until_it_passes() -> None:
    state, _ = node()
    uuid = state.inventory.gpus[1].uuid
    bad = {uuid: GpuHealth(uuid, False, "daemon down")}
    enforcer = Scripted(bad, {**bad, uuid: GpuHealth(uuid, False, "server down")}, {})
    assert check_mps(enforcer, state)  # type: ignore[arg-type]
    assert state.wake.is_set()
    assert taints_by_gpu(state) == {0: {""}, 1: {MPS_CHECK_FAILED}, 2: {""}}
    _, first = state.published(DEFAULT_DRIVER_NAME)
    assert first[uuid].key == taint_key(DEFAULT_DRIVER_NAME)
    state.wake.clear()
    assert check_mps(enforcer, state)  # type: ignore[arg-type]
    assert not state.wake.is_set()  # still the same GPUs: nothing new to publish
    assert state.published(DEFAULT_DRIVER_NAME)[1] == first  # same time: same slice body
    assert check_mps(enforcer, state)  # type: ignore[arg-type]
    assert state.wake.is_set()
    with capture_logs() as logs:
        assert taints_by_gpu(state) == {0: {""}, 1: {""}, 2: {""}}
    assert [(e["event"], e["gpu"]) for e in logs] == [("GPU taint removed", uuid)]


def test_a_new_taint_is_logged_once_with_its_reason() -> None:
    state, _ = node()
    uuid = state.inventory.gpus[2].uuid
    bad = {uuid: GpuHealth(uuid, False, "daemon down")}
    assert check_mps(Scripted(bad), state)  # type: ignore[arg-type]
    with capture_logs() as logs:
        state.published(DEFAULT_DRIVER_NAME)
        state.published(DEFAULT_DRIVER_NAME)
    assert [(e["event"], e["gpu"], e["taint"], e["reason"]) for e in logs] == [
        ("GPU tainted", uuid, MPS_CHECK_FAILED, "daemon down")
    ]


def test_a_lost_gpu_stays_published_tainted_until_it_is_back() -> None:
    state, source = node()
    source.vanished.add(2)
    state.refresh()
    assert 2 not in {d.gpu.index for d in state.devices().values()}  # Prepare cannot use it
    assert taints_by_gpu(state) == {0: {""}, 1: {""}, 2: {GPU_LOST}}
    restarted = NodeState(source, NodeConfig())  # a new plugin process: never saw GPU 2
    restarted.refresh()
    assert taints_by_gpu(restarted) == {0: {""}, 1: {""}}
    source.vanished.clear()
    state.refresh()
    assert taints_by_gpu(state) == {0: {""}, 1: {""}, 2: {""}}
