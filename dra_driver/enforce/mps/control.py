"""The MPS v3 control CLI (``nvidia-cuda-mps-control``) for one control daemon, via a Runner.

Grammar and columns follow the NVIDIA MPS docs, "MPS v3 Interface": ``<module> <verb>
[positional...] [--key=value ...]``; list verbs take ``--format=csv,noheader``. Every command
runs with the daemon's ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY`` and
``CUDA_MPS_PROTOCOL_VERSION=3`` (the env var wins over ``-p``, same page).

Each command's timeout is the control's own, cut to what is left of the running call's
:class:`~dra_driver.infra.budget.Budget`; once a daemon has not answered within a budget, later
commands to it under that budget fail at once (:class:`MpsTimeout`), so one hung daemon costs
a call one timeout and fails only the claims that need it.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from dra_driver.enforce.rules.base import MpsError
from dra_driver.enforce.rules.names import CONTROL_BINARY
from dra_driver.enforce.rules.rows import (
    ClientRow,
    NamespaceRow,
    ServerRow,
    parse_clients,
    parse_namespaces,
    parse_servers,
)
from dra_driver.infra import budget
from dra_driver.infra.runner import Runner
from dra_driver.model.commands import RC_NOT_EXECUTABLE, RC_NOT_FOUND, RC_TIMEOUT, Completed

CSV = "--format=csv,noheader"
"""Machine-readable output of list verbs (MPS v3 Interface: ``--format``)."""


class MpsCommandError(MpsError):
    """An MPS control command failed; ``argv`` and ``completed`` say which and how."""

    def __init__(self, argv: Sequence[str], completed: Completed) -> None:
        self.argv = tuple(argv)
        self.completed = completed
        detail = completed.text() or "no output"
        super().__init__(f"MPS command {' '.join(argv[1:])!r} failed (rc {completed.rc}): {detail}")


class MpsTimeout(MpsCommandError):
    """An MPS control command did not answer in time, or was not run because its daemon did
    not answer earlier in the same budget: the daemon is hung (not gone), so its sockets and
    directories must be left alone. The message says which."""

    def __init__(self, argv: Sequence[str], completed: Completed, message: str) -> None:
        MpsError.__init__(self, message)
        self.argv = tuple(argv)
        self.completed = completed


class MpsControl:
    """Typed wrappers of the v3 control verbs for the daemon at ``pipe_dir``.

    Args:
        runner: runs the commands.
        pipe_dir: the daemon's ``CUDA_MPS_PIPE_DIRECTORY`` (host path, node-local).
        log_dir: the daemon's ``CUDA_MPS_LOG_DIRECTORY``.
        binary: the control program.
        timeout: seconds per command.

    Every method raises :class:`MpsCommandError` when the command fails.
    """

    def __init__(
        self,
        runner: Runner,
        pipe_dir: Path,
        log_dir: Path,
        binary: str = CONTROL_BINARY,
        timeout: float = 10.0,
    ) -> None:
        self.runner = runner
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.binary = binary
        self.timeout = timeout

    @property
    def env(self) -> Mapping[str, str]:
        """Environment of every command: the daemon's pipe/log directories, protocol 3."""
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
            "CUDA_MPS_PROTOCOL_VERSION": "3",
        }

    def run(self, *args: str, check: bool = True) -> Completed:
        """Run ``<binary> <args>`` within :attr:`timeout` and the running call's budget.

        Raises:
            MpsTimeout: no answer in time, or this daemon already did not answer within the
                running budget (then the command is not run); raised even without ``check``.
            MpsCommandError: the command failed, when ``check``.
        """
        argv = (self.binary, *args)
        command = " ".join(args)
        call = budget.current()
        timeout = self.timeout if call is None else call.limit(self.timeout)
        if call is not None and str(self.pipe_dir) in call.unresponsive:
            raise MpsTimeout(
                argv,
                Completed(RC_TIMEOUT),
                f"MPS command {command!r} not run: the MPS control daemon at {self.pipe_dir} "
                "does not answer (hung: a command to it timed out earlier in this call); claims "
                "that need it fail until it answers",
            )
        if call is not None and timeout <= 0:
            raise MpsTimeout(
                argv,
                Completed(RC_TIMEOUT),
                f"MPS command {command!r} not run: the {call.text()} budget of this call is spent",
            )
        done = self.runner.run(argv, env=self.env, timeout=timeout)
        if done.rc == RC_TIMEOUT:
            if call is not None:
                call.unresponsive.add(str(self.pipe_dir))
            raise MpsTimeout(
                argv,
                done,
                f"MPS command {command!r} did not finish within {timeout:.3g} s: the MPS "
                f"control daemon at {self.pipe_dir} does not answer (hung); claims that need it "
                "fail until it answers",
            )
        if check and not done.ok:
            raise MpsCommandError(argv, done)
        return done

    # daemon ---------------------------------------------------------------------------
    def start_daemon(self, config_file: Path | None) -> None:
        """Start the control daemon in the background: ``-p 3 -m -d [-a <toml>]``.

        ``-m`` (multi-user) lets containers of any UID share root-owned servers (NVIDIA MPS docs,
        "Architecture" and "MPS v3 Interface").
        """
        args = ["-p", "3", "-m", "-d"]
        if config_file is not None:
            args += ["-a", str(config_file)]
        self.run(*args)

    def quit(self) -> None:
        """Stop the daemon and every server (``-q``)."""
        self.run("-q")

    # server ---------------------------------------------------------------------------
    def server_list(self) -> list[ServerRow]:
        """``server list``; fails when the daemon is not running."""
        return parse_servers(self.run("server", "list", CSV).stdout)

    def server_create(self, name: str, allowed_devices: Sequence[str]) -> None:
        """``server create <name> --uid=0 --allowed-devices=<UUIDs>`` (multi-user: uid 0 only)."""
        self.run(
            "server", "create", name, "--uid=0", "--allowed-devices=" + ",".join(allowed_devices)
        )

    def server_set(self, name: str, pinned_memory_limit: str, threads: int) -> None:
        """``server set <name> --pinned-memory-limit=<v> --active-thread-percentage=<p>``: the
        limits of the server's ``default`` namespace (NVIDIA MPS docs, "MPS v3 Interface")."""
        self.run(
            "server",
            "set",
            name,
            f"--pinned-memory-limit={pinned_memory_limit}",
            f"--active-thread-percentage={threads}",
        )

    def server_delete(self, name: str, force: bool = False) -> None:
        """``server delete <name> [--force]`` (refused while clients are attached unless force)."""
        self.run("server", "delete", name, *(["--force"] if force else []))

    # namespace ------------------------------------------------------------------------
    def namespace_list(self, server: str, name: str | None = None) -> list[NamespaceRow]:
        """``namespace list [<name>] --server=<s>``."""
        args = ["namespace", "list", *([name] if name else []), f"--server={server}", CSV]
        return parse_namespaces(self.run(*args).stdout)

    def namespace_create(self, name: str, server: str) -> None:
        """``namespace create <name> --server=<s>``."""
        self.run("namespace", "create", name, f"--server={server}")

    def namespace_set(self, name: str, server: str, pinned_memory_limit: str, threads: int) -> None:
        """``namespace set <name> --server=<s> --pinned-memory-limit=<v>
        --active-thread-percentage=<p>`` (both always: named namespaces inherit nothing)."""
        self.run(
            "namespace",
            "set",
            name,
            f"--server={server}",
            f"--pinned-memory-limit={pinned_memory_limit}",
            f"--active-thread-percentage={threads}",
        )

    def namespace_delete(self, name: str, server: str, force: bool = True) -> None:
        """``namespace delete <name> --server=<s> [--force]``."""
        self.run("namespace", "delete", name, f"--server={server}", *(["--force"] if force else []))

    # client ---------------------------------------------------------------------------
    def client_list(self, server: str | None = None) -> list[ClientRow]:
        """``client list --server=<s>``; without ``server``, ``client list``: the clients of
        every server of the daemon (``--server`` is an optional filter in the MPS v3
        Interface grammar; that the unfiltered list covers every server is [INFERRED])."""
        where = () if server is None else (f"--server={server}",)
        return parse_clients(self.run("client", "list", *where, CSV).stdout)

    def client_terminate(self, pid: int) -> None:
        """``client terminate <pid>`` (the client then sees CUDA_ERROR_MPS_CLIENT_TERMINATED)."""
        self.run("client", "terminate", str(pid))


def probe_mps(runner: Runner, binary: str = CONTROL_BINARY) -> str:
    """``v3`` when ``<binary> -p 3 -h`` lists the ``namespace`` module, ``v2`` when the program
    runs without it, ``absent`` when it cannot be run.

    The probe points ``CUDA_MPS_PIPE_DIRECTORY`` at an empty private directory so that it never
    talks to a running daemon (a running daemon imposes its own protocol: NVIDIA MPS docs,
    "MPS v3 Interface").
    """
    with tempfile.TemporaryDirectory(prefix="mps-probe-") as tmp:
        env = {
            "CUDA_MPS_PROTOCOL_VERSION": "3",
            "CUDA_MPS_PIPE_DIRECTORY": tmp,
            "CUDA_MPS_LOG_DIRECTORY": tmp,
        }
        done = runner.run([binary, "-p", "3", "-h"], env=env, timeout=10)
    if done.rc in (RC_NOT_FOUND, RC_NOT_EXECUTABLE):
        return "absent"
    text = f"{done.stdout}\n{done.stderr}"
    if re.search(r"\bnamespace\b", text) and re.search(r"\bserver\b", text):
        return "v3"
    return "v2" if text.strip() else "absent"
