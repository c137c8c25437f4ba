"""GPU check of fraction enforcement through the real MPS enforcer (needs an NVIDIA GPU, root).

For each compute mode in turn it prepares two claims with different ceilings on one GPU with
:class:`dra_driver.enforce.MpsEnforcer`, starts one small CUDA program per claim (Python ctypes on
``libcuda``: cuInit, cuCtxCreate, cuMemGetInfo, allocate chunks until failure, a one-thread
PTX spin kernel), and prints a table:

    mode | claim | tier | ceiling MiB | reported total / free MiB | allocatable MiB | concurrent

"concurrent" = both claims' kernels ran at the same time (the pair took < 1.5x one alone);
"no" = time-sliced; "refused" = the second client could not create a context. On ``hard``
GPUs the per-container cgroup limit is applied to a scratch cgroup per claim (through the
toolkit hook when it is installed, else through NVML, as the hook would). It also reports
whether a namespace's pipe directory survives a daemon restart, how the usage source maps
NVML's per-process memory and SM utilization to the claims (each probe holds a known amount and
spins: the claim's used memory, clients, SM%, and whether NVML sampled the probes' PIDs rather
than the MPS server's; not yet run on hardware), and, if time-slicing clients
are refused under EXCLUSIVE_PROCESS, repeats time-slicing with the DEFAULT compute mode.

Runs in well under 8 minutes (``--budget``). Without an NVIDIA GPU it prints
"no NVIDIA GPU found" and exits 0. Exit 1: a claim could allocate more than its ceiling on a
GPU whose tier says it is capped. Exit 2: not root.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv"
ENTRY = REPO / "hack" / "gpu-check"
"""The command this module runs as (it re-runs itself in the virtualenv and as a probe)."""
if (
    (VENV / "bin/python").exists()
    and Path(sys.prefix).resolve() != VENV.resolve()
    and not os.environ.get("GPU_CHECK_NO_REEXEC")
):
    os.environ["GPU_CHECK_NO_REEXEC"] = "1"
    os.execv(str(VENV / "bin/python"), [str(VENV / "bin/python"), str(ENTRY), *sys.argv[1:]])
sys.path.insert(0, str(REPO))

MIB = 1024 * 1024
PTX = rb"""
.version 6.0
.target sm_50
.address_size 64
.visible .entry spin(.param .u64 out, .param .u32 iters)
{
    .reg .pred %p;
    .reg .b32 %r<4>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [iters];
    mov.u32 %r2, 0;
    mov.u32 %r3, 12345;
LOOP:
    mad.lo.u32 %r3, %r3, 1664525, 1013904223;
    add.u32 %r2, %r2, 1;
    setp.lt.u32 %p, %r2, %r1;
    @%p bra LOOP;
    cvta.to.global.u64 %rd2, %rd1;
    st.global.u32 [%rd2], %r3;
    ret;
}
"""


# --- the per-claim CUDA probe (runs as `gpu-check --probe`) --------------------------------
class Cuda:
    """Just enough of the CUDA driver API through ctypes."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.ctx = ctypes.c_void_p()
        self.held: list[ctypes.c_uint64] = []

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: {(name.value or b'?').decode()} ({rc})")

    def init(self) -> tuple[int, int]:
        self.check(self.lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        self.check(self.lib.cuCtxCreate_v2(ctypes.byref(self.ctx), 0, dev), "cuCtxCreate")
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.check(
            self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo"
        )
        return free.value, total.value

    def alloc_until_failure(self, chunk: int) -> tuple[int, str]:
        ptrs: list[ctypes.c_uint64] = []
        error = ""
        while len(ptrs) < 100000:
            p = ctypes.c_uint64()
            rc = self.lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(chunk))
            if rc != 0:
                name = ctypes.c_char_p()
                self.lib.cuGetErrorName(rc, ctypes.byref(name))
                error = (name.value or b"?").decode()
                break
            ptrs.append(p)
        for p in ptrs:
            self.lib.cuMemFree_v2(p)
        return len(ptrs) * chunk, error

    def hold(self, nbytes: int) -> None:
        """Allocate ``nbytes`` and keep them until the process ends (what usage must see)."""
        p = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes)), "cuMemAlloc")
        self.held.append(p)

    def spin(self, iters: int) -> float:
        mod, fn, out = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64()
        self.check(
            self.lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(PTX)), "cuModuleLoadData"
        )
        self.check(
            self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, b"spin"), "cuModuleGetFunction"
        )
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(out), ctypes.c_size_t(4)), "cuMemAlloc")
        n = ctypes.c_uint32(iters)
        params = (ctypes.c_void_p * 2)(
            ctypes.cast(ctypes.byref(out), ctypes.c_void_p),
            ctypes.cast(ctypes.byref(n), ctypes.c_void_p),
        )
        start = time.perf_counter()
        self.check(
            self.lib.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, params, None), "cuLaunchKernel"
        )
        self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")
        elapsed = time.perf_counter() - start
        self.lib.cuMemFree_v2(out)
        self.lib.cuModuleUnload(mod)
        return elapsed


def probe() -> int:
    """Answer one JSON line per command read from stdin: go | alloc <MiB> | hold <MiB> |
    spin <n> | exit."""

    def reply(**kw: Any) -> None:
        print(json.dumps(kw), flush=True)

    cuda: Cuda | None = None
    for line in sys.stdin:
        cmd, *args = line.split()
        try:
            if cmd == "go":
                cuda = Cuda()
                free, total = cuda.init()
                reply(ok=True, free=free, total=total)
            elif cmd == "alloc" and cuda:
                allocated, error = cuda.alloc_until_failure(int(args[0]) * MIB)
                reply(ok=True, allocated=allocated, error=error)
            elif cmd == "hold" and cuda:
                cuda.hold(int(args[0]) * MIB)
                reply(ok=True)
            elif cmd == "spin" and cuda:
                reply(ok=True, seconds=cuda.spin(int(args[0])))
            elif cmd == "exit":
                return 0
            else:
                reply(ok=False, error=f"bad command {cmd}")
        except (OSError, RuntimeError) as exc:
            reply(ok=False, error=str(exc))
    return 0


# --- the parent ------------------------------------------------------------------------------
class Probe:
    """A running probe process bound to one claim's MPS namespace."""

    def __init__(self, pipe_dir: str, timeout: float) -> None:
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe_dir}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.pop("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", None)
        self.proc = subprocess.Popen(
            [sys.executable, str(ENTRY), "--probe"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.timeout = timeout

    def send(self, line: str) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        if not ready:
            return {"ok": False, "error": f"no answer in {self.timeout:g} s"}
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"ok": False, "error": "probe exited"}

    def ask(self, line: str) -> dict[str, Any]:
        self.send(line)
        return self.read()

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.send("exit")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclass
class Row:
    mode: str
    claim: str
    tier: str
    ceiling_mib: int
    total_mib: int | None = None
    free_mib: int | None = None
    allocatable_mib: int | None = None
    concurrent: str = "?"
    notes: list[str] = field(default_factory=list)


class CgroupLimits:
    """Scratch cgroups (one per claim) carrying the hard tier's per-container limits."""

    def __init__(self, gpu_uuid: str, hook_path: str, nvml: Any) -> None:
        self.base = Path(f"/sys/fs/cgroup/gpu-check-{os.getpid()}")
        self.gpu = gpu_uuid
        self.hook = hook_path
        self.nvml = nvml
        self.leaves: list[Path] = []
        self.base.mkdir()
        for parent in (Path("/sys/fs/cgroup"), self.base):
            with contextlib.suppress(OSError):
                (parent / "cgroup.subtree_control").write_text("+dmem")

    def attach(self, pid: int, request_mib: int, limit_mib: int) -> str:
        leaf = self.base / f"c{len(self.leaves)}"
        leaf.mkdir()
        self.leaves.append(leaf)
        (leaf / "cgroup.procs").write_text(str(pid))
        if Path(self.hook).exists():
            bundle = Path(tempfile.mkdtemp(prefix="gpu-check-bundle-"))
            env = [
                f"NVIDIA_GPU_MEMORY_REQUEST={request_mib}",
                f"NVIDIA_GPU_MEMORY_LIMIT={limit_mib}",
            ]
            (bundle / "config.json").write_text(
                json.dumps({"ociVersion": "1.2.0", "process": {"env": env}})
            )
            state = {
                "ociVersion": "1.2.0",
                "id": leaf.name,
                "status": "created",
                "pid": pid,
                "bundle": str(bundle),
            }
            done = subprocess.run(
                [self.hook, "apply-cuda-memory-limits", "--driver-root", "/", "--gpu-id", self.gpu],
                input=json.dumps(state),
                text=True,
                capture_output=True,
                timeout=30,
                check=False,
            )
            shutil.rmtree(bundle, ignore_errors=True)
            if done.returncode == 0:
                return "limit via toolkit hook"
            how = f"hook failed ({done.stderr.strip()[:120]}); "
        else:
            how = ""
        try:
            self.nvml.set_cgroup_limits(self.gpu, str(leaf), request_mib * MIB, limit_mib * MIB)
            return how + "limit via NVML"
        except Exception as exc:  # report, keep measuring
            return how + f"cgroup limit NOT applied: {exc}"

    def close(self) -> None:
        from dra_driver.enforce import UNLIMITED

        for leaf in self.leaves:
            with contextlib.suppress(Exception):
                self.nvml.set_cgroup_limits(self.gpu, str(leaf), 0, UNLIMITED)
            with contextlib.suppress(OSError):
                leaf.rmdir()
        with contextlib.suppress(OSError):
            self.base.rmdir()


def no_gpu(reason: str) -> int:
    print(f"no NVIDIA GPU found ({reason}); nothing to check")
    return 0


def find_gpu(index: int) -> tuple[Any, Any] | str:
    """(inventory, gpu) or the reason there is none."""
    if os.environ.get("GPU_CHECK_PRETEND_NO_GPU"):
        return "GPU_CHECK_PRETEND_NO_GPU is set"
    try:
        from dra_driver.gpus import GpuSourceError, NvmlGpuSource

        inventory = NvmlGpuSource().discover()
    except ImportError as exc:
        return f"nvidia-ml-py not importable: {exc}"
    except GpuSourceError as exc:
        return str(exc)
    except OSError as exc:
        return f"NVML unavailable: {exc}"
    if not inventory.gpus:
        return "NVML lists no usable GPU"
    matches = [g for g in inventory.gpus if g.index == index]
    if not matches:
        return f"no GPU with index {index}"
    return inventory, matches[0]


@contextlib.contextmanager
def claims_on(
    enforcer: Any, gpu: Any, mode: str, ceilings: list[int]
) -> Iterator[list[tuple[str, Any, Any]]]:
    from dra_driver.model.plans import ClaimPlan, ClaimRef, DevicePlan
    from dra_driver.model.vocabulary import ComputeMode

    applied = []
    try:
        for i, ceiling in enumerate(ceilings):
            uid = str(uuid.uuid4())
            dev = DevicePlan(
                ("gpu",),
                "gpu-check",
                f"gpu-{gpu.index}-check-{i}",
                None,
                gpu,
                ComputeMode(mode),
                ceiling,
                ceiling,
                (50 if i == 0 else 25) if mode == "sm-sharing" else None,
            )
            plan = ClaimPlan(ClaimRef("gpu-check", f"claim-{i}", uid), (dev,))
            edits = enforcer.apply(plan)
            applied.append((uid, edits[dev.key], plan))
        yield applied
    finally:
        for uid, _, _ in applied:
            try:
                enforcer.release(uid)
            except Exception as exc:
                print(f"  release of {uid} failed: {exc}")


def measure_mode(
    args: argparse.Namespace,
    gpu: Any,
    tier: str,
    mode: str,
    compute_mode: str,
    nvml: Any,
    label: str,
) -> tuple[list[Row], dict[str, str]]:
    from dra_driver.enforce import MpsEnforcer, MpsOptions
    from dra_driver.infra import SubprocessRunner

    options = MpsOptions(
        root=str(Path(args.root) / label),
        time_slicing_compute_mode=compute_mode,
        sm_sharing_compute_mode=compute_mode,
        server_checks=20,
        server_check_interval=0.5,
        ctk_hook_path=args.hook,
    )
    enforcer = MpsEnforcer({gpu.uuid: tier}, nvml, SubprocessRunner(timeout=30), options)
    card_mib = gpu.memory_bytes // MIB
    ceilings = [card_mib // 8 * MIB, card_mib // 4 * MIB]
    rows = [Row(label, f"claim-{i}", tier, c // MIB) for i, c in enumerate(ceilings)]
    extra: dict[str, str] = {}
    probes: list[Probe] = []
    cgroups = None
    try:
        if tier == "hard":
            try:
                cgroups = CgroupLimits(gpu.uuid, args.hook, nvml)
            except OSError as exc:
                rows[0].notes.append(f"no scratch cgroup, limits NOT applied: {exc}")
        with claims_on(enforcer, gpu, mode, ceilings) as applied:
            for (_uid, edits, _plan), row in zip(applied, rows, strict=True):
                pipe = edits.mounts[0].host_path if edits.mounts else ""
                p = Probe(pipe, args.step_timeout)
                probes.append(p)
                if cgroups:
                    row.notes.append(cgroups.attach(p.proc.pid, row.ceiling_mib, row.ceiling_mib))
            for p in probes:
                p.send("go")
            started = [p.read() for p in probes]
            for row, answer in zip(rows, started, strict=True):
                if answer.get("ok"):
                    row.total_mib, row.free_mib = answer["total"] // MIB, answer["free"] // MIB
                else:
                    row.notes.append(f"context: {answer.get('error')}")
            ok = all(a.get("ok") for a in started)
            verdict = concurrency(probes, args) if ok else "refused"
            for row in rows:
                row.concurrent = verdict
            for p, row, answer in zip(probes, rows, started, strict=True):
                if answer.get("ok"):
                    got = p.ask(f"alloc {args.chunk_mib}")
                    row.allocatable_mib = got.get("allocated", 0) // MIB
                    row.notes.append(f"stopped by {got.get('error') or '?'}")
            if ok:
                extra["usage mapping (NVML -> claims)"] = usage_check(
                    enforcer, nvml, gpu, [plan for _, _, plan in applied], probes
                )
            for p in probes:
                p.close()
            probes.clear()
            if applied and applied[0][1].mounts:
                extra["pipe dir kept across daemon restart"] = restart_check(
                    enforcer, mode, applied[0][1].mounts[0].host_path
                )
    except Exception as exc:
        rows[0].notes.append(f"FAILED: {exc}")
    finally:
        for p in probes:
            p.close()
        if cgroups:
            cgroups.close()
    return rows, extra


def concurrency(probes: list[Probe], args: argparse.Namespace) -> str:
    iters = 1 << 24
    first = probes[0].ask(f"spin {iters}")
    if not first.get("ok"):
        return f"? ({first.get('error')})"
    iters = min(int(iters * args.spin_seconds / max(first["seconds"], 1e-3)), (1 << 32) - 1)
    alone = probes[0].ask(f"spin {iters}")
    for p in probes:
        p.send(f"spin {iters}")
    both = [p.read() for p in probes]
    if not alone.get("ok") or not all(b.get("ok") for b in both):
        return "? (spin failed)"
    ratio = max(b["seconds"] for b in both) / alone["seconds"]
    return f"{'yes' if ratio < 1.5 else 'no'} (x{ratio:.2f})"


def usage_check(enforcer: Any, nvml: Any, gpu: Any, plans: list[Any], probes: list[Probe]) -> str:
    """Issue 27: the usage source maps NVML's per-process data to the claims. Each probe holds
    a different amount (256 MiB x its position + 256) and spins; the check reports, per claim,
    the memory the source saw against what its probe holds (a context adds some), its clients,
    and whether NVML's process utilization named the probes' PIDs (not the MPS server's)."""
    from dra_driver.observe import MpsUsageSource

    held = [256 * (i + 1) for i in range(len(probes))]
    for p, mib in zip(probes, held, strict=True):
        answer = p.ask(f"hold {mib}")
        if not answer.get("ok"):
            return f"? (hold failed: {answer.get('error')})"
    for p in probes:
        p.send(f"spin {1 << 27}")
    time.sleep(1.0)
    source = MpsUsageSource(enforcer, nvml)
    try:
        usage = source.snapshot(plans)
        sampled = nvml.process_sm_utilization(gpu.uuid)
    except Exception as exc:
        return f"FAILED: {exc}"
    finally:
        for p in probes:
            p.read()
    parts = []
    for plan, p, mib in zip(plans, probes, held, strict=True):
        seen = usage.get((plan.claim.uid, gpu.uuid))
        used = "?" if seen is None or seen.used_bytes is None else f"{seen.used_bytes // MIB}"
        sm = "?" if seen is None or seen.sm_percent is None else f"{seen.sm_percent:.0f}%"
        clients = "?" if seen is None else seen.clients
        named = "yes" if p.proc.pid in sampled else "no"
        parts.append(
            f"{plan.claim.name}: used {used} MiB (holds {mib}), clients {clients}, SM {sm}, "
            f"NVML sampled its PID {named}"
        )
    others = sorted(set(sampled) - {p.proc.pid for p in probes})
    return "; ".join(parts) + f"; other PIDs sampled: {others or 'none'}"


def restart_check(enforcer: Any, mode: str, pipe: str) -> str:
    before = os.stat(pipe).st_ino
    enforcer.daemons[mode].control.quit()
    enforcer.check_health()
    try:
        after = os.stat(pipe).st_ino
    except OSError:
        return "no (directory gone)"
    socket = "control socket present" if Path(pipe, "control").exists() else "NO control socket"
    if after == before:
        return f"yes ({socket})"
    return f"no, re-created: running containers must restart ({socket})"


def print_table(rows: list[Row]) -> None:
    head = (
        "mode",
        "claim",
        "tier",
        "ceiling",
        "total",
        "free",
        "allocatable",
        "concurrent",
        "notes",
    )
    data = [
        (
            r.mode,
            r.claim,
            r.tier,
            str(r.ceiling_mib),
            str(r.total_mib or "-"),
            str(r.free_mib or "-"),
            str(r.allocatable_mib if r.allocatable_mib is not None else "-"),
            r.concurrent,
            "; ".join(r.notes),
        )
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *data, strict=True)]
    for line in (head, *data):
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    print("(MiB; 'allocatable' = chunks allocated before the first failure)")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to use")
    parser.add_argument("--root", default="", help="enforcer root (default: a fresh temp dir)")
    parser.add_argument("--hook", default="/usr/bin/nvidia-cdi-hook", help="toolkit hook path")
    parser.add_argument("--chunk-mib", type=int, default=256)
    parser.add_argument("--spin-seconds", type=float, default=1.0)
    parser.add_argument("--step-timeout", type=float, default=60.0)
    parser.add_argument("--budget", type=float, default=420.0, help="seconds before skipping steps")
    args = parser.parse_args()
    if args.probe:
        return probe()
    found = find_gpu(args.gpu)
    if isinstance(found, str):
        return no_gpu(found)
    inventory, gpu = found
    if os.geteuid() != 0:
        print("gpu-check needs root (compute mode, multi-user MPS, cgroup limits)")
        return 2
    from dra_driver.enforce import PynvmlFacade, detect_enforcement
    from dra_driver.infra import configure

    configure("warning", "console")
    report = detect_enforcement(inventory, simulated=False, hook_path=args.hook)
    tier = report.tiers[gpu.uuid]
    print(
        f"GPU {gpu.index} {gpu.name} {gpu.uuid}: "
        f"driver {gpu.driver_version}, CUDA {gpu.cuda_driver_version}"
    )
    print(f"node facts: {report.node}; tier {tier} {list(report.decisions[gpu.uuid].reasons)}")
    if tier == "none":
        print("tier none: no usable MPS v3 on this node; nothing to measure")
        return 0
    args.root = args.root or tempfile.mkdtemp(prefix="gpu-check-")
    nvml = PynvmlFacade()
    started = time.monotonic()
    rows: list[Row] = []
    extras: dict[str, str] = {}
    plan = [
        ("time-slicing", "EXCLUSIVE_PROCESS", "time-slicing"),
        ("sm-sharing", "EXCLUSIVE_PROCESS", "sm-sharing"),
    ]
    for mode, compute_mode, label in plan:
        if time.monotonic() - started > args.budget:
            print(f"budget spent; skipping {label}")
            continue
        got, extra = measure_mode(args, gpu, tier, mode, compute_mode, nvml, label)
        rows += got
        extras.update({f"{label}: {k}": v for k, v in extra.items()})
        if (
            mode == "time-slicing"
            and got[0].concurrent == "refused"
            and time.monotonic() - started < args.budget
        ):
            more, extra = measure_mode(
                args, gpu, tier, mode, "DEFAULT", nvml, "time-slicing/DEFAULT"
            )
            rows += more
            extras.update({f"time-slicing/DEFAULT: {k}": v for k, v in extra.items()})
    print_table(rows)
    for key, value in extras.items():
        print(f"{key}: {value}")
    print(
        f"compute mode now: {nvml.compute_mode(gpu.uuid)}; took {time.monotonic() - started:.0f} s"
    )
    over = [r for r in rows if r.allocatable_mib is not None and r.allocatable_mib > r.ceiling_mib]
    for r in over:
        print(
            f"NOT CAPPED: {r.mode} {r.claim} allocated {r.allocatable_mib} MiB "
            f"> ceiling {r.ceiling_mib} MiB"
        )
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
