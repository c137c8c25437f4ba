"""The plugin supervises any enforcer through its ``check_health`` (issue 13, item 4): the MPS
enforcer is checked every interval, an enforcer with nothing to supervise ends the loop."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

from dra_driver.mps import GpuHealth, MpsEnforcer, MpsOptions, RecordingEnforcer
from dra_driver.plugin import check_mps, supervise
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
    state = SimpleNamespace(unhealthy_gpus={"GPU-x": "stale"})
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
