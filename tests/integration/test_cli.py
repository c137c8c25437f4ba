"""The ``dra-driver`` command line, run as a user runs it (subprocesses)."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver._proto import dra_v1_pb2
from dra_driver.app.args import build_parser as _parser
from dra_driver.gpus import MIB, SimulatedGpuSource
from dra_driver.kubelet.server import SocketPaths
from dra_driver.model.plans import ClaimRef
from tests.support import claimfactory as cf
from tests.support.apiserver_stub import ClaimServer
from tests.support.kubelet import kubelet_connect
from tests.support.node import Node, plugin_devices, share_result

CLI = [sys.executable, "-m", "dra_driver"]
REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "dra_driver"]


@pytest.mark.parametrize(
    "sub", [[], ["kubelet-plugin"], ["render-slices"], ["status"], ["occupancy"]]
)
def test_help_everywhere(sub: list[str]) -> None:
    out = subprocess.run([*CLI, *sub, "--help"], capture_output=True, text=True, check=True)
    assert "usage: dra-driver" in out.stdout


def test_render_slices_prints_api_json() -> None:
    out = subprocess.run(
        [*CLI, "render-slices", "--node", "n1", "--gpus", "simulated:H200x2"],
        capture_output=True,
        text=True,
        check=True,
    )
    slices = json.loads(out.stdout)
    assert slices and all(s["kind"] == "ResourceSlice" for s in slices)
    assert {s["spec"]["driver"] for s in slices} == {DEFAULT_DRIVER_NAME}
    assert "null" not in out.stdout


def test_render_slices_bad_spec_is_a_clear_error() -> None:
    out = subprocess.run(
        [*CLI, "render-slices", "--node", "n1", "--gpus", "simulated:H900x2"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "unknown simulated GPU model 'H900'" in out.stderr


def _kubeconfig(path: Path, host: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": host}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


PLUGIN_NODE = "n1"
PLUGIN_GPUS = "simulated:H200x1"
"""Node name and GPUs of the plugin :func:`_start_plugin` runs."""


def _start_plugin(
    tmp: str, api: ClaimServer, *extra: str
) -> tuple[subprocess.Popen[str], SocketPaths]:
    kubeconfig = _kubeconfig(Path(tmp) / "kubeconfig", api.api_client().configuration.host)
    paths = SocketPaths.for_driver(DEFAULT_DRIVER_NAME, f"{tmp}/p", f"{tmp}/r")
    proc = subprocess.Popen(
        [
            *CLI,
            "kubelet-plugin",
            f"--node-name={PLUGIN_NODE}",
            f"--gpus={PLUGIN_GPUS}",
            f"--kubeconfig={kubeconfig}",
            f"--plugin-dir={tmp}/p",
            f"--registry-dir={tmp}/r",
            f"--cdi-root={tmp}/cdi",
            f"--state-dir={tmp}/s",
            f"--mps-root={tmp}/run",
            "--publish-interval=3600",
            # These tests are about the plugin's process (metrics, signals, start-up), not MPS:
            # no MPS service runs beside it (MPS between processes: test_mps_emulator*.py).
            "--simulated-enforcer=recording",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not paths.registration.exists() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.1)
    return proc, paths


def _quarter() -> dict[str, Any]:
    """A quarter of GPU 0 of the plugin :func:`_start_plugin` runs, as the scheduler allocates
    it: a share of ``gpu-0-time-slicing``."""
    return share_result(
        plugin_devices(PLUGIN_GPUS, PLUGIN_NODE)["gpu-0-time-slicing"], PLUGIN_NODE, "quarter"
    )


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.stderr.read() if proc.stderr else ""


def test_plugin_stops_cleanly_on_sigterm() -> None:
    with tempfile.TemporaryDirectory(prefix="drac-") as tmp, ClaimServer() as api:
        proc, paths = _start_plugin(tmp, api)
        kubelet = kubelet_connect(paths)
        assert kubelet.info.endpoint == str(paths.dra)
        kubelet.channel.close()
        stderr = _stop(proc)
        assert not paths.registration.exists()
        assert not paths.dra.exists()
        assert "plugin stopped; sockets removed" in stderr


def _prepare_over_socket(paths: SocketPaths, meta: dict[str, str]) -> None:
    """NodePrepareResources (v1) of one claim over the plugin's socket, as the kubelet calls
    it; the claim must be prepared."""
    kubelet = kubelet_connect(paths)
    try:
        reply = kubelet.v1.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[
                    dra_v1_pb2.Claim(
                        namespace=meta["namespace"], name=meta["name"], uid=meta["uid"]
                    )
                ]
            ),
            timeout=45,
        )
    finally:
        kubelet.channel.close()
    assert reply.claims[meta["uid"]].error == ""


def test_metrics_scraped_from_running_plugin() -> None:
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="drac-") as tmp, ClaimServer() as api:
        claim = cf.claim([_quarter()])
        api.add(claim)
        m = claim["metadata"]
        proc, paths = _start_plugin(tmp, api, f"--metrics-port={port}")
        try:
            _prepare_over_socket(paths, m)
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        finally:
            _stop(proc)
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    [prepared] = [
        s for s in families["dra_gpu_fraction_operations"].samples if s.name.endswith("_total")
    ]
    assert prepared.labels == {"operation": "prepare"} and prepared.value == 1
    [limit] = families["dra_gpu_fraction_claim_memory_limit_bytes"].samples
    assert limit.labels["claim_uid"] == m["uid"]
    assert limit.labels["compute_mode"] == "time-slicing"
    [h200] = SimulatedGpuSource(PLUGIN_GPUS, seed=PLUGIN_NODE).discover().gpus
    assert limit.value == h200.memory_bytes // 4 // MIB * MIB


def test_render_slices_bad_node_name_is_a_clear_error() -> None:
    out = subprocess.run(
        [*CLI, "render-slices", "--node", "Bad_Node", "--gpus", "simulated:H200x1"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "node name 'Bad_Node' is not a DNS subdomain" in out.stderr


def test_status_lists_prepared_claims(node: Node) -> None:
    claim = cf.claim([node.share(0, "quarter")])
    node.claims.add(claim)
    m = claim["metadata"]
    preparation = node.preparation()
    preparation.prepare([ClaimRef(m["namespace"], m["name"], m["uid"])])
    preparation.close()
    out = subprocess.run(
        [*CLI, "status", f"--state-dir={node.state_dir}"],
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["bootId"] == "boot-1"
    assert doc["claims"][m["uid"]]["name"] == m["name"]
    assert doc["claims"][m["uid"]]["devices"][0]["device"] == node.device(0, "quarter")
    assert doc["currentBoot"] is False and "earlier boot" in doc["note"]
    (node.root / "empty").mkdir()
    empty = subprocess.run(
        [*CLI, "status", f"--state-dir={node.root}/empty"],
        capture_output=True,
        text=True,
        check=True,
    )
    # which directory was read, and that it holds no checkpoint (it printed only {"claims": {}})
    empty_dir = node.root / "empty"
    assert json.loads(empty.stdout) == {
        "stateDir": str(empty_dir),
        "checkpoint": str(empty_dir / "checkpoint.json"),
        "claims": {},
    }
    assert f"{empty_dir} holds no checkpoint" in empty.stderr
    missing = subprocess.run(
        [*CLI, "status", f"--state-dir={node.root}/typo"], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    (node.state_dir / "checkpoint.json").write_text("null")
    corrupt = subprocess.run(
        [*CLI, "status", f"--state-dir={node.state_dir}"], capture_output=True, text=True
    )
    assert corrupt.returncode == 2 and "unusable: not a JSON object" in corrupt.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--node-config=/nonexistent/config.yaml"], "/nonexistent/config.yaml"),
        (["--gpus=simulated:H900x1"], "unknown simulated GPU model 'H900'"),
        (["--default-active-thread-percentage=0"], "0 is outside 1..100"),
        (["--call-budget=45"], "45 s is outside [1, 45): the kubelet gives each call 45 s"),
        (["--call-budget=soon"], "'soon' is not a number of seconds"),
    ],
)
def test_plugin_start_errors_are_clear(tmp_path: Path, args: list[str], message: str) -> None:
    out = subprocess.run(
        [
            *CLI,
            "kubelet-plugin",
            "--node-name=n1",
            "--gpus=simulated:H200x1",
            f"--kubeconfig={tmp_path}/kubeconfig",
            f"--state-dir={tmp_path}/s",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_plugin_modes_do_not_depend_on_the_umask() -> None:
    """Started under umask 000, nothing the plugin creates is open to other local users:
    sockets, state and CDI specs owner-only (issue 10, item 11; issue 26, item 5)."""
    with tempfile.TemporaryDirectory(prefix="drac-") as tmp, ClaimServer() as api:
        root = Path(tmp)
        claim = cf.claim([_quarter()])
        api.add(claim)
        m = claim["metadata"]
        old = os.umask(0)
        try:
            proc, paths = _start_plugin(tmp, api)
        finally:
            os.umask(old)
        try:
            _prepare_over_socket(paths, m)
            sockets = {p: _mode(p) for p in (paths.dra, paths.registration)}
        finally:
            _stop(proc)
        assert sockets == {paths.dra: 0o600, paths.registration: 0o600}
        spec = root / "cdi" / f"{DEFAULT_DRIVER_NAME}-claim_{m['uid']}.json"
        assert {
            "plugin dir": _mode(paths.dra.parent),
            "registry dir": _mode(paths.registration.parent),
            "state dir": _mode(root / "s"),
            "checkpoint": _mode(root / "s" / "checkpoint.json"),
            "prepare lock": _mode(paths.dra.parent / "prepare.lock"),
            "CDI dir": _mode(root / "cdi"),
            "CDI spec": _mode(spec),
        } == {
            "plugin dir": 0o700,
            "registry dir": 0o700,
            "state dir": 0o700,
            "checkpoint": 0o600,
            "prepare lock": 0o600,
            "CDI dir": 0o755,
            "CDI spec": 0o600,  # the runtime reads it as root; tenants learn nothing from it
        }
        sim = root / "s" / "simulated"
        assert _mode(sim / "dev" / "nvidia0") == 0o666  # the simulated node's own modes
        assert _mode(sim / "bin" / "nvidia-cdi-hook") == 0o755
        writable = [
            str(p)
            for p in root.rglob("*")
            if _mode(p) & 0o002
            and not stat.S_ISCHR(p.lstat().st_mode)
            and p.name != "kubeconfig"  # the test's own file, written under umask 000 too
        ]
        assert writable == []


def _listening(port: int) -> set[str]:
    """IPv4 addresses with a TCP socket listening on ``port`` (from /proc/net/tcp)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, _, hex_port = local.partition(":")
        if state == "0A" and int(hex_port, 16) == port:
            out.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return out


def _wait_running(proc: subprocess.Popen[str], timeout: float = 60) -> None:
    """Read the plugin's log until it says it runs (its SIGTERM handler is then installed)."""
    running = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "kubelet plugin running" in line:
                running.set()

    threading.Thread(target=read, daemon=True).start()
    assert running.wait(timeout), "the plugin did not start"


@pytest.mark.parametrize(("flags", "address"), [((), "127.0.0.1"), (("0.0.0.0",), "0.0.0.0")])
def test_metrics_bind_address(flags: tuple[str, ...], address: str) -> None:
    port = _free_port()
    extra = [f"--metrics-bind-address={a}" for a in flags]
    with tempfile.TemporaryDirectory(prefix="drac-") as tmp, ClaimServer() as api:
        proc, _ = _start_plugin(tmp, api, f"--metrics-port={port}", *extra)
        try:
            _wait_running(proc)
            assert _listening(port) == {address}
        finally:
            _stop(proc)


def test_api_client_keeps_a_connection_per_claim_reader(tmp_path: Path) -> None:
    """Claims are read by CLAIM_READERS threads in parallel; with urllib3's default pool of 10
    connections the rest were opened and discarded on every batch (100 claims: 1.3 s instead
    of 0.3 s in benchmarks/bench_prepare.py). Its requests, and those of its single-try
    copies, name the driver in their User-Agent (audit logs tell them apart)."""
    from dra_driver.infra.kubeconfig import api_client, single_try
    from dra_driver.prepare.reads import CLAIM_READERS

    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1")
    api = api_client(str(kubeconfig), CLAIM_READERS, "kubelet-plugin")
    assert api.configuration.connection_pool_maxsize >= CLAIM_READERS
    assert api.rest_client.pool_manager.connection_pool_kw["maxsize"] >= CLAIM_READERS
    assert re.fullmatch(r"dra-driver/\S+ \(kubelet-plugin\)", api.user_agent)
    assert single_try(api).user_agent == api.user_agent


def test_every_option_has_help_and_shows_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--help`` of every subcommand describes every option, and an option with a default
    names it (the README says every flag is described there)."""
    for env in ("DRA_DRIVER_NAME", "NODE_NAME", "GPUS", "KUBECONFIG", "POD_UID"):
        monkeypatch.delenv(env, raising=False)

    def shown(default: object) -> str:
        return f"{default:g}" if isinstance(default, float) else str(default)

    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    problems = []
    for command, p in sub.choices.items():
        formatter = p._get_formatter()
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flag = f"{command} {action.option_strings[0]}"
            text = formatter._expand_help(action) if action.help else ""
            if not text.strip():
                problems.append(f"{flag}: no help text")
            elif action.default not in (None, "") and (
                shown(action.default) not in text or "default" not in text
            ):  # the value alone matched by chance: "(1..100)" for 100, "(0: off)" for 0
                problems.append(f"{flag}: help does not name the default {action.default!r}")
    assert problems == [], "\n".join(problems)


def test_render_slices_warns_about_a_selector_matching_no_gpu(tmp_path: Path) -> None:
    """The admin guide's configuration check shows a mistyped UUID, as the plugin's log does."""
    config = tmp_path / "node.yaml"
    config.write_text(
        "apiVersion: gpu-fraction.dra.dev/v1alpha1\nkind: NodeConfig\ngpus:\n"
        "  - selector: {index: 0}\n    computeMode: sm-sharing\n"
        "  - selector: {uuid: GPU-00000000-typo}\n    enabled: false\n"
    )
    out = subprocess.run(
        [*CLI, "render-slices", "--node", "n1", "--gpus", "simulated:H200x2"]
        + ["--config", str(config)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout)
    logged = [json.loads(line) for line in out.stderr.splitlines()]
    [warning] = [entry for entry in logged if entry["level"] == "warning"]
    assert warning["entry"] == "gpus[1]" and warning["node_config"] == str(config)
    assert "GPU-00000000-typo" in warning["detail"] and "matches no GPU" in warning["detail"]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "no such file"),
        ("", "empty"),
        ("a: [\n", "not YAML"),
        ("just text\n", "not a kubeconfig"),
        ("a: b\n", "Expected key current-context"),
    ],
)
def test_bad_kubeconfig_is_named_with_what_to_do(content: str | None, reason: str) -> None:
    with tempfile.TemporaryDirectory(prefix="drac-") as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        if content is not None:
            kubeconfig.write_text(content)
        dirs = [f"--{flag}={tmp}/{flag}" for flag in ("plugin-dir", "registry-dir", "cdi-root")]
        out = subprocess.run(
            [*CLI, "kubelet-plugin", "--node-name=n1", "--gpus=simulated:H200x1", *dirs]
            + [f"--kubeconfig={kubeconfig}", f"--state-dir={tmp}/s", f"--mps-root={tmp}/run"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2
    [error] = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert f"kubeconfig {kubeconfig}: " in error and reason in error
    assert "--kubeconfig" in error and "KUBECONFIG" in error
    assert "Traceback" not in out.stderr


def test_occupancy_without_an_api_server_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = _kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}")
    out = subprocess.run(
        [*CLI, "occupancy", "--kubeconfig", str(config)], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "cannot read the API server" in out.stderr
    assert out.stdout == ""


def test_occupancy_with_a_missing_kubeconfig_names_the_file_not_the_server(
    tmp_path: Path,
) -> None:
    """The kubeconfig error was followed by "check the kubeconfig's server address and that
    the API server runs", which points a user at the wrong problem."""
    missing = tmp_path / "nonexistent"
    out = subprocess.run(
        [*CLI, "occupancy", "--kubeconfig", str(missing)], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and f"kubeconfig {missing}: no such file" in out.stderr
    assert "server address" not in out.stderr


@pytest.mark.parametrize(
    "sub", [["render-slices", "--node=n", "--gpus=simulated:H200x8"], ["status"]]
)
def test_output_cut_short_by_the_reader_is_not_a_traceback(sub: list[str], tmp_path: Path) -> None:
    """`dra-driver occupancy | head -5` ended in a BrokenPipeError traceback; every command
    that prints a report writes through the same helper (occupancy's own run needs an API
    server: tests/integration/test_occupancy_cluster.py). The reader here closes its end
    before the command writes, as ``head`` does once it has its lines."""
    if sub == ["status"]:
        sub = ["status", f"--state-dir={tmp_path}"]
    proc = subprocess.Popen([*CLI, *sub], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    rc = proc.wait(timeout=60)
    stderr = proc.stderr.read().decode()
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
    assert rc == 0


def _no_kubeconfig_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG",)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env["HOME"] = str(tmp_path / "home")  # no ~/.kube/config
    return env


def test_occupancy_with_kubeconfig_env_missing_names_it_like_the_flag(tmp_path: Path) -> None:
    """With KUBECONFIG exported but the file gone, occupancy fell back to the in-cluster
    configuration and said only 'Service host/port is not set.'"""
    gone = tmp_path / "cluster" / "kubeconfig"
    env = {**_no_kubeconfig_env(tmp_path), "KUBECONFIG": str(gone)}
    out = subprocess.run([*CLI, "occupancy"], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"kubeconfig {gone}: no such file" in out.stderr
    assert f"(from KUBECONFIG={gone})" in out.stderr
    assert "Service host/port" not in out.stderr


def test_occupancy_with_kubeconfig_env_and_no_server_names_the_server_and_the_source(
    tmp_path: Path,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = _kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}")
    env = {**_no_kubeconfig_env(tmp_path), "KUBECONFIG": str(config)}
    out = subprocess.run([*CLI, "occupancy"], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"https://127.0.0.1:{port} (from KUBECONFIG={config})" in out.stderr


def test_occupancy_without_any_configuration_says_what_was_tried(tmp_path: Path) -> None:
    out = subprocess.run(
        [*CLI, "occupancy"], capture_output=True, text=True, env=_no_kubeconfig_env(tmp_path)
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    for tried in ("no --kubeconfig", "KUBECONFIG is unset", "~/.kube/config", "not a pod"):
        assert tried in out.stderr
    assert "Service host/port" not in out.stderr


def test_status_of_a_garbage_checkpoint_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """A 5000-digit integer made json.loads raise a plain ValueError: a traceback."""
    (tmp_path / "checkpoint.json").write_bytes(b'{"version": ' + b"1" * 5000 + b"}")
    out = subprocess.run(
        [*CLI, "status", "--state-dir", str(tmp_path)], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "is unusable: not JSON" in out.stderr


def test_the_admin_guides_check_of_the_example_node_config_warns_of_nothing() -> None:
    """The documented check (`render-slices --node test ... --config` the example) warned that
    the example's own UUID selector matches no GPU: simulated UUIDs derive from the node name,
    and the example was written for node-a. The command is taken from the guide as written."""
    guide = (REPO / "docs" / "admin-guide.md").read_text()
    commands = re.findall(
        r"`\.venv/bin/dra-driver (render-slices [^`]*node-config\.example\.yaml)`", guide
    )
    assert commands, "the admin guide no longer shows how to check the example"
    for command in commands:
        out = subprocess.run(
            [*CLI, *command.split()], capture_output=True, text=True, cwd=REPO, timeout=60
        )
        assert out.returncode == 0, out.stderr
        warnings = [ln for ln in out.stderr.splitlines() if '"level": "warning"' in ln]
        assert not [w for w in warnings if "matches no GPU" in w], warnings
