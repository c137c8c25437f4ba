"""CDI hooks for the ``hard`` tier (pure): driver-enforced per-container memory limits.

1. The NVIDIA Container Toolkit's ``apply-cuda-memory-limits`` hook
   (github.com/NVIDIA/nvidia-container-toolkit, ``cmd/nvidia-cdi-hook/apply-cuda-memory-limits``),
   a ``createRuntime`` hook, one per GPU: it reads ``NVIDIA_GPU_MEMORY_REQUEST`` (soft limit) and
   ``NVIDIA_GPU_MEMORY_LIMIT`` (hard limit), whole MiB, singular names, from the container's
   env, and does nothing unless BOTH are set; then sets them on the container's own cgroup via
   ``nvmlDeviceSetMemoryLimits_v1``. Hook paths are host paths.
2. Our ``createRuntime`` *record* hook (hard tier): a ``/bin/sh`` one-liner (no binary of
   ours on the host) that writes the container's cgroup path into
   ``<record-dir>/<claim-uid>/<container-id>``.
   Unprepare uses these records to undo the soft-limit reservation that the dmem backend leaves
   on ancestor cgroups when a container's cgroup is removed (NVIDIA MPS docs, "MPS v3 Memory
   Partitioning"; see
   :mod:`dra_driver.enforce.janitor`). It never fails the container.

A ``poststop`` hook cannot do that job: runc removes the container's cgroup *before* it runs
poststop hooks (libcontainer ``destroy()``: cgroup manager Destroy, then state dir, then
poststop hooks), so the leaf is gone by then.

3. Our ``createRuntime`` *user* hook (every MPS tier): records the UID each container of the
   claim runs as, so that the plugin can warn about root MPS clients (a root client can change
   the limits of its neighbours' namespaces; NVIDIA MPS docs, "Security").
"""

from __future__ import annotations

from pathlib import Path

from dra_driver.model.cdi import Hook

CTK_HOOK_PATH = "/usr/bin/nvidia-cdi-hook"
"""Default host path of the toolkit's CDI hook binary (toolkit >= v1.20 for this subcommand)."""

RECORD_SHELL = "/bin/sh"
"""Host shell that runs the record hook."""

_RECORD_SCRIPT = "; ".join(
    (
        r'd="$1"',
        r"s=$(cat)",
        r"w='[[:space:]]*'",
        r'p=$(printf %s "$s" | sed -n "s/.*\"pid\"$w:$w\([0-9][0-9]*\).*/\1/p")',
        r'i=$(printf %s "$s" | sed -n "s/.*\"id\"$w:$w\"\([A-Za-z0-9_.-]*\)\".*/\1/p")',
        r'[ -n "$p" ] && [ -n "$i" ] || exit 0',
        r'c=$(sed -n "s/^0:://p" "/proc/$p/cgroup" 2>/dev/null)',
        r'[ -n "$c" ] || exit 0',
        r'mkdir -p "$d" 2>/dev/null && printf "%s\n" "$c" > "$d/$i" 2>/dev/null',
        "exit 0",
    )
)
"""Reads the OCI state (JSON on stdin), takes ``pid`` and ``id``, writes the cgroup v2 path
(the ``0::`` line of ``/proc/<pid>/cgroup``) into ``$1/<id>``; always exits 0."""


_USER_SCRIPT = "; ".join(
    (
        r'd="$1"',
        r"s=$(cat)",
        r"w='[[:space:]]*'",
        r'i=$(printf %s "$s" | sed -n "s/.*\"id\"$w:$w\"\([A-Za-z0-9_.-]*\)\".*/\1/p")',
        r'b=$(printf %s "$s" | sed -n "s/.*\"bundle\"$w:$w\"\([^\"]*\)\".*/\1/p")',
        r'[ -n "$i" ] && [ -n "$b" ] || exit 0',
        r'u=$(sed -n "s/.*\"user\"$w:$w{$w\"uid\"$w:$w\([0-9][0-9]*\).*/\1/p" '
        r'"$b/config.json" 2>/dev/null)',
        r'[ -n "$u" ] || exit 0',
        r'mkdir -p "$d" 2>/dev/null && printf "%s\n" "$u" > "$d/$i" 2>/dev/null',
        "exit 0",
    )
)
"""Reads the OCI state (JSON on stdin), takes ``id`` and ``bundle``, and writes the UID the
container's process will run as (``process.user.uid`` of ``<bundle>/config.json``) into
``$1/<id>``; always exits 0."""


def memory_limit_hook(gpu_uuid: str, driver_root: str, hook_path: str = CTK_HOOK_PATH) -> Hook:
    """The toolkit's ``createRuntime`` hook that applies the container's memory limits on a GPU."""
    return Hook(
        hook_name="createRuntime",
        path=hook_path,
        args=(
            Path(hook_path).name,
            "apply-cuda-memory-limits",
            "--driver-root",
            driver_root,
            "--gpu-id",
            gpu_uuid,
        ),
    )


def record_cgroup_hook(record_dir: str, shell: str = RECORD_SHELL) -> Hook:
    """Our ``createRuntime`` hook that records the container's cgroup under ``record_dir``."""
    return Hook(
        hook_name="createRuntime",
        path=shell,
        args=(Path(shell).name, "-c", _RECORD_SCRIPT, "gpu-fraction-record", record_dir),
    )


def record_user_hook(record_dir: str, shell: str = RECORD_SHELL) -> Hook:
    """Our ``createRuntime`` hook that records the UID a container of the claim runs as under
    ``record_dir`` (:mod:`dra_driver.observe.rootclients` warns about root clients of MPS)."""
    return Hook(
        hook_name="createRuntime",
        path=shell,
        args=(Path(shell).name, "-c", _USER_SCRIPT, "gpu-fraction-user", record_dir),
    )


def memory_env(request_mib: int, limit_mib: int) -> tuple[str, str]:
    """``NVIDIA_GPU_MEMORY_REQUEST`` / ``NVIDIA_GPU_MEMORY_LIMIT`` entries (whole MiB)."""
    return (f"NVIDIA_GPU_MEMORY_REQUEST={request_mib}", f"NVIDIA_GPU_MEMORY_LIMIT={limit_mib}")
