#!/usr/bin/env python3
"""A kubelet stand-in: just enough of a kubelet to drive a DRA plugin against a real control plane.

It plays the kubelet's DRA part for one simulated node, for the e2e tests and ``make demo``:

- **Node**: registers a Node object (capacity cpu/memory/pods, a Ready condition, the
  ``kubernetes.io/hostname`` label) and keeps it Ready: the node Lease in ``kube-node-lease`` is
  renewed and the Ready condition's heartbeat refreshed every ``heartbeat_interval`` seconds.
- **Plugin registration** (as the kubelet's plugin watcher does): polls ``registry_dir`` for
  ``*-reg.sock`` (names starting with ``.`` ignored), calls ``GetInfo`` (1 s timeout), checks
  ``type == "DRAPlugin"``, picks the first version in the plugin's list that it knows
  (``v1.DRAPlugin`` else ``v1beta1.DRAPlugin``) and answers ``NotifyRegistrationStatus``. A socket
  that disappears deregisters the plugin; a re-created one registers again. When a driver has
  had no endpoint for ``slice_cleanup_grace`` seconds its ResourceSlices of this node are
  deleted, and they are wiped when the stand-in starts (both as the kubelet does).
- **Pods bound to the node** (``spec.nodeName``): once every ResourceClaim of a pod (from
  ``spec.resourceClaims`` and ``status.resourceClaimStatuses``) is allocated and reserved for the
  pod, the claims are recorded in a checkpoint and ``NodePrepareResources`` is called per driver.
  On success the CDI device IDs go into the pod annotation :data:`CDI_ANNOTATION` (JSON) and a
  ``PreparedDynamicResources`` Event, and the pod is marked Running and Ready. A per-claim error
  becomes a Warning Event ``FailedPrepareDynamicResources`` carrying the plugin's text, and the
  pod is retried with exponential backoff.
- **Pod termination**: a pod with ``deletionTimestamp`` set has its claims unprepared
  (``NodeUnprepareResources``) and is then deleted with grace period 0. Claims whose pods have
  disappeared from the API (deleted with grace 0, or while the stand-in was down: the
  checkpoint remembers them) are unprepared too. A claim shared by several pods is unprepared
  when its last pod on this node is gone.

There are no containers: nothing is started, pulled or mounted.

Use it as an object (``KubeletStandin(api_client, node, registry_dir).start()`` ... ``stop()``,
or as a context manager) or as a command::

    python hack/kubelet_standin.py --kubeconfig K --node-name N --registry-dir D
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

# Run as a script (or imported from hack/), the repository root may not be on sys.path.
_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from dra_driver._proto import (  # noqa: E402
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)

log = logging.getLogger("kubelet-standin")

DRA_VERSIONS: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""DRA service versions the stand-in speaks (any order; the plugin's order decides)."""

CDI_ANNOTATION = "gpu-fraction.dra.dev/cdi-devices"
"""Pod annotation with the prepared devices and CDI IDs per pod claim (JSON object)."""

REASON_PREPARED = "PreparedDynamicResources"
REASON_PREPARE_FAILED = "FailedPrepareDynamicResources"
REASON_UNPREPARE_FAILED = "FailedUnprepareDynamicResources"

GET_INFO_TIMEOUT = 1.0
NOTIFY_TIMEOUT = 5.0
DIAL_TIMEOUT = 10.0
PREPARE_TIMEOUT = 45.0
"""Kubelet timeouts (seconds): k8s.io/kubernetes ``pkg/kubelet/cm/dra/plugin/dra_plugin.go``
(Prepare/Unprepare) and ``pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go``
(dial, ``GetInfo``, ``NotifyRegistrationStatus``)."""

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
MAX_EVENT_MESSAGE = 1024


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _rfc3339(t: dt.datetime | None = None) -> str:
    return (t or _now()).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro(t: dt.datetime | None = None) -> str:
    return (t or _now()).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --------------------------------------------------------------------------- pure helpers


def choose_version(supported: Sequence[str], known: Sequence[str] = DRA_VERSIONS) -> str | None:
    """The first entry of the plugin's ``supported`` list that the stand-in knows, or None."""
    return next((v for v in supported if v in known), None)


def is_registration_socket(name: str) -> bool:
    """Whether a file name in the registry dir is a plugin registration socket."""
    return name.endswith("-reg.sock") and not name.startswith(".")


@dataclass(frozen=True)
class PodClaim:
    """One entry of a pod's ``spec.resourceClaims``, resolved to a ResourceClaim name.

    ``claim_name`` is None while the ResourceClaim made from a template is not known yet
    (no ``status.resourceClaimStatuses`` entry); ``needed`` is False when the controller
    decided no claim is needed (a status entry without ``resourceClaimName``).
    """

    pod_claim: str
    claim_name: str | None
    needed: bool = True


def pod_claims(pod: Mapping[str, Any]) -> list[PodClaim]:
    """The pod's claims in ``spec.resourceClaims`` order (API JSON pod)."""
    statuses = {
        s["name"]: s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    out: list[PodClaim] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry["name"]
        if entry.get("resourceClaimName"):
            out.append(PodClaim(name, entry["resourceClaimName"]))
        elif name in statuses:
            claim = statuses[name]
            out.append(PodClaim(name, claim, needed=claim is not None))
        else:
            out.append(PodClaim(name, None))
    return out


def claim_not_ready_reason(claim: Mapping[str, Any], pod_uid: str) -> str | None:
    """Why a claim (API JSON) cannot be prepared for the pod yet, or None when it can."""
    meta = claim.get("metadata") or {}
    status = claim.get("status") or {}
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    if not status.get("allocation"):
        return f"claim {name} is not allocated"
    if not any(r.get("uid") == pod_uid for r in status.get("reservedFor") or []):
        return f"claim {name} is not reserved for the pod"
    return None


def claim_drivers(claim: Mapping[str, Any]) -> list[str]:
    """Drivers named by a claim's allocation results, sorted."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return sorted({r["driver"] for r in results if r.get("driver")})


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


# --------------------------------------------------------------------------- checkpoint


@dataclass
class ClaimRecord:
    """A claim the stand-in asked a plugin to prepare (kept until it is unprepared)."""

    namespace: str
    name: str
    uid: str
    drivers: list[str]
    pods: set[str] = field(default_factory=set)
    prepared: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "drivers": self.drivers,
            "pods": sorted(self.pods),
            "prepared": self.prepared,
        }

    @classmethod
    def from_json(cls, uid: str, doc: Mapping[str, Any]) -> ClaimRecord:
        return cls(
            namespace=str(doc["namespace"]),
            name=str(doc["name"]),
            uid=uid,
            drivers=[str(d) for d in doc.get("drivers") or []],
            pods={str(p) for p in doc.get("pods") or []},
            prepared=bool(doc.get("prepared", False)),
        )


class Checkpoint:
    """Claims the stand-in prepared, with their pods; a small JSON file written atomically
    (like the kubelet's ``dra_manager_state``) so that claims of pods deleted while the
    stand-in was down are still unprepared."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.claims: dict[str, ClaimRecord] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            doc = json.loads(self.path.read_text())
            self.claims = {
                uid: ClaimRecord.from_json(uid, rec) for uid, rec in doc.get("claims", {}).items()
            }
        except (ValueError, KeyError, TypeError) as exc:
            log.error("checkpoint %s unreadable (%s); starting empty", self.path, exc)
            self.claims = {}

    def save(self) -> None:
        if self.path is None:
            return
        with self._lock:
            doc = {"version": 1, "claims": {u: r.to_json() for u, r in self.claims.items()}}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
            os.replace(tmp, self.path)


# --------------------------------------------------------------------------- plugin registry


@dataclass
class Plugin:
    """A registered DRA plugin endpoint."""

    driver: str
    endpoint: str
    version: str
    registration_socket: str
    registered_at: float
    channel: grpc.Channel

    def prepare(
        self, claims: Sequence[ClaimRecord], timeout: float = PREPARE_TIMEOUT
    ) -> dict[str, dict[str, Any]]:
        """NodePrepareResources; returns per claim UID ``{"error": str, "devices": [...]}``."""
        pb, stub = self._api()
        reply = stub.NodePrepareResources(
            pb.NodePrepareResourcesRequest(
                claims=[pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
            ),
            timeout=timeout,
        )
        out: dict[str, dict[str, Any]] = {}
        for uid, result in reply.claims.items():
            devices = []
            for d in result.devices:
                device: dict[str, Any] = {
                    "requests": list(d.request_names),
                    "pool": d.pool_name,
                    "device": d.device_name,
                    "cdiDeviceIDs": list(d.cdi_device_ids),
                }
                if self.version == "v1.DRAPlugin" and d.HasField("share_id"):
                    device["shareID"] = d.share_id
                devices.append(device)
            out[uid] = {"error": result.error, "devices": devices}
        return out

    def unprepare(
        self, claims: Sequence[ClaimRecord], timeout: float = PREPARE_TIMEOUT
    ) -> dict[str, str]:
        """NodeUnprepareResources; returns the error text per claim UID ("" = done)."""
        pb, stub = self._api()
        reply = stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(
                claims=[pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
            ),
            timeout=timeout,
        )
        return {uid: result.error for uid, result in reply.claims.items()}

    def _api(self) -> tuple[Any, Any]:
        if self.version == "v1.DRAPlugin":
            return dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginStub(self.channel)
        return dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginStub(self.channel)


class PluginRegistry:
    """The kubelet's plugin watcher for DRA plugins: scans ``registry_dir`` and registers the
    plugins it finds. Thread-safe; :meth:`scan` is called periodically by the stand-in (tests
    may call it directly)."""

    def __init__(
        self,
        registry_dir: str | Path,
        versions: Sequence[str] = DRA_VERSIONS,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.registry_dir = Path(registry_dir)
        self.versions = tuple(versions)
        self.on_change = on_change
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[int, int]] = {}
        self._plugins: dict[str, Plugin] = {}  # registration socket path -> plugin
        self.rejected: dict[str, str] = {}  # registration socket path -> error
        self.last_gone: dict[str, float] = {}  # driver -> monotonic time it lost its endpoint

    def plugin(self, driver: str) -> Plugin | None:
        """The driver's most recently registered endpoint (rolling updates: the newest wins)."""
        with self._lock:
            candidates = [p for p in self._plugins.values() if p.driver == driver]
        return max(candidates, key=lambda p: p.registered_at, default=None)

    def drivers(self) -> set[str]:
        with self._lock:
            return {p.driver for p in self._plugins.values()}

    def scan(self) -> None:
        """Register new or re-created sockets; deregister vanished ones."""
        present: dict[str, tuple[int, int]] = {}
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.registry_dir):
                if not is_registration_socket(entry.name):
                    continue
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                present[entry.path] = (st.st_ino, st.st_mtime_ns)
        changed = False
        for path in [p for p in self._seen if present.get(p) != self._seen[p]]:
            del self._seen[path]
            self.rejected.pop(path, None)
            changed |= self._deregister(path)
        for path, ident in present.items():
            if path in self._seen:
                continue
            self._seen[path] = ident
            changed |= self._register(path)
        if changed and self.on_change is not None:
            self.on_change()

    def close(self) -> None:
        with self._lock:
            paths = list(self._plugins)
        for path in paths:
            self._deregister(path)
        self._seen.clear()

    def _register(self, path: str) -> bool:
        channel = grpc.insecure_channel(f"unix://{path}")
        try:
            grpc.channel_ready_future(channel).result(timeout=DIAL_TIMEOUT)
            stub = registration_pb2_grpc.RegistrationStub(channel)
            info = stub.GetInfo(registration_pb2.InfoRequest(), timeout=GET_INFO_TIMEOUT)
            error = ""
            version = choose_version(list(info.supported_versions), self.versions)
            if info.type != "DRAPlugin":
                error = f"plugin type {info.type!r} is not DRAPlugin"
            elif not info.name:
                error = "plugin reported an empty name"
            elif version is None:
                error = (
                    f"none of the plugin's versions {list(info.supported_versions)} is supported"
                    f" (known: {list(self.versions)})"
                )
            stub.NotifyRegistrationStatus(
                registration_pb2.RegistrationStatus(plugin_registered=not error, error=error),
                timeout=NOTIFY_TIMEOUT,
            )
        except (grpc.FutureTimeoutError, grpc.RpcError) as exc:
            log.warning("registration via %s failed: %s", path, exc)
            self.rejected[path] = str(exc)
            # Forget it so the next scan retries (the kubelet retries on the next fs event).
            self._seen.pop(path, None)
            return False
        finally:
            channel.close()
        if error:
            log.warning("plugin at %s rejected: %s", path, error)
            self.rejected[path] = error
            return False
        assert version is not None
        plugin = Plugin(
            driver=info.name,
            endpoint=info.endpoint,
            version=version,
            registration_socket=path,
            registered_at=time.monotonic(),
            channel=grpc.insecure_channel(f"unix://{info.endpoint}"),
        )
        with self._lock:
            self._plugins[path] = plugin
        self.last_gone.pop(info.name, None)
        log.info("registered DRA plugin %s (%s) at %s", info.name, version, info.endpoint)
        return True

    def _deregister(self, path: str) -> bool:
        with self._lock:
            plugin = self._plugins.pop(path, None)
            left = plugin is not None and any(
                p.driver == plugin.driver for p in self._plugins.values()
            )
        if plugin is None:
            return False
        plugin.channel.close()
        if not left:
            self.last_gone[plugin.driver] = time.monotonic()
        log.info("deregistered DRA plugin %s (socket %s gone)", plugin.driver, path)
        return True


# --------------------------------------------------------------------------- the stand-in


class PrepareFailed(Exception):
    """Preparing a pod's claims failed; ``messages`` are the user-facing errors (one Event
    each)."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("; ".join(messages))
        self.messages = messages


class NotReady(Exception):
    """A pod's claims are not ready to prepare yet (not created, allocated or reserved)."""


@dataclass
class _PodState:
    attempts: int = 0
    next_try: float = 0.0
    running: bool = False


class KubeletStandin:
    """Plays the kubelet's DRA role for one node (see the module docstring).

    Args:
        api_client: an authenticated ``kubernetes.client.ApiClient`` (cluster admin).
        node_name: the Node to register (also ``spec.nodeName`` of its pods).
        registry_dir: where plugins put their ``*-reg.sock``.
        checkpoint_path: JSON file remembering prepared claims (None: memory only).
        capacity: Node capacity and allocatable (``cpu``, ``memory``, ``pods``).
        labels: extra Node labels.
        resync_interval: seconds between full pod resyncs (a pod watch wakes it sooner).
        heartbeat_interval: seconds between Lease renewals and Ready heartbeats.
        registry_poll_interval: seconds between scans of ``registry_dir``.
        initial_backoff, max_backoff: retry delays of a pod whose prepare failed.
        versions: DRA versions the stand-in speaks.
        slice_cleanup_grace: seconds without an endpoint after which a driver's ResourceSlices
            of this node are deleted (None: never).
        wipe_slices_on_start: delete this node's ResourceSlices at start (as the kubelet does).
        delete_node_on_stop: delete the Node object (and its Lease) in :meth:`stop`.
        prepare_timeout: gRPC timeout of Prepare/Unprepare calls.
    """

    def __init__(
        self,
        api_client: k8s.ApiClient,
        node_name: str,
        registry_dir: str | Path,
        *,
        checkpoint_path: str | Path | None = None,
        capacity: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        resync_interval: float = 2.0,
        heartbeat_interval: float = 5.0,
        registry_poll_interval: float = 0.25,
        initial_backoff: float = 1.0,
        max_backoff: float = 30.0,
        versions: Sequence[str] = DRA_VERSIONS,
        slice_cleanup_grace: float | None = 30.0,
        wipe_slices_on_start: bool = True,
        delete_node_on_stop: bool = False,
        prepare_timeout: float = PREPARE_TIMEOUT,
    ) -> None:
        self.api = api_client
        self.core = k8s.CoreV1Api(api_client)
        self.resource = k8s.ResourceV1Api(api_client)
        self.coordination = k8s.CoordinationV1Api(api_client)
        self.node_name = node_name
        self.capacity = dict(capacity or {"cpu": "16", "memory": "64Gi", "pods": "110"})
        self.labels = dict(labels or {})
        self.resync_interval = resync_interval
        self.heartbeat_interval = heartbeat_interval
        self.registry_poll_interval = registry_poll_interval
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.slice_cleanup_grace = slice_cleanup_grace
        self.wipe_slices_on_start = wipe_slices_on_start
        self.delete_node_on_stop = delete_node_on_stop
        self.prepare_timeout = prepare_timeout
        self.checkpoint = Checkpoint(Path(checkpoint_path) if checkpoint_path else None)
        self._wake = threading.Event()
        self.registry = PluginRegistry(registry_dir, versions, on_change=self._wake.set)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pods: dict[str, _PodState] = {}
        self._events: dict[tuple[str, str, str], tuple[str, int]] = {}
        self._node_uid: str | None = None
        self._started_at = _now()
        self._watch_response: Any = None

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> KubeletStandin:
        """Register the Node and start the heartbeat, registry, pod-watch and sync threads."""
        self.checkpoint.load()
        self._ensure_node()
        self._renew_lease()
        if self.wipe_slices_on_start:
            self._delete_slices(None)
        for name, target in (
            ("heartbeat", self._heartbeat_loop),
            ("registry", self._registry_loop),
            ("pod-watch", self._watch_loop),
            ("pod-sync", self._sync_loop),
        ):
            t = threading.Thread(target=target, name=f"standin-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        log.info("kubelet stand-in for node %s started", self.node_name)
        return self

    def stop(self) -> None:
        """Stop every thread (prepared claims stay prepared, as when a kubelet stops)."""
        self._stop.set()
        self._wake.set()
        resp = self._watch_response
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()
        for t in self._threads:
            t.join(timeout=10)
        self._threads.clear()
        self.registry.close()
        if self.delete_node_on_stop:
            for fn in (
                lambda: self.coordination.delete_namespaced_lease(
                    self.node_name, "kube-node-lease"
                ),
                lambda: self.core.delete_node(self.node_name),
            ):
                try:
                    fn()
                except ApiException as exc:
                    if exc.status != 404:
                        log.warning("cleanup of node %s: %s", self.node_name, exc)
        log.info("kubelet stand-in for node %s stopped", self.node_name)

    def __enter__(self) -> KubeletStandin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def sync_now(self) -> None:
        """Wake the pod sync loop."""
        self._wake.set()

    def wait_registered(self, driver: str, timeout: float = 30.0) -> Plugin:
        """Wait until ``driver`` has a registered endpoint."""
        deadline = time.monotonic() + timeout
        while (plugin := self.registry.plugin(driver)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"plugin {driver} not registered on {self.node_name} within {timeout}s "
                    f"(rejected: {self.registry.rejected or 'none'})"
                )
            time.sleep(0.1)
        return plugin

    def wait_node_schedulable(self, timeout: float = 60.0) -> None:
        """Wait until the controller-manager removed the not-ready taint it adds on create."""
        deadline = time.monotonic() + timeout
        while True:
            node = self._read_node() or {}
            taints = (node.get("spec") or {}).get("taints") or []
            if node and not any(t.get("key") == NOT_READY_TAINT for t in taints):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {self.node_name} still tainted {taints}")
            time.sleep(0.2)

    def prepared_claims(self) -> dict[str, ClaimRecord]:
        """Claims currently recorded as prepared or being prepared (UID -> record)."""
        while True:
            try:  # the sync thread may be changing it right now
                return dict(self.checkpoint.claims)
            except RuntimeError:
                continue

    # ---- node, lease, heartbeat ---------------------------------------------------------

    def _conditions(self) -> list[dict[str, Any]]:
        now = _rfc3339()
        since = _rfc3339(self._started_at)

        def cond(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": since,
            }

        return [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "stand-in"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "stand-in"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "stand-in"),
            cond("Ready", "True", "KubeletReady", "kubelet stand-in is posting ready status"),
        ]

    def _read_node(self) -> dict[str, Any] | None:
        try:
            resp = self.core.read_node(self.node_name, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        node: dict[str, Any] = json.loads(resp.data)
        return node

    def _ensure_node(self) -> None:
        existing = self._read_node()
        if existing is not None:
            self._node_uid = existing["metadata"]["uid"]
            self._post_status()
            return
        labels = {
            "kubernetes.io/hostname": self.node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **self.labels,
        }
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": labels},
            "status": {
                "capacity": self.capacity,
                "allocatable": self.capacity,
                "conditions": self._conditions(),
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.node_name},
                ],
            },
        }
        created = self.core.create_node(k8s.V1Node.from_dict(body), _preload_content=False)
        self._node_uid = json.loads(created.data)["metadata"]["uid"]
        log.info("node %s registered", self.node_name)

    def _post_status(self) -> None:
        patch = {
            "status": {
                "capacity": self.capacity,
                "allocatable": self.capacity,
                "conditions": self._conditions(),
            }
        }
        self.core.patch_node_status(
            self.node_name,
            patch,
            _content_type="application/strategic-merge-patch+json",
            _preload_content=False,
        )

    def _renew_lease(self) -> None:
        ns, name = "kube-node-lease", self.node_name
        spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": _micro()}
        try:
            self.coordination.patch_namespaced_lease(
                name,
                ns,
                {"spec": spec},
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            owner = []
            if self._node_uid:
                owner = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": self._node_uid}]
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": ns, "ownerReferences": owner},
                "spec": spec,
            }
            self.coordination.create_namespaced_lease(
                ns, k8s.V1Lease.from_dict(body), _preload_content=False
            )

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            try:
                self._renew_lease()
                try:
                    self._post_status()
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                    self._ensure_node()  # deleted behind our back: register again
            except Exception as exc:
                log.warning("node heartbeat failed: %s", exc)

    # ---- plugins and slices --------------------------------------------------------------

    def _registry_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.registry.scan()
                self._cleanup_slices_of_gone_drivers()
            except Exception:
                log.exception("registry scan failed")
            self._stop.wait(self.registry_poll_interval)

    def _cleanup_slices_of_gone_drivers(self) -> None:
        if self.slice_cleanup_grace is None:
            return
        now = time.monotonic()
        for driver, since in list(self.registry.last_gone.items()):
            if now - since >= self.slice_cleanup_grace and self.registry.plugin(driver) is None:
                del self.registry.last_gone[driver]
                self._delete_slices(driver)

    def _delete_slices(self, driver: str | None) -> None:
        selector = f"spec.nodeName={self.node_name}"
        if driver:
            selector += f",spec.driver={driver}"
        try:
            resp = self.resource.list_resource_slice(
                field_selector=selector, _preload_content=False
            )
            for item in json.loads(resp.data).get("items") or []:
                with contextlib.suppress(ApiException):
                    self.resource.delete_resource_slice(item["metadata"]["name"])
                log.info("deleted ResourceSlice %s", item["metadata"]["name"])
        except ApiException as exc:
            log.warning("deleting ResourceSlices of %s failed: %s", self.node_name, exc)

    # ---- pod watch and sync --------------------------------------------------------------

    def _watch_loop(self) -> None:
        """Wake the sync loop on every change of a pod bound to the node (a raw watch, so that
        :meth:`stop` can shut the stream down at once)."""
        while not self._stop.is_set():
            try:
                resp = self.core.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={self.node_name}",
                    watch=True,
                    timeout_seconds=60,
                    _preload_content=False,
                    _request_timeout=(5, 90),
                )
            except Exception as exc:
                log.debug("pod watch failed: %s", exc)
                self._stop.wait(1.0)
                continue
            self._watch_response = resp
            try:
                if self._stop.is_set():
                    break
                for chunk in resp.stream(amt=None, decode_content=True):
                    if chunk:
                        self._wake.set()
                    if self._stop.is_set():
                        break
            except Exception as exc:
                if not self._stop.is_set():
                    log.debug("pod watch ended: %s", exc)
                    self._stop.wait(1.0)
            finally:
                self._watch_response = None
                with contextlib.suppress(Exception):
                    resp.release_conn()

    def _sync_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.resync_interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.sync_once()
            except Exception:
                log.exception("pod sync failed")
                self._stop.wait(0.5)

    def _list_pods(self) -> list[dict[str, Any]]:
        resp = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}", _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(resp.data).get("items") or []
        return items

    def sync_once(self) -> None:
        """One pass over the node's pods and the checkpoint."""
        pods = self._list_pods()
        present = {p["metadata"]["uid"] for p in pods}
        now = time.monotonic()
        for pod in pods:
            meta = pod["metadata"]
            uid = meta["uid"]
            state = self._pods.setdefault(uid, _PodState())
            try:
                if meta.get("deletionTimestamp"):
                    self._terminate(pod)
                elif is_terminal(pod):
                    self._release_pod(uid, pod)
                elif not state.running and now >= state.next_try:
                    if self._already_running(pod):
                        state.running = True
                    else:
                        self._start_pod(pod, state)
            except Exception as exc:  # one pod's trouble does not stop the others
                delay = self._backoff(state)
                log.warning(
                    "pod %s/%s: %s (retry in %.1fs)", meta["namespace"], meta["name"], exc, delay
                )
        self._release_gone(present)
        for uid in [u for u in self._pods if u not in present]:
            del self._pods[uid]
        for key in [k for k in self._events if k[0] not in present]:
            del self._events[key]

    def _already_running(self, pod: dict[str, Any]) -> bool:
        """A pod this stand-in (or an earlier run with the same checkpoint) already started."""
        meta = pod["metadata"]
        if (pod.get("status") or {}).get("phase") != "Running":
            return False
        prepared = {
            (r.namespace, r.name)
            for r in self.checkpoint.claims.values()
            if r.prepared and meta["uid"] in r.pods
        }
        return all(
            (meta["namespace"], c.claim_name) in prepared for c in pod_claims(pod) if c.needed
        )

    def _backoff(self, state: _PodState) -> float:
        delay = min(self.max_backoff, self.initial_backoff * 2**state.attempts)
        state.attempts += 1
        state.next_try = time.monotonic() + delay
        return delay

    def _start_pod(self, pod: dict[str, Any], state: _PodState) -> None:
        meta = pod["metadata"]
        try:
            prepared = self._prepare_pod(pod)
        except NotReady as exc:
            log.debug("pod %s/%s waits: %s", meta["namespace"], meta["name"], exc)
            state.next_try = time.monotonic() + 0.5
            return
        except PrepareFailed as exc:
            delay = self._backoff(state)
            for message in exc.messages:
                self._event(pod, "Warning", REASON_PREPARE_FAILED, message)
            log.warning(
                "prepare for pod %s/%s failed (retry in %.1fs): %s",
                meta["namespace"],
                meta["name"],
                delay,
                exc,
            )
            return
        if prepared:
            ids = [i for c in prepared.values() for d in c["devices"] for i in d["cdiDeviceIDs"]]
            self._annotate(pod, prepared)
            self._event(
                pod,
                "Normal",
                REASON_PREPARED,
                f"Prepared {len(prepared)} ResourceClaim(s); CDI devices: {', '.join(ids)}",
            )
        self._set_running(pod)
        state.running = True
        state.attempts = 0

    def _prepare_pod(self, pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
        meta = pod["metadata"]
        ns, pod_uid = meta["namespace"], meta["uid"]
        entries = [c for c in pod_claims(pod) if c.needed]
        if not entries:
            return {}
        claims: list[tuple[PodClaim, dict[str, Any]]] = []
        for entry in entries:
            if entry.claim_name is None:
                raise NotReady(f"ResourceClaim for {entry.pod_claim!r} not created yet")
            try:
                resp = self.resource.read_namespaced_resource_claim(
                    entry.claim_name, ns, _preload_content=False
                )
            except ApiException as exc:
                if exc.status == 404:
                    raise NotReady(f"ResourceClaim {ns}/{entry.claim_name} not found") from exc
                raise
            claim = json.loads(resp.data)
            reason = claim_not_ready_reason(claim, pod_uid)
            if reason:
                raise NotReady(reason)
            claims.append((entry, claim))

        records: list[tuple[PodClaim, ClaimRecord]] = []
        for entry, claim in claims:
            cuid = claim["metadata"]["uid"]
            record = self.checkpoint.claims.get(cuid)
            if record is None:
                record = ClaimRecord(ns, claim["metadata"]["name"], cuid, claim_drivers(claim))
                self.checkpoint.claims[cuid] = record
            record.pods.add(pod_uid)
            records.append((entry, record))
        self.checkpoint.save()  # before calling, as the kubelet does

        errors: list[str] = []
        results: dict[str, dict[str, Any]] = {}
        by_driver: dict[str, list[ClaimRecord]] = {}
        for _, record in records:
            for driver in record.drivers:
                by_driver.setdefault(driver, []).append(record)
        for driver, recs in sorted(by_driver.items()):
            plugin = self.registry.plugin(driver)
            if plugin is None:
                errors.append(f"DRA driver {driver} is not registered on node {self.node_name}")
                continue
            try:
                reply = plugin.prepare(recs, timeout=self.prepare_timeout)
            except grpc.RpcError as exc:
                errors.append(f"NodePrepareResources to {driver} failed: {_rpc_text(exc)}")
                continue
            for rec in recs:
                got = reply.get(rec.uid)
                if got is None:
                    errors.append(
                        f"NodePrepareResources failed for ResourceClaim {rec.name}: "
                        f"driver {driver} returned no result for claim UID {rec.uid}"
                    )
                elif got["error"]:
                    errors.append(
                        f"NodePrepareResources failed for ResourceClaim {rec.name}: {got['error']}"
                    )
                else:
                    results.setdefault(rec.uid, {"devices": []})["devices"] += got["devices"]
        if errors:
            raise PrepareFailed(errors)
        prepared: dict[str, dict[str, Any]] = {}
        for entry, record in records:
            record.prepared = True
            prepared[entry.pod_claim] = {
                "claimName": record.name,
                "claimUID": record.uid,
                "devices": results.get(record.uid, {}).get("devices", []),
            }
        self.checkpoint.save()
        return prepared

    def _terminate(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if not self._release_pod(meta["uid"], pod):
            return  # retried at the next sync
        try:
            self.core.delete_namespaced_pod(
                meta["name"],
                meta["namespace"],
                grace_period_seconds=0,
                body=k8s.V1DeleteOptions.from_dict(
                    {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
                ),
                _preload_content=False,
            )
            log.info("pod %s/%s terminated and deleted", meta["namespace"], meta["name"])
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def _release_pod(self, pod_uid: str, pod: dict[str, Any] | None) -> bool:
        """Drop ``pod_uid`` from its claims and unprepare the claims it was the last user of.

        Returns True when nothing is left to do for the pod (failures are retried later).
        """
        state = self._pods.get(pod_uid)
        if state is not None:
            state.running = False
        mine = [r for r in self.checkpoint.claims.values() if pod_uid in r.pods]
        if not mine:
            return True
        last = [r for r in mine if r.pods == {pod_uid}]
        for record in mine:
            if record not in last:
                record.pods.discard(pod_uid)
        ok = self._unprepare(last, pod)
        self.checkpoint.save()
        return ok

    def _release_gone(self, present: set[str]) -> None:
        """Unprepare claims whose pods are no longer in the API (deleted with grace 0, or while
        the stand-in was down)."""
        gone = {p for r in self.checkpoint.claims.values() for p in r.pods if p not in present}
        for pod_uid in sorted(gone):
            self._release_pod(pod_uid, None)

    def _unprepare(self, records: Iterable[ClaimRecord], pod: dict[str, Any] | None) -> bool:
        by_driver: dict[str, list[ClaimRecord]] = {}
        records = list(records)
        for record in records:
            for driver in record.drivers or [""]:
                by_driver.setdefault(driver, []).append(record)
        failed: dict[str, str] = {}
        for driver, recs in sorted(by_driver.items()):
            if not driver:
                continue
            plugin = self.registry.plugin(driver)
            if plugin is None:
                for rec in recs:
                    failed[rec.uid] = f"DRA driver {driver} is not registered"
                continue
            try:
                reply = plugin.unprepare(recs, timeout=self.prepare_timeout)
            except grpc.RpcError as exc:
                for rec in recs:
                    failed[rec.uid] = f"NodeUnprepareResources failed: {_rpc_text(exc)}"
                continue
            for rec in recs:
                error = reply.get(rec.uid, f"driver {driver} returned no result")
                if error:
                    failed[rec.uid] = error
        for record in records:
            if record.uid in failed:
                message = (
                    f"NodeUnprepareResources failed for ResourceClaim {record.name}: "
                    f"{failed[record.uid]}"
                )
                log.warning("%s", message)
                if pod is not None:
                    self._event(pod, "Warning", REASON_UNPREPARE_FAILED, message)
            else:
                self.checkpoint.claims.pop(record.uid, None)
                log.info("unprepared claim %s/%s (%s)", record.namespace, record.name, record.uid)
        return not failed

    # ---- writes to the pod ----------------------------------------------------------------

    def _annotate(self, pod: dict[str, Any], prepared: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        patch = {"metadata": {"annotations": {CDI_ANNOTATION: json.dumps(prepared)}}}
        self.core.patch_namespaced_pod(
            meta["name"],
            meta["namespace"],
            patch,
            _content_type="application/merge-patch+json",
            _preload_content=False,
        )

    def _set_running(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        now = _rfc3339()

        def cond(kind: str) -> dict[str, Any]:
            return {"type": kind, "status": "True", "lastTransitionTime": now}

        running = {"running": {"startedAt": now}}
        statuses = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "containerID": f"standin://{meta['uid']}/{c['name']}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": running,
            }
            for c in spec.get("containers") or []
        ]
        init = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "containerID": f"standin://{meta['uid']}/{c['name']}",
                "ready": True,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": now,
                        "finishedAt": now,
                    }
                },
            }
            for c in spec.get("initContainers") or []
        ]
        status: dict[str, Any] = {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": now,
            "conditions": [
                cond(k)
                for k in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": statuses,
        }
        if init:
            status["initContainerStatuses"] = init
        self.core.patch_namespaced_pod_status(
            meta["name"],
            meta["namespace"],
            {"status": status},
            _content_type="application/strategic-merge-patch+json",
            _preload_content=False,
        )
        log.info("pod %s/%s is Running", meta["namespace"], meta["name"])

    def _event(self, pod: dict[str, Any], kind: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        message = message[:MAX_EVENT_MESSAGE]
        key = (meta["uid"], reason, message)
        now = _rfc3339()
        try:
            if key in self._events:
                name, count = self._events[key]
                patch = {"count": count + 1, "lastTimestamp": now}
                self.core.patch_namespaced_event(
                    name,
                    meta["namespace"],
                    patch,
                    _content_type="application/merge-patch+json",
                    _preload_content=False,
                )
                self._events[key] = (name, count + 1)
                return
            name = f"{meta['name']}.{uuid.uuid4().hex[:16]}"
            body = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": meta["namespace"]},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta["uid"],
                },
                "reason": reason,
                "message": message,
                "type": kind,
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "source": {"component": "kubelet", "host": self.node_name},
                "reportingComponent": "kubelet",
                "reportingInstance": self.node_name,
            }
            self.core.create_namespaced_event(
                meta["namespace"], k8s.CoreV1Event.from_dict(body), _preload_content=False
            )
            self._events[key] = (name, 1)
        except ApiException as exc:
            log.warning("recording event %s on %s failed: %s", reason, meta["name"], exc)


def _rpc_text(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{getattr(code, 'name', code)}: {details}"


# --------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubelet_standin.py",
        description="Register a simulated node and drive DRA plugins the way the kubelet does.",
    )
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), required=False)
    p.add_argument("--node-name", required=True)
    p.add_argument("--registry-dir", required=True, help="where plugins put *-reg.sock")
    p.add_argument("--checkpoint", default=None, help="JSON checkpoint of prepared claims")
    p.add_argument("--cpu", default="16")
    p.add_argument("--memory", default="64Gi")
    p.add_argument("--pods", default="110")
    p.add_argument("--delete-node-on-exit", action="store_true")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.kubeconfig:
        print("error: --kubeconfig (or KUBECONFIG) is required", file=sys.stderr)
        return 2
    api = k8s_config.new_client_from_config(config_file=args.kubeconfig)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    standin = KubeletStandin(
        api,
        args.node_name,
        args.registry_dir,
        checkpoint_path=args.checkpoint,
        capacity={"cpu": args.cpu, "memory": args.memory, "pods": args.pods},
        delete_node_on_stop=args.delete_node_on_exit,
    )
    standin.start()
    try:
        stop.wait()
    finally:
        standin.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
