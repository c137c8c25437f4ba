"""``dra-driver occupancy``'s USED, SM% and NOTE: the plugins' metrics read back (the names
the plugin exports, parsed from a real scrape) and shown per claim."""

from __future__ import annotations

import json
from dataclasses import replace

from prometheus_client import generate_latest

from dra_driver.cluster.occupancyrender import render_json, render_table
from dra_driver.cluster.occupancyusage import ClaimUse, metrics_port, note, parse_metrics
from dra_driver.cluster.occupancywait import build_report
from dra_driver.infra.metrics import Metrics
from dra_driver.observe.accounting import FractionUsage, register_accounting
from dra_driver.observe.usagesampler import UsageSampler
from tests.support.fakes.plans import GIB, H200_MIB, MIB, device, gpu, plan
from tests.unit.cluster.test_occupancy import DRIVER, busy_cluster
from tests.unit.observe.test_usage_sampler import Clock, Source

UID = "0d000000-0000-4000-8000-00000000000d"


def test_the_plugins_metrics_read_back() -> None:
    g = gpu(0)
    p = plan(device(g, H200_MIB * MIB // 4, H200_MIB * MIB // 2), uid=UID, name="q")
    source, clock = Source(), Clock()
    source.usage[(UID, g.uuid)] = FractionUsage(
        used_bytes=H200_MIB * MIB // 2, clients=1, sm_percent=10.0
    )
    sampler = UsageSampler(lambda: [p], source, clock=clock)
    metrics = Metrics()
    register_accounting(metrics.registry, lambda: [p], sampler)
    sampler.sample_once()
    got = parse_metrics(generate_latest(metrics.registry).decode())
    assert got == {
        (UID, g.uuid): ClaimUse(
            used_bytes=H200_MIB * MIB // 2,
            sm_percent=10.0,
            sm_normalized=40.0,
            near_ceiling=True,
            idle_seconds=0.0,
        )
    }
    assert parse_metrics("") == {}


def test_notes() -> None:
    assert note(None) == "-" and note(ClaimUse()) == "-"
    assert note(ClaimUse(near_ceiling=True, idle_seconds=1799)) == "near-ceiling"
    assert note(ClaimUse(near_ceiling=True, idle_seconds=3725)) == "near-ceiling,idle 62m"


def test_metrics_port() -> None:
    pod = {"spec": {"containers": [{"ports": [{"name": "http", "containerPort": 1}]}]}}
    assert metrics_port(pod) is None
    pod["spec"]["containers"].append({"ports": [{"name": "metrics", "containerPort": 8080}]})
    assert metrics_port(pod) == 8080


def test_claims_show_their_usage_and_unreadable_nodes_are_named() -> None:
    cluster = busy_cluster()
    report = build_report(cluster, DRIVER)
    g0, g1 = report.gpus
    q1 = next(h for h in g0.holders if h.name == "q1")
    plain = render_table(report).splitlines()
    header = next(line for line in plain if line.startswith("NODE") and "CLAIM" in line)
    assert header.split()[-3:] == ["USED", "SM%", "NOTE"]
    assert all(line.split()[-3:] == ["-", "-", "-"] for line in plain if "default/" in line)
    use = ClaimUse(used_bytes=30 * GIB, sm_percent=10, sm_normalized=40, idle_seconds=3600)
    with_usage = replace(report, usage={(q1.uid, g0.uuid): use})
    lines = render_table(with_usage).splitlines()
    rows = {w[2]: w for w in (line.split() for line in lines) if len(w) > 2 and "/" in w[2]}
    assert rows["default/q1"][-4:] == ["30.0Gi", "40", "idle", "60m"]
    assert rows["default/q2"][-3:] == ["-", "-", "-"]  # the plugin knows nothing of it
    doc = json.loads(render_json(with_usage))
    claims = {c["name"]: c for c in doc["gpus"][0]["claims"]}
    assert claims["q1"]["usage"] == {
        "usedBytes": 30 * GIB,
        "smPercent": 10,
        "smNormalizedPercent": 40,
        "nearCeiling": False,
        "idleSeconds": 3600,
    }
    assert claims["q2"]["usage"] is None
    broken = replace(with_usage, usage_problems={"node-a": "403 Forbidden"})
    text = render_table(broken)
    assert "usage of node-a unknown: 403 Forbidden" in text
    assert all(
        line.split()[-3:] == ["?", "?", "?"]
        for line in text.splitlines()
        if "default/" in line and "node-a" in line
    )
    assert json.loads(render_json(broken))["usageUnknown"] == {"node-a": "403 Forbidden"}
    assert g1.holders
