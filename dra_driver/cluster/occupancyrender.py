"""Renders the occupancy report (pure): aligned tables or JSON (``dra-driver occupancy``).

The claims table shows, from the plugins' metrics (:mod:`dra_driver.cluster.occupancyusage`),
what each claim uses: USED (GPU memory in use), SM% (SM utilization over the portion the
claim bought, 100 = all of it) and NOTE (``near-ceiling``: 90% of its memory ceiling used, its
next allocations are about to fail; ``idle <n>m``: no SM use for that long). ``-``: usage not
read (``--no-usage``) or not known to the plugin; ``?``: the node's plugin could not be read
(the reason follows the table).
"""

from __future__ import annotations

import json
from typing import Any

from dra_driver.cluster.occupancy import GpuUse, Holder, Report, gib, table
from dra_driver.cluster.occupancyusage import ClaimUse, note


def _use(report: Report, g: GpuUse, h: Holder) -> ClaimUse | None:
    return None if report.usage is None else report.usage.get((h.uid, g.uuid))


def _usage_cells(report: Report, g: GpuUse, h: Holder) -> list[str]:
    """USED, SM% and NOTE of one claim on one GPU."""
    if report.usage is not None and g.node in report.usage_problems:
        return ["?", "?", "?"]
    use = _use(report, g, h)
    if use is None:
        return ["-", "-", "-"]
    used = "-" if use.used_bytes is None else gib(use.used_bytes)
    sm = "-" if use.sm_normalized is None else f"{use.sm_normalized:.0f}"
    return [used, sm, note(use)]


def _usage_json(report: Report, g: GpuUse, h: Holder) -> dict[str, Any] | None:
    use = _use(report, g, h)
    if use is None:
        return None
    return {
        "usedBytes": use.used_bytes,
        "smPercent": use.sm_percent,
        "smNormalizedPercent": use.sm_normalized,
        "nearCeiling": use.near_ceiling,
        "idleSeconds": use.idle_seconds,
    }


def render_table(report: Report) -> str:
    """The report as three aligned tables: GPUs, the claims holding them, pending pods."""
    gpus = [["NODE", "GPU", "NAME", "MODE", "TIER", "MEMORY", "PROMISED", "FREE", "TAINTS"]]
    gpus += [
        [g.node, str(g.index), g.product_name, g.mode, g.tier]
        + [gib(g.memory_bytes), gib(g.promised_bytes), gib(g.free_bytes)]
        + [",".join(sorted(g.taints)) or "-"]
        for g in report.gpus
    ]
    holders = [["NODE", "GPU", "CLAIM", "PODS", "FRACTION", "MEMORY", "USED", "SM%", "NOTE"]]
    holders += [
        [g.node, str(g.index), f"{h.namespace}/{h.name}", ",".join(h.pods) or "-", h.fraction]
        + [gib(h.memory_bytes), *_usage_cells(report, g, h)]
        for g in report.gpus
        for h in g.holders
    ]
    pending = [["PENDING POD", "CLASSES", "REASON"]]
    pending += [
        [f"{p.namespace}/{p.name}", ",".join(p.classes), f"{p.reason}: {p.detail}"]
        for p in report.pending
    ]
    where = f"on node {report.node}" if report.node else "in any ResourceSlice"
    out = table(gpus) if report.gpus else [f"no GPUs of this driver {where}"]
    if len(holders) > 1:
        out += ["", *table(holders)]
    out += [f"usage of {n} unknown: {why}" for n, why in sorted(report.usage_problems.items())]
    out += ["", *table(pending)] if len(pending) > 1 else ["", "no pending pods wait for a GPU"]
    return "\n".join(out)


def report_json(report: Report) -> dict[str, Any]:
    """The report as JSON-ready data (stable keys; memory in bytes)."""
    return {
        "gpus": [
            {
                "node": g.node,
                "index": g.index,
                "uuid": g.uuid,
                "productName": g.product_name,
                "mode": g.mode,
                "tier": g.tier,
                "memoryBytes": g.memory_bytes,
                "promisedBytes": g.promised_bytes,
                "freeBytes": g.free_bytes,
                "taints": sorted(g.taints),
                "claims": [
                    {
                        "namespace": h.namespace,
                        "name": h.name,
                        "pods": list(h.pods),
                        "fraction": h.fraction,
                        "memoryBytes": h.memory_bytes,
                        "device": h.device,
                        "shareID": h.share_id,
                        "usage": _usage_json(report, g, h),
                    }
                    for h in g.holders
                ],
            }
            for g in report.gpus
        ],
        "usageUnknown": dict(sorted(report.usage_problems.items())),
        "pending": [
            {
                "namespace": p.namespace,
                "name": p.name,
                "classes": list(p.classes),
                "reason": p.reason,
                "detail": p.detail,
            }
            for p in report.pending
        ],
    }


def render_json(report: Report) -> str:
    """:func:`report_json` as indented JSON with sorted keys."""
    return json.dumps(report_json(report), indent=2, sort_keys=True)
