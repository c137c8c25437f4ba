"""CDI hooks for the ``hard`` tier (pure): driver-enforced per-container memory limits.

1. The NVIDIA Container Toolkit's ``apply-cuda-memory-limits`` hook
   (github.com/NVIDIA/nvidia-container-toolkit, ``cmd/nvidia-cdi-hook/apply-cuda-memory-limits``),
   a ``createRuntime`` hook, one per GPU: it reads ``NVIDIA_GPU_MEMORY_REQUEST`` (soft limit) and
   ``NVIDIA_GPU_MEMORY_LIMIT`` (hard limit), whole MiB, singular names, from the container's
   env, and does nothing unless BOTH are set; then sets them on the container's own cgroup via
   ``nvmlDeviceSetMemoryLimits_v1``. Hook paths are host paths.
2. Our cgroup *record* (hard tier), written by the consumer gate (3.) before it counts: the
   container's cgroup path into ``<record-dir>/<claim-uid>/<container-id>``.
   Unprepare uses these records to undo the soft-limit reservation that the dmem backend leaves
   on ancestor cgroups when a container's cgroup is removed (NVIDIA MPS docs, "MPS v3 Memory
   Partitioning"; see :mod:`dra_driver.enforce.janitor`). Writing it never fails the
   container. It was a hook of its own: one shell less per container start.

A ``poststop`` hook cannot do that job: runc removes the container's cgroup *before* it runs
poststop hooks (libcontainer ``destroy()``: cgroup manager Destroy, then state dir, then
poststop hooks), so the leaf is gone by then.

3. Our ``createRuntime`` *consumer gate* (every MPS tier): admits at most ``maxConsumers``
   running containers of the claim (a container past them fails to start, with a message the
   kubelet shows on the pod) and records each admitted one (UID, PID, start time, pod and
   container), so that all consumers of one claim together stay within its ceiling (each gets
   its share in the ``hard`` tier's per-container limit), the claim's status can list them,
   and the plugin can warn about root MPS clients (a root client can change the limits of its
   neighbours' namespaces; NVIDIA MPS docs, "Security").
"""

from __future__ import annotations

from pathlib import Path

from dra_driver.model.cdi import Hook

CTK_HOOK_PATH = "/usr/bin/nvidia-cdi-hook"
"""Default host path of the toolkit's CDI hook binary (toolkit >= v1.20 for this subcommand)."""

RECORD_SHELL = "/bin/sh"
"""Host shell that runs the consumer gate."""

_STATE_FIELDS = r"""w='[[:space:]]*'; v='\([A-Za-z0-9_.+-]*\)'
while read -r k x; do
  case $k in i) i=$x ;; b) b=$x ;; p) p=$x ;; n) ns=$x ;; s) pod=$x ;; c) ctr=$x ;; esac
done <<EOF
$(sed -n -e "h; s/.*\"id\"$w:$w\"$v\".*/i \1/p" \
  -e "g; s/.*\"bundle\"$w:$w\"\([^\"]*\)\".*/b \1/p" \
  -e "g; s/.*\"pid\"$w:$w\([0-9][0-9]*\).*/p \1/p" \
  -e "g; s/.*\"io.kubernetes.cri.sandbox-namespace\"$w:$w\"$v\".*/n \1/p" \
  -e "g; s/.*\"io.kubernetes.cri.sandbox-name\"$w:$w\"$v\".*/s \1/p" \
  -e "g; s/.*\"io.kubernetes.cri.container-name\"$w:$w\"$v\".*/c \1/p" 2>/dev/null)
EOF"""
"""Shell lines that read the OCI state (JSON on stdin) with one ``sed`` and set ``i`` (the
container ID), ``b`` (the bundle), ``p`` (the PID), ``ns``, ``pod`` and ``ctr`` (the CRI
annotations naming the pod and container); a field that is missing, or whose value has
characters other than ``A-Za-z0-9_.+-`` (the bundle: any but ``"``), stays empty. One process
for all fields: a hook runs at every container start, and each process a shell starts costs
about a millisecond."""

_CONSUMER_SCRIPT = "\n".join(
    (
        "umask 077",
        r'd="$1"; m="$2"; claim="$3"; how="$4"; cg="$5"; i=; b=; p=; ns=; pod=; ctr=',
        r'fail() { printf "gpu-fraction.dra.dev: %s\n" "$1" >&2; exit 1; }',
        _STATE_FIELDS,
        # the cgroup record (hard tier): first, whatever the gate decides; never fails
        r'if [ -n "$cg" ] && [ -n "$i" ] && [ -n "$p" ]; then',
        r'  c=$(sed -n "s/^0:://p" "/proc/$p/cgroup" 2>/dev/null)',
        r'  if [ -n "$c" ] && { [ -d "$cg" ] || mkdir -p "$cg" 2>/dev/null; }; then',
        r'    printf "%s\n" "$c" 2>/dev/null > "$cg/$i"',
        r"  fi",
        r"fi",
        r'[ -n "$i" ] && [ -n "$b" ] && [ -n "$p" ] || fail "cannot read the OCI state of the '
        r'container, so the consumers of claim $claim cannot be counted; container refused"',
        r'u=$(sed -n "s/.*\"user\"$w:$w{$w\"uid\"$w:$w\([0-9][0-9]*\).*/\1/p" '
        r'"$b/config.json" 2>/dev/null)',
        r'who="$ns/$pod/$ctr"',
        # field 22 of /proc/<pid>/stat (the start time), the 20th after "<pid> (<comm>) ";
        # builtins only: read, not a process per record
        r"start() {",
        r'  t=; x=; read -r x 2>/dev/null < "/proc/$1/stat"',
        r'  x=${x##*") "}; set -- $x',
        r"  [ $# -ge 20 ] && shift 19 && t=$1",
        r"}",
        r'start "$p"; ts=$t',
        r'[ -n "$ts" ] || fail "container process $p is gone before it started; container refused"',
        r'[ -d "$d" ] || mkdir -p "$d" || fail "cannot write the consumer records in $d"',
        r'exec 9>"$d/.lock" || fail "cannot lock the consumer records in $d"',
        r'if command -v flock >/dev/null 2>&1; then flock -w 10 9 || fail "consumer records of '
        r'claim $claim stayed locked for 10 s; try again"; fi',
        r'[ -f "$d/$i" ] && exit 0',
        r'n=0; on=""',
        r'for r in "$d"/*; do',
        r'  [ -f "$r" ] || continue',
        r'  l=; read -r l 2>/dev/null < "$r"; set -- $l',
        r"  [ $# -ge 3 ] || continue",
        r'  start "$2"',
        # running: its start time matches, or cannot be read (a name with a newline cuts the
        # first line of stat) while the process is there; ended otherwise
        r'  if [ "$t" = "$3" ] || { [ -z "$t" ] && [ -d "/proc/$2" ]; }; then',
        r'    n=$((n+1)); on="$on ${4:-?}"',
        r'  else rm -f "$r"; fi',
        r"done",
        r'[ "$n" -lt "$m" ] || fail "claim $claim already has $n running consumer(s) (${on# }) and '
        r'allows $m at once: $how"',
        r'printf "%s %s %s %s\n" "${u:--}" "$p" "$ts" "$who" > "$d/.$i" && mv "$d/.$i" "$d/$i" '
        r'|| fail "cannot write the consumer record $d/$i"',
        "exit 0",
    )
)
"""The consumer gate: reads the OCI state (JSON on stdin: ``id``, ``pid``, ``bundle``, the CRI
annotations naming the pod and container), and under a lock on the claim's record directory
``$1`` counts the claim's running consumers (records whose process still runs with the
recorded start time, or whose start time cannot be read while the process is there; records of
ended containers are removed). Below ``$2`` it writes
``$1/<container-id>``: ``<uid> <pid> <start-time-in-ticks> <namespace>/<pod>/<container>``
(``uid``: ``process.user.uid`` of ``<bundle>/config.json``, ``-`` if unreadable) and exits 0;
at ``$2`` it exits 1 with a message naming the claim (``$3``), the running consumers and what
to do (``$4``), which the runtime reports on the pod. A container already recorded (another
device of the same claim) passes. ``flock`` (util-linux) serialises concurrent creations where
the host has it. With ``$5`` (the ``hard`` tier), it first writes the container's cgroup v2
path (the ``0::`` line of ``/proc/<pid>/cgroup``) into ``$5/<container-id>``, never failing
for it. It starts few processes (``sed`` twice, ``flock``, ``mv``; ``mkdir`` for a
claim's first container): each costs about a millisecond of every container start
(``benchmarks/bench_hooks.py``)."""


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


def consumer_gate_hook(
    record_dir: str,
    max_consumers: int,
    claim: str,
    advice: str,
    shell: str = RECORD_SHELL,
    cgroup_record_dir: str = "",
) -> Hook:
    """Our ``createRuntime`` hook that admits at most ``max_consumers`` running containers of a
    claim and records each one under ``record_dir`` (:data:`_CONSUMER_SCRIPT`).

    Args:
        record_dir: ``<root>/users/<claim-uid>``.
        max_consumers: containers that may use the claim at once (1..32).
        claim: ``<namespace>/<name>`` of the claim, for the refusal.
        advice: the end of the refusal: what each consumer may hold and what to do.
        shell: the host shell that runs the script.
        cgroup_record_dir: ``<root>/cgroups/<claim-uid>`` (``hard`` tier): where the
            container's cgroup path is recorded first; ``""``: no record.
    """
    return Hook(
        hook_name="createRuntime",
        path=shell,
        args=(
            Path(shell).name,
            "-c",
            _CONSUMER_SCRIPT,
            "gpu-fraction-consumer",
            record_dir,
            str(max_consumers),
            claim,
            advice,
            *([cgroup_record_dir] if cgroup_record_dir else []),
        ),
    )


def memory_env(request_mib: int, limit_mib: int) -> tuple[str, str]:
    """``NVIDIA_GPU_MEMORY_REQUEST`` / ``NVIDIA_GPU_MEMORY_LIMIT`` entries (whole MiB)."""
    return (f"NVIDIA_GPU_MEMORY_REQUEST={request_mib}", f"NVIDIA_GPU_MEMORY_LIMIT={limit_mib}")
