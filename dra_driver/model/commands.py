"""The outcome of a command (pure): its exit status and output, and the shell's conventional
exit statuses for a command that could not run (:mod:`dra_driver.infra.runner` runs them)."""

from __future__ import annotations

from dataclasses import dataclass

RC_TIMEOUT = 124
"""Exit status reported when a command ran past its timeout (as coreutils ``timeout``)."""
RC_NOT_EXECUTABLE = 126
"""Exit status reported when the program exists but cannot be executed."""
RC_NOT_FOUND = 127
"""Exit status reported when the program does not exist."""


@dataclass(frozen=True)
class Completed:
    """The outcome of one command.

    Attributes:
        rc: exit status (0 = success; 124/126/127 see module constants; negative = signal).
        stdout: standard output, decoded as UTF-8 (invalid bytes replaced).
        stderr: standard error, decoded the same way.
    """

    rc: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        """Whether the command exited with status 0."""
        return self.rc == 0

    def text(self) -> str:
        """stderr and stdout joined, stripped (for error messages)."""
        return "\n".join(p for p in (self.stderr.strip(), self.stdout.strip()) if p)
