"""SIGKILL the real plugin process at random instants of Prepare, Unprepare and start-up.

Each trial drives ``python -m dra_driver kubelet-plugin --gpus=simulated:H200x2`` over its real
unix sockets (claims served by the HTTP API stand-in), kills it with SIGKILL while a
NodePrepareResources or NodeUnprepareResources call is in flight (and, every third trial, kills
the restarted process again during its start-up), restarts it, and checks every claim on disk
(:mod:`tests.support.crashcheck`): all there (checkpoint record, CDI spec, pipe directories) or all
gone. Then Prepare of the same claims must succeed with CDI devices whose spec exists, and
Unprepare must remove everything.

The unit tier runs a few trials; ``DRA_CRASH_TRIALS=200`` runs the full experiment
(about 6 s a trial), ``DRA_CRASH_SEED`` replays one. The summary line is printed (``-s``).
"""

from __future__ import annotations

import collections
import os
import random
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver._proto import dra_v1_pb2
from dra_driver.kubelet.server import SocketPaths
from tests.integration.test_cli import CLI, _kubeconfig
from tests.support import claimfactory as cf
from tests.support.apiserver_stub import ClaimServer
from tests.support.crashcheck import ABSENT, PREPARED, claim_state, spec_device_ids
from tests.support.kubelet import Kubelet, kubelet_connect
from tests.support.node import NODE, plugin_devices, share_result

TRIALS = int(os.environ.get("DRA_CRASH_TRIALS", "3"))
SEED = int(os.environ.get("DRA_CRASH_SEED", str(time.time_ns() % 1_000_000)))
PHASES = ("prepare", "unprepare", "start-up")
GPUS = "simulated:H200x2"
DEVICES = plugin_devices(GPUS, NODE)
"""The plugin's devices (default node configuration)."""
READY_LINE = "simulated node hardware ready"
"""Logged by the plugin just before it builds the driver and reconciles (start-up proper)."""


@dataclass
class Plugin:
    """The plugin process on one node's directories: launched, killed, launched again."""

    root: Path
    api: ClaimServer
    proc: subprocess.Popen[bytes] | None = None
    log_offset: int = 0

    @property
    def paths(self) -> SocketPaths:
        return SocketPaths.for_driver(DEFAULT_DRIVER_NAME, f"{self.root}/p", f"{self.root}/r")

    @property
    def log(self) -> Path:
        return self.root / "plugin.log"

    def launch(self) -> None:
        kubeconfig = _kubeconfig(self.root / "kubeconfig", self.api.api_client().configuration.host)
        self.log_offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    *CLI,
                    "kubelet-plugin",
                    f"--node-name={NODE}",
                    f"--gpus={GPUS}",
                    f"--kubeconfig={kubeconfig}",
                    f"--plugin-dir={self.root}/p",
                    f"--registry-dir={self.root}/r",
                    f"--cdi-root={self.root}/cdi",
                    f"--state-dir={self.root}/s",
                    f"--mps-root={self.root}/run",
                    "--publish-interval=3600",
                    # Crash consistency of records, CDI specs and the checkpoint; MPS between
                    # real processes across plugin kills is tests/e2e/test_e2e_mps_service.py.
                    "--simulated-enforcer=recording",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def started_up(self) -> bool:
        """Whether this launch has logged :data:`READY_LINE`."""
        with self.log.open("rb") as log:
            log.seek(self.log_offset)
            return READY_LINE.encode() in log.read()

    def ready(self, timeout: float = 60) -> Kubelet:
        """Wait until the plugin answers the kubelet (start-up reconciliation is done)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                return kubelet_connect(self.paths)
            except grpc.RpcError:
                time.sleep(0.02)
        raise AssertionError(f"plugin not ready in {timeout} s: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def state(self, uid: str) -> str:
        return claim_state(self.root / "s", self.root / "cdi", self.root / "run", uid)


def _refs(claims: list[dict[str, Any]]) -> list[dra_v1_pb2.Claim]:
    return [
        dra_v1_pb2.Claim(
            namespace=c["metadata"]["namespace"],
            name=c["metadata"]["name"],
            uid=c["metadata"]["uid"],
        )
        for c in claims
    ]


def _prepare(kubelet: Kubelet, claims: list[dict[str, Any]]) -> Any:
    request = dra_v1_pb2.NodePrepareResourcesRequest(claims=_refs(claims))
    return kubelet.v1.NodePrepareResources.future(request, timeout=45)


def _unprepare(kubelet: Kubelet, claims: list[dict[str, Any]]) -> Any:
    request = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=_refs(claims))
    return kubelet.v1.NodeUnprepareResources.future(request, timeout=45)


def _errors(reply: Any) -> dict[str, str]:
    return {uid: r.error for uid, r in reply.claims.items() if r.error}


@dataclass
class Experiment:
    """Trials against one plugin; ``windows`` (seconds) bound the random kill delays."""

    plugin: Plugin
    rng: random.Random
    windows: dict[str, float] = field(default_factory=dict)
    kubelet: Kubelet | None = None
    found: collections.Counter[str] = field(default_factory=collections.Counter)
    interrupted: collections.Counter[str] = field(default_factory=collections.Counter)

    def claims(self) -> list[dict[str, Any]]:
        """Fresh claims: one quarter, one claim on both GPUs (its own MPS server), one half."""
        gpu0, gpu1 = (DEVICES[f"gpu-{i}-time-slicing"] for i in (0, 1))
        made = [
            cf.claim([share_result(gpu0, NODE, "quarter")]),
            cf.claim([share_result(gpu0, NODE, "eighth"), share_result(gpu1, NODE, "eighth")]),
            cf.claim([share_result(gpu1, NODE, "half")]),
        ]
        for c in made:
            self.plugin.api.add(c)
        return made

    def restart(self) -> Kubelet:
        if self.kubelet is not None:
            self.kubelet.channel.close()
        self.plugin.launch()
        self.kubelet = self.plugin.ready()
        return self.kubelet

    def calibrate(self) -> None:
        """Time Prepare, Unprepare (median of 3) and the start-up proper, to aim the kills."""
        started = time.monotonic()
        self.plugin.launch()
        while not self.plugin.started_up():
            time.sleep(0.002)
        line = time.monotonic()
        self.kubelet = self.plugin.ready()
        self.windows["start-up"] = 1.5 * (time.monotonic() - line)
        self.windows["launch"] = line - started
        took: dict[str, list[float]] = {"prepare": [], "unprepare": []}
        for _ in range(3):
            claims = self.claims()
            for op, call in (("prepare", _prepare), ("unprepare", _unprepare)):
                t0 = time.monotonic()
                assert not _errors(call(self.kubelet, claims).result())
                took[op].append(time.monotonic() - t0)
        for op, seconds in took.items():
            self.windows[op] = 1.2 * statistics.median(seconds)

    def trial(self, phase: str) -> str:
        """One kill (two for ``start-up``) and the checks; returns "" or what went wrong."""
        assert self.kubelet is not None
        claims = self.claims()
        op = phase if phase != "start-up" else self.rng.choice(("prepare", "unprepare"))
        if op == "unprepare":
            assert not _errors(_prepare(self.kubelet, claims).result())
        else:  # some claims already prepared: Prepare's recorded path is on the line too
            done = [c for c in claims if self.rng.random() < 0.3]
            assert not _errors(_prepare(self.kubelet, done).result())
        call = _prepare if op == "prepare" else _unprepare
        future = call(self.kubelet, claims)
        time.sleep(self.rng.uniform(0, self.windows[op]))
        self.plugin.kill()
        self.interrupted[op] += 0 if future.exception() is None else 1
        if phase == "start-up":
            self.plugin.launch()
            while not self.plugin.started_up() and self.plugin.proc.poll() is None:  # type: ignore[union-attr]
                time.sleep(0.002)
            time.sleep(self.rng.uniform(0, self.windows["start-up"]))
            self.plugin.kill()
        kubelet = self.restart()
        problem = self.check(kubelet, claims)
        if problem:  # leave the devices free for the next trial
            _unprepare(kubelet, claims).result()
        return problem

    def check(self, kubelet: Kubelet, claims: list[dict[str, Any]]) -> str:
        """Every claim all there or all gone; Prepare then answers CDI devices whose spec
        exists; Unprepare removes everything. Returns "" or what went wrong."""
        uids = [c["metadata"]["uid"] for c in claims]
        states = {u: self.plugin.state(u) for u in uids}
        self.found.update(s if s in (PREPARED, ABSENT) else "inconsistent" for s in states.values())
        bad = {u: s for u, s in states.items() if s not in (PREPARED, ABSENT)}
        if bad:
            return f"after the restart: {bad}"
        reply = _prepare(kubelet, claims).result()
        if _errors(reply):
            return f"prepare after the restart failed: {_errors(reply)}"
        for uid in uids:
            listed = spec_device_ids(self.plugin.root / "cdi", uid)
            answered = {i for d in reply.claims[uid].devices for i in d.cdi_device_ids}
            if not answered or not answered <= listed or self.plugin.state(uid) != PREPARED:
                return f"claim {uid}: answered {answered}, spec lists {listed}"
        errors = _errors(_unprepare(kubelet, claims).result())
        left = {u: s for u in uids if (s := self.plugin.state(u)) != ABSENT}
        return f"unprepare: errors {errors}, left {left}" if errors or left else ""


@pytest.fixture
def experiment() -> Iterator[Experiment]:
    with tempfile.TemporaryDirectory(prefix="drak-") as tmp, ClaimServer() as api:
        run = Experiment(Plugin(Path(tmp), api), random.Random(SEED))
        try:
            yield run
        finally:
            if run.plugin.proc is not None and run.plugin.proc.poll() is None:
                run.plugin.kill()


@pytest.mark.timeout(120 + 20 * TRIALS)
def test_sigkill_at_random_instants_leaves_every_claim_whole_or_gone(
    experiment: Experiment,
) -> None:
    experiment.calibrate()
    failures: dict[int, str] = {}
    for i in range(TRIALS):
        problem = experiment.trial(PHASES[i % len(PHASES)])
        if problem:
            failures[i] = f"{PHASES[i % len(PHASES)]}: {problem}"
    windows = {k: round(v, 3) for k, v in experiment.windows.items()}
    print(
        f"\ncrash trials: {TRIALS - len(failures)}/{TRIALS} consistent (seed {SEED}); "
        f"claims found after restarts: {dict(experiment.found)}; calls cut off by the kill: "
        f"{dict(experiment.interrupted)}; kill windows (s): {windows}"
    )
    assert not failures, f"seed {SEED}: {failures}"
