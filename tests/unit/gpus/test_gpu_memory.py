"""The memory a GPU offers: what processes can allocate, not what the card has.

The driver reserves part of every card for itself (about 450 MiB on a T4, KAI Scheduler
#2212); NVML's v1 ``total`` includes it, the v2 call reports it as ``reserved``.
"""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from dra_driver.gpus import MIB, SimulatedGpuSource
from dra_driver.gpus.nvml import NvmlGpuSource
from dra_driver.gpus.simulated import PROFILES
from tests.support.fakes.pynvml_module import FakeCard, FakePynvml

T4 = FakeCard(total=15360 * MIB, reserved=450 * MIB)


def test_nvml_inventory_offers_total_minus_reserved() -> None:
    nv = FakePynvml([T4])
    [gpu] = NvmlGpuSource(nv).discover().gpus
    assert gpu.memory_bytes == T4.total - T4.reserved
    assert nv.memory_calls == [nv.nvmlMemory_v2]


def test_nvml_without_v2_falls_back_to_v1_with_a_warning() -> None:
    nv = FakePynvml([T4], v2=False)
    with capture_logs() as logs:
        [gpu] = NvmlGpuSource(nv).discover().gpus
    assert gpu.memory_bytes == T4.total
    [warning] = [e for e in logs if e["log_level"] == "warning"]
    assert warning["gpu"] == 0 and "reserved" in warning["event"]


@pytest.mark.parametrize("model", sorted(PROFILES))
def test_simulated_models_reserve_driver_memory(model: str) -> None:
    profile = PROFILES[model]
    [gpu] = SimulatedGpuSource(f"simulated:{model}x1").discover().gpus
    assert 0 < profile.reserved_mib < profile.memory_mib // 20  # an estimate: under 5 %
    assert gpu.memory_bytes == (profile.memory_mib - profile.reserved_mib) * MIB
