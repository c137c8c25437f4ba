"""A tiny command-runner interface, so that effects such as MPS control commands are testable.

Production code calls :class:`SubprocessRunner`; tests pass a fake that implements
:class:`Runner` (e.g. ``tests/support/fakes/mps_control.py``). Nothing here raises for a failing
command: the exit status, stdout and stderr come back in :class:`Completed`, and a command
that cannot be started or runs past its timeout is reported with the shell's conventional
exit codes (127 not found, 126 not executable, 124 timed out).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Protocol

from dra_driver.model.commands import (
    RC_NOT_EXECUTABLE,
    RC_NOT_FOUND,
    RC_TIMEOUT,
    Completed,
)

DEFAULT_TIMEOUT_S = 30.0
"""Default per-command timeout, seconds."""


class Runner(Protocol):
    """Runs one command and returns its outcome; never raises for a failing command."""

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        timeout: float | None = None,
    ) -> Completed:
        """Run ``argv`` (no shell).

        Args:
            argv: program and arguments.
            env: variables added to (and overriding) the caller's environment; None = inherit.
            input: text written to the command's stdin (None = no stdin).
            timeout: seconds before the command is killed (None = the runner's default).
        """
        ...


class SubprocessRunner:
    """The real :class:`Runner`: :func:`subprocess.run` with captured output and a timeout.

    Args:
        timeout: default timeout in seconds for commands that do not pass one.
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout = timeout

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        timeout: float | None = None,
    ) -> Completed:
        """Run ``argv``; see :meth:`Runner.run`."""
        limit = self.timeout if timeout is None else timeout
        full_env = None if env is None else {**os.environ, **env}
        try:
            proc = subprocess.run(
                list(argv),
                env=full_env,
                input=input.encode() if input is not None else None,
                stdin=subprocess.DEVNULL if input is None else None,
                capture_output=True,
                timeout=limit,
                check=False,
            )
        except FileNotFoundError as exc:
            return Completed(RC_NOT_FOUND, "", f"{argv[0]}: not found ({exc.strerror})")
        except PermissionError as exc:
            return Completed(RC_NOT_EXECUTABLE, "", f"{argv[0]}: cannot execute ({exc.strerror})")
        except subprocess.TimeoutExpired as exc:
            return Completed(
                RC_TIMEOUT,
                _decode(exc.stdout),
                f"{argv[0]}: timed out after {limit:g} s\n{_decode(exc.stderr)}".strip(),
            )
        return Completed(proc.returncode, _decode(proc.stdout), _decode(proc.stderr))


def _decode(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, str):
        return data
    return data.decode("utf-8", errors="replace")
