"""The project's error tree: one base, a branch per way an error is handled.

- :class:`ClaimError`: one claim cannot be prepared or unprepared. Its message is shown to the
  user (the kubelet puts it in the pod's events), so it says what is wrong and what to change.
  The kubelet service turns it into that claim's error; the other claims of the call go on.
- :class:`StartupError`: the plugin or a CLI command cannot start (bad configuration, no GPU
  source, an unreadable checkpoint). The CLI prints it as one line and exits with status 2.
- Errors that are neither (e.g. a ResourceSlice write that keeps failing) derive from
  :class:`DriverError` directly; their owner logs, counts and retries them.

Subclasses also derive from the built-in exception they specialise (``ValueError``,
``TimeoutError``, ``RuntimeError``) so callers outside the project can catch them as such.
"""

from __future__ import annotations


class DriverError(Exception):
    """Base of every exception the ``dra_driver`` package raises on purpose."""


class ClaimError(DriverError):
    """One claim fails; ``str(error)`` is the message for the user (pod events)."""


class PrepareError(ClaimError, ValueError):
    """One claim cannot be prepared; the message tells the user what to change."""


class StartupError(DriverError):
    """Start-up or a command cannot go on; ``str(error)`` is one line for the operator."""


class UsageError(StartupError, ValueError):
    """A flag or argument that cannot work (a node name that is no DNS subdomain, a socket
    path over the kernel's limit); the message names it and what to change."""


CLAIM_ERRORS: tuple[type[Exception], ...] = (ClaimError, OSError)
"""What fails one claim with its own message: a :class:`ClaimError`, or an ``OSError`` of the
node (disk full, permission); anything else is a bug, logged with its traceback and reported
to the kubelet as an internal error."""
