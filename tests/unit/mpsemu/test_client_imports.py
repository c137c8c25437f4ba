"""The emulated control program as a client (what the driver runs for every MPS command)
loads only the grammar and the wire, not the daemon's machinery: NVIDIA's program is compiled
and starts in about a millisecond, and a client that imported the daemon, its state machine
and its process world spent over a tenth of a second per command on this machine, so that a
benchmark of Prepare measured the emulator."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.paths import REPO

DAEMON_SIDE = {
    "dra_driver.mpsemu.daemon",
    "dra_driver.mpsemu.state",
    "dra_driver.mpsemu.processes",
    "dra_driver.mpsemu.server",
    "dra_driver.mpsemu.config",
}


def test_a_client_command_imports_no_daemon_module() -> None:
    script = (
        f"import sys, json; sys.path.insert(0, {str(REPO)!r})\n"
        "from dra_driver.mpsemu.cli import control_main\n"
        "import os; os.environ['CUDA_MPS_PIPE_DIRECTORY'] = '/nonexistent'\n"
        "rc = control_main(['server', 'list'])\n"
        "print(json.dumps([rc, sorted(m for m in sys.modules if m.startswith('dra_driver'))"
        " + sorted(m for m in sys.modules if m == 'typing')]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, check=True
    )
    rc, modules = json.loads(done.stdout.splitlines()[-1])
    assert rc == 1 and "Cannot find MPS control daemon process" in done.stderr
    assert not DAEMON_SIDE & set(modules), modules
    assert "dra_driver.mpsemu.wire" in modules
    assert "typing" not in modules  # ~10 ms of every command
