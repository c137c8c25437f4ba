"""Usage per fraction: the sampler (bounded rate, idle clocks, warnings), the normalized SM
utilization, NVML's process utilization and the metrics a scrape reports from the last
sample."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from dra_driver.app.args import build_parser
from dra_driver.enforce.mps.nvmlcontrol import NvmlError, PynvmlFacade
from dra_driver.infra.metrics import Metrics
from dra_driver.model.plans import ClaimPlan
from dra_driver.observe.accounting import (
    FractionUsage,
    fraction_rows,
    normalized_sm,
    portion,
    register_accounting,
)
from dra_driver.observe.usage import MpsUsageSource
from dra_driver.observe.usagesampler import UsageSampler, is_idle
from tests.support.fakes.plans import GIB, H200_MIB, MIB, Node, device, gpu, plan
from tests.unit.observe.test_accounting import labels, scrape

UID = "0c000000-0000-4000-8000-00000000000c"
CARD = H200_MIB * MIB


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Source:
    def __init__(self) -> None:
        self.usage: dict[tuple[str, str], FractionUsage] = {}
        self.calls = 0
        self.fail = False

    def snapshot(self, plans: Sequence[ClaimPlan]) -> Mapping[tuple[str, str], FractionUsage]:
        self.calls += 1
        if self.fail:
            raise NvmlError("nvmlDeviceGetProcessUtilization: GPU is lost")
        return dict(self.usage)


def quarter() -> tuple[ClaimPlan, str]:
    g = gpu(0)
    return plan(device(g, CARD // 4, CARD // 2), uid=UID, name="q"), g.uuid


def test_portion_and_normalization() -> None:
    g = gpu(0)
    ts = fraction_rows([plan(device(g, CARD // 4))])[0]
    sm = fraction_rows([plan(device(g, CARD // 8, mode="sm-sharing", threads=25))])[0]
    admin = fraction_rows([plan(device(g, 0, 0))])[0]
    assert portion(ts) == 0.25 and portion(sm) == 0.25 and portion(admin) is None
    assert normalized_sm(10, ts) == 40  # a quarter using a tenth of the card: 40% of its part
    assert normalized_sm(20, sm) == 80
    assert normalized_sm(60, ts) == 100  # time slicing lends idle time: capped, raw shows 60
    assert normalized_sm(10, admin) is None
    two = plan(
        device(g, GIB, mode="sm-sharing", threads=30),
        device(g, GIB, mode="sm-sharing", threads=30, name="gpu-0-x"),
    )
    assert fraction_rows([two])[0].threads == 60  # one namespace on the GPU: summed


def test_idle_rule() -> None:
    assert is_idle(FractionUsage(clients=0)) is True
    assert is_idle(FractionUsage(clients=2, sm_percent=0.0)) is True
    assert is_idle(FractionUsage(clients=2, sm_percent=3.0)) is False
    assert is_idle(FractionUsage(clients=2)) is False
    assert is_idle(FractionUsage()) is None


def test_scrapes_report_the_last_sample_and_never_ask_the_source() -> None:
    p, uuid = quarter()
    source, clock, metrics = Source(), Clock(), Metrics()
    source.usage[(UID, uuid)] = FractionUsage(used_bytes=CARD // 4, clients=1, sm_percent=12.5)
    sampler = UsageSampler(lambda: [p], source, interval_s=15, clock=clock)
    register_accounting(metrics.registry, lambda: [p], sampler)
    got = scrape(metrics)
    assert got[("dra_gpu_fraction_accounting_up", ())] == 0  # no sample yet
    assert ("dra_gpu_fraction_claim_memory_used_bytes", labels(p, uuid, "time-slicing")) not in got
    sampler.sample_once()
    for _ in range(3):
        got = scrape(metrics)
    assert source.calls == 1
    la = labels(p, uuid, "time-slicing")
    assert got[("dra_gpu_fraction_claim_memory_used_ratio", la)] == 0.5
    assert got[("dra_gpu_fraction_claim_near_ceiling", la)] == 0
    assert got[("dra_gpu_fraction_claim_sm_utilization_percent", la)] == 12.5
    assert got[("dra_gpu_fraction_claim_sm_utilization_normalized_percent", la)] == 50
    assert got[("dra_gpu_fraction_claim_idle_seconds", la)] == 0
    assert got[("dra_gpu_fraction_accounting_up", ())] == 1
    clock.now += 46  # more than 3 intervals without a sample: stale
    assert scrape(metrics)[("dra_gpu_fraction_accounting_up", ())] == 0
    source.fail = True
    with capture_logs() as logs:
        sampler.sample_once()
    assert scrape(metrics)[("dra_gpu_fraction_accounting_up", ())] == 0
    assert [e["event"] for e in logs] == ["accounting: usage source failed"]


def test_idle_clock_and_warnings_once_per_episode() -> None:
    p, uuid = quarter()
    key = (UID, uuid)
    source, clock = Source(), Clock()
    sampler = UsageSampler(lambda: [p], source, interval_s=10, idle_warn_s=60, clock=clock)
    source.usage[key] = FractionUsage(used_bytes=GIB, clients=1, sm_percent=0.0)
    with capture_logs() as logs:
        sampler.sample_once()
        clock.now += 59
        sampler.sample_once()
        assert sampler.idle_seconds(key) == 59
        assert not logs
        clock.now += 1
        sampler.sample_once()
        clock.now += 10
        sampler.sample_once()
    assert [e["event"] for e in logs] == [
        "fraction idle: it holds a share of the GPU and has used no SMs"
    ]
    assert logs[0]["idle_seconds"] == 60 and logs[0]["claim_uid"] == UID
    source.usage[key] = FractionUsage(used_bytes=CARD // 2, clients=1, sm_percent=5.0)
    with capture_logs() as logs:
        sampler.sample_once()
        sampler.sample_once()
    assert sampler.idle_seconds(key) == 0
    assert [e["event"] for e in logs] == [
        "fraction near its memory ceiling: its next GPU allocations are about to fail"
    ]
    assert logs[0]["used_bytes"] == CARD // 2 and logs[0]["limit_bytes"] == CARD // 2
    source.usage[key] = FractionUsage(used_bytes=GIB, clients=1, sm_percent=5.0)
    sampler.sample_once()
    source.usage[key] = FractionUsage(used_bytes=CARD // 2, clients=1, sm_percent=5.0)
    with capture_logs() as logs:
        sampler.sample_once()
    assert len(logs) == 1  # a new episode warns again
    assert sampler.idle_seconds(("other", uuid)) is None


def test_the_sampler_thread_outlives_failures_and_stops() -> None:
    p, uuid = quarter()
    source = Source()
    source.fail = True
    sampler = UsageSampler(lambda: [p], source, interval_s=0.01)
    stop = threading.Event()
    thread = threading.Thread(target=sampler.run, args=(stop,))
    thread.start()
    while source.calls < 3:
        stop.wait(0.01)
    source.fail = False
    source.usage[(UID, uuid)] = FractionUsage(clients=1, sm_percent=1.0)
    while not sampler.fresh():
        stop.wait(0.01)
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_mps_source_sums_the_claims_processes_sm(tmp_path: Path) -> None:
    node = Node(tmp_path, tiers={0: "cooperative", 1: "cooperative"})
    g0 = node.gpus[0]
    p = plan(device(g0, 4 * GIB), uid=UID, name="q")
    node.enforcer.apply(p)
    ns = "c_" + UID.replace("-", "_")
    pipe = node.pipe("time-slicing")
    a = node.mps.add_client(pipe, "gpu_0", ns)
    b = node.mps.add_client(pipe, "gpu_0", ns)
    other = node.mps.add_client(pipe, "gpu_0", "default")
    node.nvml.gpus[g0.uuid].sm_utilization = {a: 30.0, other: 50.0}
    source = MpsUsageSource(node.enforcer, node.nvml)
    seen = source.snapshot([p])[(UID, g0.uuid)]
    assert seen.sm_percent == 30.0 and seen.clients == 2  # b ran nothing: 0
    node.nvml.gpus[g0.uuid].sm_utilization = {a: 30.0, b: 12.5}
    assert source.snapshot([p])[(UID, g0.uuid)].sm_percent == 42.5


class FakePynvml:
    """The few pynvml names :class:`PynvmlFacade` uses for process utilization."""

    NVML_ERROR_NOT_FOUND = 6

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self) -> None:
        self.samples: list[Any] | None = []
        self.asked: list[int] = []

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def nvmlDeviceGetProcessUtilization(self, handle: str, since: int) -> list[Any]:
        self.asked.append(since)
        if self.samples is None:
            raise self.NVMLError(15)  # e.g. GPU is lost
        if not self.samples:
            raise self.NVMLError(self.NVML_ERROR_NOT_FOUND)
        return self.samples


def test_pynvml_process_utilization() -> None:
    nv = FakePynvml()
    facade = PynvmlFacade(nv)
    assert facade.process_sm_utilization("GPU-x") == {}  # NVML_ERROR_NOT_FOUND: none ran
    nv.samples = [
        SimpleNamespace(pid=7, timeStamp=100, smUtil=10),
        SimpleNamespace(pid=7, timeStamp=300, smUtil=30),
        SimpleNamespace(pid=8, timeStamp=200, smUtil=5),
    ]
    assert facade.process_sm_utilization("GPU-x") == {7: 20.0, 8: 5.0}
    nv.samples = [SimpleNamespace(pid=8, timeStamp=400, smUtil=9)]
    assert facade.process_sm_utilization("GPU-x") == {8: 9.0}
    assert nv.asked == [0, 0, 300]  # each call reads the samples after the newest seen
    nv.samples = None
    with pytest.raises(NvmlError, match="nvmlDeviceGetProcessUtilization"):
        facade.process_sm_utilization("GPU-x")


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_usage_interval_must_be_positive(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["kubelet-plugin", "--node-name=n", f"--usage-interval={value}"])
    assert "usage-interval" in capsys.readouterr().err


def test_a_slow_nvml_delays_no_prepare(tmp_path: Path) -> None:
    """NVML that takes 2 s to answer a usage read (a hung driver call) while the sampler reads:
    a claim applied meanwhile is not held up, since the sampler asks NVML outside the
    enforcer's lock."""
    node = Node(tmp_path, tiers={0: "cooperative", 1: "cooperative"})
    g0 = node.gpus[0]
    first = plan(device(g0, 4 * GIB), uid=UID, name="first")
    node.enforcer.apply(first)
    ns = "c_" + UID.replace("-", "_")
    node.mps.add_client(node.pipe("time-slicing"), "gpu_0", ns)
    entered, release = threading.Event(), threading.Event()
    slow = node.nvml.process_sm_utilization

    def hung(uuid: str) -> dict[int, float]:
        entered.set()
        release.wait(2)
        return slow(uuid)

    node.nvml.process_sm_utilization = hung  # type: ignore[method-assign]
    sampler = UsageSampler(lambda: [first], MpsUsageSource(node.enforcer, node.nvml))
    reader = threading.Thread(target=sampler.sample_once)
    reader.start()
    assert entered.wait(5)
    start = time.monotonic()
    node.enforcer.apply(plan(device(g0, 4 * GIB), name="second"))
    took = time.monotonic() - start
    release.set()
    reader.join(5)
    assert took < 1.0, f"Prepare waited {took:.1f} s for NVML"
    assert sampler.fresh()
