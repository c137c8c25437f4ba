"""``hack/demo``: the command line, the summary at the end, the logs kept in the temporary
directory, and the cleanup on Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import importlib
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from devtools.demo.common import out
from devtools.demo.steps import run_demo


def main() -> int:
    doc = importlib.import_module("devtools.demo").__doc__ or "demo"
    parser = argparse.ArgumentParser(prog="hack/demo", description=doc.splitlines()[0])
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster running")
    args = parser.parse_args()

    def interrupt(signum: int, frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # let the cleanup finish
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, interrupt)
    work = Path(tempfile.mkdtemp(prefix="dra-demo-"))
    logs = work / "logs"
    logs.mkdir()
    print(f"GPU fraction DRA driver demo  (work dir {work})", flush=True)
    ok = False
    try:
        summary = run_demo(work, logs, args.keep_cluster)
        ok = summary.get("left") == 0 and summary["kept"].split("/")[0] == str(
            len(summary["running"])
        )
        out.step("Summary")
        out.line(
            f"pods run on GPU fractions:   {', '.join(summary['running'])} "
            f"({summary['specs']} CDI specs written)"
        )
        why = (
            "memory limit below its request"
            if "below the request" in summary["refused"]
            else summary["refused"][:120]
        )
        out.line(f"refused with a pod event:    misconfigured ({why})")
        waiting = [ln for ln in summary["occupancy"].splitlines() if "/waiting " in ln]
        out.line(f"Pending, with its reason:    {' '.join(waiting[0].split()) if waiting else '-'}")
        out.line(f"plugin restarted, probes:    {summary['kept']} kept their MPS server")
        if args.keep_cluster:
            out.line("pods kept:                   the cluster runs (commands above)")
        else:
            out.line(f"left after deleting pods:    {summary['left']} (CDI specs, claims, pipes)")
        out.line(f"total time:                  {out.elapsed():.0f}s")
    except KeyboardInterrupt:
        print("\ninterrupted; cleaning up", flush=True)
    except Exception as exc:
        print(f"\ndemo failed: {exc}", file=sys.stderr, flush=True)
        log = logs / "plugin.log"
        tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
        if tail:
            print("last plugin log lines:\n  " + "\n  ".join(tail), file=sys.stderr)
    finally:
        keep = logs.with_name(f"{work.name}-logs")
        shutil.move(str(logs), str(Path(tempfile.gettempdir()) / keep.name))
        if not args.keep_cluster:  # a kept cluster lives in the work dir
            shutil.rmtree(work, ignore_errors=True)
        print(f"logs: {Path(tempfile.gettempdir()) / keep.name}", flush=True)
    return 0 if ok else 1
