"""The plugin reports a kubelet that never calls it (kubernetes-sigs/dranet#250,
dra-driver-nvidia-gpu#464): a kubelet whose ``--root-dir`` is not the chart's ``kubeletDir``
never sees the registration socket, and nothing else says why the node's pods wait."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry

from dra_driver._proto import registration_pb2
from dra_driver.app.kubeletwatch import (
    REGISTRATION_STATE_FILE,
    unregistered_problem,
    watch_registration,
)
from dra_driver.infra.metrics import Metrics
from dra_driver.kubelet.registration import RegistrationServicer
from tests.support.waiting import wait_for

SOCKET = Path("/var/lib/kubelet/plugins_registry/gpu-fraction.dra.dev-reg.sock")


def _state(tmp_path: Path) -> dict[str, object]:
    doc: dict[str, object] = json.loads((tmp_path / REGISTRATION_STATE_FILE).read_text())
    return doc


def _gauge(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("dra_gpu_fraction_kubelet_registered")


def test_problem_names_the_socket_the_directory_and_the_chart_value() -> None:
    text = unregistered_problem(SOCKET, 61.4)
    assert str(SOCKET) in text and "in 61 s" in text
    assert "--root-dir is not /var/lib/kubelet;" in text
    assert "chart value kubeletDir" in text


def test_a_kubelet_that_never_calls_is_reported_then_its_late_call_recorded(
    tmp_path: Path,
) -> None:
    called, stop = threading.Event(), threading.Event()
    metrics = Metrics(CollectorRegistry())
    watcher = threading.Thread(
        target=watch_registration,
        args=(called, SOCKET, str(tmp_path), metrics.kubelet_registered, stop, 0.3, 60.0),
    )
    watcher.start()
    try:
        wait_for("the waiting state", lambda: (tmp_path / REGISTRATION_STATE_FILE).exists())
        assert _state(tmp_path)["registered"] is False
        wait_for("the report", lambda: _state(tmp_path)["problem"], timeout=5)
        reported = _state(tmp_path)
        assert reported["registered"] is False and reported["socket"] == str(SOCKET)
        assert "has not called this plugin's registration socket" in str(reported["problem"])
        assert _gauge(metrics) == 0
        assert (tmp_path / REGISTRATION_STATE_FILE).stat().st_mode & 0o777 == 0o600

        called.set()
        watcher.join(timeout=5)
        assert not watcher.is_alive()
        assert _state(tmp_path)["registered"] is True and _state(tmp_path)["problem"] is None
        assert _gauge(metrics) == 1
    finally:
        stop.set()
        watcher.join(timeout=5)


def test_get_info_is_the_call_that_counts() -> None:
    servicer = RegistrationServicer("gpu-fraction.dra.dev", "/var/lib/kubelet/plugins/x.sock")
    assert not servicer.called.is_set()
    servicer.GetInfo(registration_pb2.InfoRequest(), None)  # type: ignore[arg-type]
    assert servicer.called.is_set()


def test_a_prompt_kubelet_leaves_no_problem(tmp_path: Path) -> None:
    called, stop = threading.Event(), threading.Event()
    called.set()
    metrics = Metrics(CollectorRegistry())
    watch_registration(called, SOCKET, str(tmp_path), metrics.kubelet_registered, stop, 0.1)
    assert _state(tmp_path)["registered"] is True and _state(tmp_path)["problem"] is None
    assert _gauge(metrics) == 1


def test_stop_ends_the_watch_while_the_kubelet_is_silent(tmp_path: Path) -> None:
    called, stop = threading.Event(), threading.Event()
    metrics = Metrics(CollectorRegistry())
    watcher = threading.Thread(
        target=watch_registration,
        args=(called, SOCKET, str(tmp_path), metrics.kubelet_registered, stop, 600.0),
    )
    watcher.start()
    wait_for("the waiting state", lambda: (tmp_path / REGISTRATION_STATE_FILE).exists())
    stop.set()
    watcher.join(timeout=5)
    assert not watcher.is_alive()
    assert _state(tmp_path) | {"since": None} == {
        "registered": False,
        "socket": str(SOCKET),
        "problem": None,
        "since": None,
    }
