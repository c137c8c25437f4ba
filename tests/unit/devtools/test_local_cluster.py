"""``hack/local-cluster``: the client rate-limit knobs of kube-scheduler and
kube-controller-manager (LOCAL_CLUSTER_SCHEDULER_QPS/_BURST, LOCAL_CLUSTER_CM_QPS/_BURST)."""

from __future__ import annotations

from types import ModuleType

import pytest

from devtools import localcluster
from tests.support.paths import REPO

SCRIPT = REPO / "hack" / "local-cluster"
PORTS = {"etcd": 1, "etcd-peer": 2, "apiserver": 3, "controller-manager": 4, "scheduler": 5}
KNOBS = ("SCHEDULER_QPS", "SCHEDULER_BURST", "CM_QPS", "CM_BURST")


def lc() -> ModuleType:
    """devtools.localcluster (hack/local-cluster's module)."""
    return localcluster


@pytest.fixture(autouse=True)
def no_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    for knob in KNOBS:
        monkeypatch.delenv(f"LOCAL_CLUSTER_{knob}", raising=False)
    for comp in ("SCHEDULER", "CONTROLLER_MANAGER"):
        monkeypatch.delenv(f"LOCAL_CLUSTER_{comp}_ARGS", raising=False)


def api_flags(comp: str) -> list[str]:
    return [a for a in lc().command(comp, PORTS) if a.startswith("--kube-api-")]


def test_defaults_pass_no_rate_limit_flags() -> None:
    assert api_flags("kube-scheduler") == []
    assert api_flags("kube-controller-manager") == []


def test_knobs_reach_their_component_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_CLUSTER_SCHEDULER_QPS", "500")
    monkeypatch.setenv("LOCAL_CLUSTER_SCHEDULER_BURST", "1000")
    monkeypatch.setenv("LOCAL_CLUSTER_CM_QPS", "200.5")
    assert api_flags("kube-scheduler") == ["--kube-api-qps=500", "--kube-api-burst=1000"]
    assert api_flags("kube-controller-manager") == ["--kube-api-qps=200.5"]
    assert api_flags("kube-apiserver") == []


@pytest.mark.parametrize(("knob", "value"), [("SCHEDULER_QPS", "fast"), ("CM_BURST", "1.5")])
def test_bad_value_is_refused_with_the_variable_named(
    monkeypatch: pytest.MonkeyPatch, knob: str, value: str
) -> None:
    monkeypatch.setenv(f"LOCAL_CLUSTER_{knob}", value)
    comp = "kube-scheduler" if knob.startswith("SCHEDULER") else "kube-controller-manager"
    with pytest.raises(lc().UpError, match=f"LOCAL_CLUSTER_{knob}"):
        lc().command(comp, PORTS)


def test_help_documents_the_knobs() -> None:
    for knob in KNOBS:
        assert f"LOCAL_CLUSTER_{knob}" in (lc().__doc__ or "")
