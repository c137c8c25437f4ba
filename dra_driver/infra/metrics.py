"""Prometheus metrics of the plugin (served on ``/metrics`` by the kubelet-plugin command)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """The plugin's metrics in their own registry (so tests can create several).

    Metrics:
        ``dra_gpu_fraction_operations_total{operation}``: claims handled by prepare/unprepare.
        ``dra_gpu_fraction_errors_total{operation}``: per-claim failures (and checkpoint errors).
        ``dra_gpu_fraction_call_duration_seconds{operation}``: one gRPC call, seconds.
        ``dra_gpu_fraction_slice_publish_failures_total{operation,reason}``: ResourceSlice API
            calls of the publisher that failed (every retried attempt counts); ``operation`` is
            ``list``, ``create``, ``update`` or ``delete``, ``reason`` the HTTP status
            (``409``, ``503``...), ``connection`` (no response) or ``other``.
        ``dra_gpu_fraction_claim_status_writes_total{result}``: claims whose device status
            the plugin handled after Prepare, by result (``written``, ``unchanged``,
            ``skipped``: claim gone, re-created or not allocated on this node, ``failed``).
        ``dra_gpu_fraction_mps_clients_terminated_total{reason}``: MPS clients the plugin
            terminated, by reason (``over_claim_cap``: beyond their claim's share of the MPS
            server's client table, ``docs/enforcement.md``, "Client cap").
        ``dra_gpu_fraction_mps_server_restarts_total{gpu,mode}``: MPS servers of prepared
            claims found replaced (a new PID: the server failed and was re-created, or its
            control daemon was restarted), per GPU UUID of the server and compute mode; their
            running clients lost their connection.
        ``dra_gpu_fraction_orphaned_claims_released_total{reason}``: prepared claims the plugin
            released itself because no Unprepare would come (``gone``: the claim was deleted;
            ``not_allocated_here``: it is no longer allocated to this node), none of their
            containers running (``docs/admin-guide.md``, "Claims that never get their
            Unprepare").
        ``dra_gpu_fraction_kubelet_registered``: 1 once the kubelet has called the plugin's
            registration socket since it started, else 0 (a kubelet ``--root-dir`` that is not
            the chart's ``kubeletDir`` leaves it at 0: ``docs/admin-guide.md``, "A kubelet with
            another root directory").
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.operations = Counter(
            "dra_gpu_fraction_operations",
            "Claims handled, by operation (prepare, unprepare)",
            ["operation"],
            registry=self.registry,
        )
        self.errors = Counter(
            "dra_gpu_fraction_errors",
            "Per-claim failures, by operation (prepare, unprepare, checkpoint)",
            ["operation"],
            registry=self.registry,
        )
        self.slice_publish_failures = Counter(
            "dra_gpu_fraction_slice_publish_failures",
            "ResourceSlice API calls that failed, by operation (list, create, update, delete)"
            " and reason (HTTP status, connection, other)",
            ["operation", "reason"],
            registry=self.registry,
        )
        self.claim_status_writes = Counter(
            "dra_gpu_fraction_claim_status_writes",
            "Claims whose status.devices the plugin handled, by result (written, unchanged,"
            " skipped, failed)",
            ["result"],
            registry=self.registry,
        )
        self.mps_clients_terminated = Counter(
            "dra_gpu_fraction_mps_clients_terminated",
            "MPS clients the plugin terminated, by reason (over_claim_cap: beyond their"
            " claim's share of the MPS server's client table)",
            ["reason"],
            registry=self.registry,
        )
        self.mps_server_restarts = Counter(
            "dra_gpu_fraction_mps_server_restarts",
            "MPS servers of prepared claims found replaced (their clients lost their"
            " connection), by GPU UUID and compute mode",
            ["gpu", "mode"],
            registry=self.registry,
        )
        self.orphaned_claims_released = Counter(
            "dra_gpu_fraction_orphaned_claims_released",
            "Prepared claims released by the plugin because no Unprepare would come, by reason"
            " (gone, not_allocated_here)",
            ["reason"],
            registry=self.registry,
        )
        self.kubelet_registered = Gauge(
            "dra_gpu_fraction_kubelet_registered",
            "1 once the kubelet has called the plugin's registration socket since it started,"
            " else 0",
            registry=self.registry,
        )
        self.duration = Histogram(
            "dra_gpu_fraction_call_duration_seconds",
            "Duration of one Prepare/Unprepare call, seconds",
            ["operation"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )

    def observe(self, operation: str, claims: int, seconds: float) -> None:
        """Record one call handling ``claims`` claims in ``seconds``."""
        self.operations.labels(operation=operation).inc(claims)
        self.duration.labels(operation=operation).observe(seconds)
