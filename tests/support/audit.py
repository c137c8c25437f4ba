"""A kubelet-less local control plane whose API server writes an audit log of every request's
metadata, and reading that log: what the API server saw of a client, by User-Agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.support.paths import REPO

POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
"""
"""Every request, metadata only, logged when its response starts (a watch) and completes."""

PLUGIN_AGENTS = ("dra-driver/",)
"""User-Agent prefix of the driver's requests (``dra_driver.infra.kubeconfig.user_agent``)."""


@contextmanager
def audited_cluster(root: Path) -> Iterator[Path]:
    """A nodeless ``hack/local-cluster`` with state in ``root/cluster`` whose API server logs
    to ``root/audit.log`` (outside the state directory, which ``down`` keeps to its own
    files); yields the kubeconfig path and stops the cluster at the end.

    Raises:
        subprocess.CalledProcessError: the control plane did not come up.
    """
    (root / "audit-policy.yaml").write_text(POLICY)
    env = {
        **os.environ,
        "LOCAL_CLUSTER_DIR": str(root / "cluster"),
        "LOCAL_CLUSTER_NODES": "",
        "LOCAL_CLUSTER_APISERVER_ARGS": (
            f"--audit-policy-file={root / 'audit-policy.yaml'} "
            f"--audit-log-path={root / 'audit.log'} --audit-log-format=json "
            "--audit-log-maxbackup=0"
        ),
    }
    script = [sys.executable, str(REPO / "hack" / "local-cluster")]
    subprocess.run([*script, "up"], env=env, check=True, capture_output=True, text=True)
    try:
        yield root / "cluster" / "kubeconfig"
    finally:
        subprocess.run([*script, "down"], env=env, check=False, capture_output=True)


def audit_events(log: Path) -> list[dict[str, Any]]:
    """Each request in the audit log ``log`` once (its first stage logged: a watch's
    ResponseStarted, else ResponseComplete), in log order."""
    seen: dict[str, dict[str, Any]] = {}
    with log.open() as lines:
        for line in lines:
            event = json.loads(line)
            seen.setdefault(event["auditID"], event)
    return list(seen.values())


def received(event: dict[str, Any]) -> float:
    """When the API server received the request (Unix seconds)."""
    return datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()


def request_kind(event: dict[str, Any]) -> str:
    """``<verb> <resource>[/<subresource>]``, e.g. ``watch resourceslices``."""
    ref = event.get("objectRef") or {}
    resource = ref.get("resource", event["requestURI"].split("?")[0])
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    return f"{event['verb']} {resource}"


def requests_of(
    events: list[dict[str, Any]],
    agents: tuple[str, ...],
    start: float = 0.0,
    end: float = float("inf"),
) -> Counter[str]:
    """The requests of clients whose User-Agent starts with one of ``agents``, received in
    ``[start, end)``, counted by :func:`request_kind`."""
    return Counter(
        request_kind(e)
        for e in events
        if e.get("userAgent", "").startswith(agents) and start <= received(e) < end
    )
