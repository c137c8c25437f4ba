"""Device taint decisions: which GPUs are tainted, with which value and since when, and which
lost GPUs stay published."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest
import yaml

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.gpus import Inventory, SimulatedGpuSource, SkippedGpu
from dra_driver.publish.devicetaints import (
    GPU_LOST,
    MPS_CHECK_FAILED,
    NO_SCHEDULE,
    DeviceTaint,
    TaintMemory,
    gpu_taints,
    lost_gpus,
    published_inventory,
    rfc3339,
    taint_key,
)
from tests.support import k8sschema
from tests.support.paths import REPO

DRIVER = DEFAULT_DRIVER_NAME
T0 = datetime(2026, 3, 1, 12, 0, 0, 750000, tzinfo=UTC)
KEY = "gpu-fraction.dra.dev/gpu-unhealthy"


def inventory(lost: frozenset[int] = frozenset()) -> Inventory:
    source = SimulatedGpuSource("simulated:H200x3", seed="n")
    source.vanished |= lost
    return source.discover()


def test_key_is_in_the_driver_domain() -> None:
    assert taint_key(DRIVER) == KEY


def test_rfc3339_is_utc_in_whole_seconds() -> None:
    assert rfc3339(T0) == "2026-03-01T12:00:00Z"
    plus_two = timezone(timedelta(hours=2))
    assert rfc3339(datetime(2026, 3, 1, 14, 0, 1, tzinfo=plus_two)) == "2026-03-01T12:00:01Z"
    with pytest.raises(ValueError, match="no time zone"):
        rfc3339(datetime(2026, 3, 1))


def test_body_is_api_json() -> None:
    taint = DeviceTaint(KEY, GPU_LOST, "2026-03-01T12:00:00Z")
    assert taint.body() == {
        "key": KEY,
        "value": "gpu-lost",
        "effect": "NoSchedule",
        "timeAdded": "2026-03-01T12:00:00Z",
    }


def test_lost_and_failing_gpus_are_tainted_healthy_ones_not() -> None:
    got = gpu_taints(DRIVER, ["GPU-a"], {"GPU-b": "daemon down"}, {}, T0)
    assert got == {
        "GPU-a": DeviceTaint(KEY, GPU_LOST, "2026-03-01T12:00:00Z", NO_SCHEDULE),
        "GPU-b": DeviceTaint(KEY, MPS_CHECK_FAILED, "2026-03-01T12:00:00Z", NO_SCHEDULE),
    }
    assert gpu_taints(DRIVER, [], {}, got, T0) == {}


def test_a_lost_gpu_is_gpu_lost_whatever_its_last_check() -> None:
    got = gpu_taints(DRIVER, ["GPU-a"], {"GPU-a": "daemon down"}, {}, T0)
    assert got["GPU-a"].value == GPU_LOST


def test_a_taint_that_stays_keeps_its_time_a_changed_one_gets_a_new_time() -> None:
    first = gpu_taints(DRIVER, [], {"GPU-a": "x", "GPU-b": "y"}, {}, T0)
    later = T0 + timedelta(minutes=5)
    second = gpu_taints(DRIVER, ["GPU-b"], {"GPU-a": "other reason"}, first, later)
    assert second["GPU-a"] == first["GPU-a"]  # same value: same body
    assert second["GPU-b"].value == GPU_LOST
    assert second["GPU-b"].time_added == "2026-03-01T12:05:00Z"


def test_a_taint_that_went_and_came_back_gets_a_new_time() -> None:
    first = gpu_taints(DRIVER, ["GPU-a"], {}, {}, T0)
    gone = gpu_taints(DRIVER, [], {}, first, T0 + timedelta(seconds=10))
    back = gpu_taints(DRIVER, ["GPU-a"], {}, gone, T0 + timedelta(seconds=20))
    assert back["GPU-a"].time_added == "2026-03-01T12:00:20Z"


def test_another_driver_name_does_not_reuse_a_remembered_taint() -> None:
    first = gpu_taints("other.example.com", ["GPU-a"], {}, {}, T0)
    got = gpu_taints(DRIVER, ["GPU-a"], {}, first, T0 + timedelta(seconds=1))
    assert got["GPU-a"].key == KEY and got["GPU-a"].time_added == "2026-03-01T12:00:01Z"


def test_lost_gpus_are_the_seen_ones_missing_now_with_their_last_record() -> None:
    full = inventory()
    now = inventory(lost=frozenset({1}))
    older = replace(full.gpus[1], driver_version="1.0")
    seen = [older, *full.gpus]
    assert lost_gpus(now, seen) == {full.gpus[1].uuid: full.gpus[1]}
    unreadable = Inventory(gpus=now.gpus, skipped=(SkippedGpu(1, "NVML_ERROR_GPU_IS_LOST"),))
    assert set(lost_gpus(unreadable, seen)) == {full.gpus[1].uuid}
    assert lost_gpus(full, seen) == {}


def test_published_inventory_keeps_lost_gpus_in_index_order() -> None:
    full = inventory()
    now = inventory(lost=frozenset({1}))
    kept = published_inventory(now, lost_gpus(now, full.gpus))
    assert [g.index for g in kept.gpus] == [0, 1, 2]
    assert kept.gpus == full.gpus
    assert published_inventory(full, {}) is full


def test_a_lost_gpu_whose_index_is_taken_is_not_published() -> None:
    full = inventory()
    renumbered = replace(full.gpus[1], uuid="GPU-new")
    now = Inventory(gpus=(full.gpus[0], renumbered, full.gpus[2]))
    lost = lost_gpus(now, full.gpus)
    assert set(lost) == {full.gpus[1].uuid}
    assert published_inventory(now, lost).gpus == now.gpus


def test_memory_keeps_times_and_drops_healed_gpus() -> None:
    times = iter([T0, T0 + timedelta(seconds=30), T0 + timedelta(seconds=60)])
    memory = TaintMemory(clock=lambda: next(times))
    full = inventory()
    uuid1 = full.gpus[1].uuid
    published, taints = memory.update(DRIVER, inventory(lost=frozenset({1})), full.gpus, {})
    assert published.gpus == full.gpus
    assert taints == {uuid1: DeviceTaint(KEY, GPU_LOST, "2026-03-01T12:00:00Z")}
    _, again = memory.update(DRIVER, inventory(lost=frozenset({1})), full.gpus, {})
    assert again == taints
    healed, none = memory.update(DRIVER, full, full.gpus, {})
    assert healed.gpus == full.gpus and none == {} and memory.taints == {}


def test_the_docs_device_taint_rule_example_is_valid() -> None:
    """docs/examples/device-taint-rule.yaml passes the Kubernetes 1.37 schema and selects a
    device of this driver, with the effect the driver leaves to administrators."""
    rule = yaml.safe_load((REPO / "docs" / "examples" / "device-taint-rule.yaml").read_text())
    k8sschema.validate(rule)
    assert (rule["apiVersion"], rule["kind"]) == ("resource.k8s.io/v1", "DeviceTaintRule")
    assert rule["spec"]["deviceSelector"]["driver"] == DRIVER
    assert rule["spec"]["taint"]["effect"] == "NoExecute"
