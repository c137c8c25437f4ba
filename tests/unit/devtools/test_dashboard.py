"""The Grafana dashboard in ``deployments/grafana/`` queries only metrics the plugin exports.

The exported names are derived at test time from the registry the plugin serves on
``/metrics`` (``Metrics`` plus the accounting collector, wired as ``dra_driver.app.plugin.run``
does), not from a list kept here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.infra.metrics import Metrics
from dra_driver.observe.accounting import NoUsage, register_accounting
from dra_driver.observe.usagesampler import UsageSampler
from tests.support.paths import REPO

ROOT = REPO
DASHBOARD = ROOT / "deployments" / "grafana" / "gpu-fraction-dra.json"

# Series names a family exposes, by type, in the Prometheus text format that
# prometheus_client writes (counters get ``_total`` and ``_created``, histograms
# ``_bucket``/``_count``/``_sum``/``_created``; gauges their own name).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
}
# PromQL functions, aggregation operators and keywords (prometheus.io/docs/prometheus/latest/
# querying/functions/ and /operators/) the dashboard may use; any other word is a metric name.
PROMQL_WORDS = {
    "abs",
    "and",
    "avg",
    "bool",
    "bottomk",
    "ceil",
    "clamp_max",
    "clamp_min",
    "count",
    "floor",
    "group_left",
    "group_right",
    "histogram_quantile",
    "increase",
    "irate",
    "label_replace",
    "max",
    "max_over_time",
    "min",
    "offset",
    "or",
    "rate",
    "round",
    "sort_desc",
    "sum",
    "topk",
    "unless",
    "vector",
}


def exported_families() -> dict[str, str]:
    """Metric family name -> type, from the registry the plugin serves."""
    metrics = Metrics()
    register_accounting(metrics.registry, list, UsageSampler(list, NoUsage()))
    return {family.name: family.type for family in metrics.registry.collect()}


def series_of(family: str, kind: str) -> set[str]:
    """Series names of one family in the text format."""
    assert kind in SUFFIXES, f"{family}: unexpected type {kind}"
    return {family + suffix for suffix in SUFFIXES[kind]}


def exported_series() -> set[str]:
    """Every series name the plugin's ``/metrics`` can carry."""
    families = exported_families()
    return {name for family, kind in families.items() for name in series_of(family, kind)}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (strings, label matchers, ranges, grouping
    clauses, Grafana variables and numbers removed; what remains besides PromQL words)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\$\{[^}]*\}|\$\w+", "", text)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\b\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\b", "", text)
    return set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text)) - PROMQL_WORDS


def variable_metrics(query: str) -> set[str]:
    """Metric of a Grafana ``label_values(metric, label)`` variable query."""
    m = re.fullmatch(r"label_values\((.+),\s*\w+\)", query.strip())
    assert m, f"unsupported variable query {query!r}"
    return metric_names(m.group(1))


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(where, PromQL)`` of every panel target."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} ref {target['refId']}", target["expr"]


def unknown_metrics(dashboard: dict[str, Any], exported: set[str]) -> list[str]:
    """One message per query or variable naming a metric not in ``exported``."""
    found = []
    for where, expr in queries(dashboard):
        found += [f"{where}: {name}" for name in sorted(metric_names(expr) - exported)]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            found += [
                f"variable {var['name']}: {n}" for n in sorted(variable_metrics(query) - exported)
            ]
    return found


def load() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def test_every_query_uses_exported_metrics() -> None:
    assert unknown_metrics(load(), exported_series()) == []


def test_a_misspelt_metric_is_caught() -> None:
    dashboard = load()
    panel = next(p for p in panels(dashboard) if p.get("targets"))
    target = panel["targets"][0]
    target["expr"] = 'sum(rate(dra_gpu_fraction_prepare_errors_total{operation="prepare"}[5m]))'
    assert unknown_metrics(dashboard, exported_series()) == [
        f"panel {panel['title']!r} ref {target['refId']}: dra_gpu_fraction_prepare_errors_total"
    ]


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (le) (rate(a_bucket{x="1"}[$__rate_interval]))', {"a_bucket"}),
        ("histogram_quantile(0.99, b) / on(claim_uid) group_left c", {"b", "c"}),
        ("up > 1e3", {"up"}),
    ],
)
def test_metric_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_every_exported_family_has_a_panel() -> None:
    """Each metric family appears in some panel (a new metric gets a panel or a reason)."""
    used = {name for _, expr in queries(load()) for name in metric_names(expr)}
    unused = {f for f, kind in exported_families().items() if not used & series_of(f, kind)}
    assert unused == set()


def test_panels_have_queries_titles_and_descriptions() -> None:
    dashboard = load()
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel.get("description"), panel
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
