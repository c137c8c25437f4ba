"""Per-fraction accounting: the custom collector, scraped through prometheus_client."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.enforce.mps.nvmlcontrol import UNLIMITED, CgroupMemory, MpsProcess
from dra_driver.infra.metrics import Metrics
from dra_driver.model.plans import ClaimPlan
from dra_driver.observe.accounting import (
    FractionUsage,
    UsageSource,
    fraction_rows,
    register_accounting,
)
from dra_driver.observe.usage import MpsUsageSource
from dra_driver.observe.usagesampler import UsageSampler
from tests.support.fakes.plans import GIB, Node, device, gpu, plan

UID_A = "0a000000-0000-4000-8000-00000000000a"
UID_B = "0b000000-0000-4000-8000-00000000000b"


def scrape(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def labels(p: ClaimPlan, gpu_uuid: str, mode: str) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted(
            {
                "claim_namespace": p.claim.namespace,
                "claim_name": p.claim.name,
                "claim_uid": p.claim.uid,
                "gpu_uuid": gpu_uuid,
                "compute_mode": mode,
            }.items()
        )
    )


def sampled(
    metrics: Metrics, plans: Callable[[], Sequence[ClaimPlan]], source: UsageSource
) -> UsageSampler:
    """A sampler over ``source`` registered in ``metrics``, with one sample taken."""
    sampler = UsageSampler(plans, source)
    register_accounting(metrics.registry, plans, sampler)
    sampler.sample_once()
    return sampler


class StaticSource:
    def __init__(self, usage: Mapping[tuple[str, str], FractionUsage], fail: bool = False) -> None:
        self.usage = usage
        self.fail = fail
        self.seen: list[int] = []

    def snapshot(self, plans: Sequence[ClaimPlan]) -> Mapping[tuple[str, str], FractionUsage]:
        self.seen.append(len(plans))
        if self.fail:
            raise RuntimeError("MPS daemon unreachable")
        return self.usage


def test_collector_reports_request_limit_used_clients() -> None:
    g0, g1 = gpu(0), gpu(1)
    a = plan(device(g0, 10 * GIB, 20 * GIB), uid=UID_A, name="a")
    b = plan(
        device(g1, 4 * GIB, 6 * GIB, mode="sm-sharing", name="gpu-1-quarter-0"),
        device(g1, 2 * GIB, 2 * GIB, mode="sm-sharing", name="gpu-1-quarter-1"),
        uid=UID_B,
        name="b",
    )
    metrics = Metrics()
    metrics.operations.labels(operation="prepare").inc()
    source = StaticSource(
        {
            (UID_A, g0.uuid): FractionUsage(used_bytes=3 * GIB, clients=2),
            (UID_B, g1.uuid): FractionUsage(used_bytes=None, clients=0),
        }
    )
    sampled(metrics, lambda: [a, b], source)
    got = scrape(metrics)
    la, lb = labels(a, g0.uuid, "time-slicing"), labels(b, g1.uuid, "sm-sharing")
    assert got[("dra_gpu_fraction_claim_memory_request_bytes", la)] == 10 * GIB
    assert got[("dra_gpu_fraction_claim_memory_limit_bytes", la)] == 20 * GIB
    assert got[("dra_gpu_fraction_claim_memory_used_bytes", la)] == 3 * GIB
    assert got[("dra_gpu_fraction_claim_clients", la)] == 2
    assert got[("dra_gpu_fraction_claim_memory_request_bytes", lb)] == 6 * GIB
    assert got[("dra_gpu_fraction_claim_memory_limit_bytes", lb)] == 8 * GIB
    assert ("dra_gpu_fraction_claim_memory_used_bytes", lb) not in got  # unknown: no fake zero
    assert got[("dra_gpu_fraction_claim_clients", lb)] == 0
    assert got[("dra_gpu_fraction_accounting_up", ())] == 1
    assert got[("dra_gpu_fraction_operations_total", (("operation", "prepare"),))] == 1
    assert source.seen == [2]
    scrape(metrics)
    assert source.seen == [2]  # a scrape reports the last sample, it never asks the source


def test_collector_survives_a_failing_source_and_follows_plans() -> None:
    g = gpu(0)
    plans = [plan(device(g, GIB), uid=UID_A)]
    metrics = Metrics()
    sampler = sampled(metrics, lambda: plans, StaticSource({}, fail=True))
    got = scrape(metrics)
    assert got[("dra_gpu_fraction_accounting_up", ())] == 0
    assert (
        got[("dra_gpu_fraction_claim_memory_limit_bytes", labels(plans[0], g.uuid, "time-slicing"))]
        == GIB
    )
    plans.clear()
    sampler.sample_once()
    got = scrape(metrics)
    assert not any(name.startswith("dra_gpu_fraction_claim_") for name, _ in got)


def test_duplicate_registration_is_refused() -> None:
    metrics = Metrics()
    sampler = UsageSampler(list, StaticSource({}))
    register_accounting(metrics.registry, list, sampler)
    with pytest.raises(ValueError):
        register_accounting(metrics.registry, list, sampler)


def test_fraction_rows_cap_limit_at_card() -> None:
    g = gpu(0, memory_mib=1024)
    p = plan(
        device(g, 600 << 20, 1024 << 20),
        device(g, 600 << 20, 1024 << 20, name="gpu-0-x"),
        uid=UID_A,
    )
    (row,) = fraction_rows([p])
    assert row.limit_bytes == 1024 << 20 and row.request_bytes == 1024 << 20


def test_mps_usage_source(tmp_path: Path) -> None:
    node = Node(tmp_path, tiers={0: "hard", 1: "cooperative"})
    g0, g1 = node.gpus
    a = plan(device(g0, 10 * GIB, 20 * GIB), uid=UID_A, name="a")
    b = plan(device(g1, 4 * GIB, mode="sm-sharing", threads=50), uid=UID_B, name="b")
    node.enforcer.apply(a)
    node.enforcer.apply(b)
    # claim A (hard): two recorded containers, one still running with 5 GiB in use
    cg = tmp_path / "cgroup/kubepods/pod1"
    (cg / "ctr1").mkdir(parents=True)
    records = tmp_path / "run/cgroups" / UID_A
    records.mkdir(parents=True)
    (records / "ctr1").write_text("/kubepods/pod1/ctr1\n")
    (records / "ctr0").write_text("/kubepods/pod1/ctr0\n")
    node.nvml.cgroups[(g0.uuid, str(cg / "ctr1"))] = CgroupMemory(10 * GIB, 20 * GIB, 5 * GIB)
    node.mps.add_client(node.pipe("time-slicing"), "gpu_0", "c_" + UID_A.replace("-", "_"))
    # claim B (cooperative): two MPS clients, memory from NVML's MPS process list
    pipe = node.pipe("sm-sharing")
    ns_b = "c_" + UID_B.replace("-", "_")
    p1 = node.mps.add_client(pipe, "gpu_1", ns_b)
    p2 = node.mps.add_client(pipe, "gpu_1", ns_b)
    node.mps.add_client(pipe, "gpu_1", "default")
    node.nvml.gpus[g1.uuid].processes = [
        MpsProcess(p1, GIB),
        MpsProcess(p2, 512 << 20),
        MpsProcess(9, 7),
    ]
    metrics = Metrics()
    sampler = sampled(metrics, lambda: [a, b], MpsUsageSource(node.enforcer, node.nvml))
    got = scrape(metrics)
    la, lb = labels(a, g0.uuid, "time-slicing"), labels(b, g1.uuid, "sm-sharing")
    assert got[("dra_gpu_fraction_claim_memory_used_bytes", la)] == 5 * GIB
    assert got[("dra_gpu_fraction_claim_clients", la)] == 1
    assert got[("dra_gpu_fraction_claim_memory_used_bytes", lb)] == GIB + (512 << 20)
    assert got[("dra_gpu_fraction_claim_clients", lb)] == 2
    assert got[("dra_gpu_fraction_accounting_up", ())] == 1
    # an MPS process whose memory NVML cannot tell makes the total unknown, not smaller
    node.nvml.gpus[g1.uuid].processes = [MpsProcess(p1, GIB), MpsProcess(p2, None)]
    sampler.sample_once()
    assert ("dra_gpu_fraction_claim_memory_used_bytes", lb) not in scrape(metrics)
    assert node.nvml.cgroups[(g0.uuid, str(cg / "ctr1"))].hard_bytes != UNLIMITED
