"""Reads what ``dra-driver occupancy`` needs from the API server (read-only, no node access):
the driver's ResourceSlices, ResourceClaims, ResourceClaimTemplates, Pending pods,
ResourceQuotas, DeviceClasses and Nodes, as raw API JSON
(:class:`~dra_driver.cluster.occupancy.Cluster`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config import ConfigException

from dra_driver.cluster.occupancy import Cluster, Json
from dra_driver.cluster.occupancyusage import ClaimUse, metrics_port, parse_metrics
from dra_driver.model.defaults import PLUGIN_SELECTOR

PAGE = 500
"""Objects per list call (the API server pages with ``continue`` tokens)."""

TIMEOUT_S = (5.0, 30.0)
"""Connect and read timeout of each list call, seconds."""
PROXY_TIMEOUT_S = (3.0, 10.0)
"""Connect and read timeout of one plugin's metrics through the pod proxy, seconds."""
READERS = 16
"""Plugins read at once."""


class ConfigSource(NamedTuple):
    """Where ``occupancy`` takes its Kubernetes configuration from.

    Attributes:
        label: how a message names it (``--kubeconfig /x``, ``KUBECONFIG=/x``, ...).
        path: the kubeconfig file (or ``KUBECONFIG``'s list of files), None for the pod's
            service account.
    """

    label: str
    path: str | None


def config_source(kubeconfig: str | None, environ: Mapping[str, str], home: Path) -> ConfigSource:
    """Pick the configuration as kubectl does (pure): ``--kubeconfig``, else ``$KUBECONFIG``
    (a file, or several joined by ``os.pathsep``, merged), else ``~/.kube/config`` when it
    exists, else the pod's service account. A ``KUBECONFIG`` that names a missing file is used
    (and fails naming it) like the flag, never skipped for another configuration."""
    if kubeconfig:
        return ConfigSource(f"--kubeconfig {kubeconfig}", kubeconfig)
    if environ.get("KUBECONFIG"):
        return ConfigSource(f"KUBECONFIG={environ['KUBECONFIG']}", environ["KUBECONFIG"])
    default = home / ".kube" / "config"
    if default.exists():
        return ConfigSource(f"{default} (no --kubeconfig, KUBECONFIG unset)", str(default))
    return ConfigSource("the pod's service account (no --kubeconfig, KUBECONFIG unset)", None)


NO_CONFIGURATION = (
    "no Kubernetes configuration: no --kubeconfig, KUBECONFIG is unset, ~/.kube/config does "
    "not exist, and this is not a pod (KUBERNETES_SERVICE_HOST unset); pass --kubeconfig FILE "
    "or export KUBECONFIG=FILE"
)


def api_client(source: ConfigSource) -> k8s.ApiClient:
    """A client for ``source`` (:func:`config_source`), one retry per call.

    Raises:
        KubeconfigError: unusable kubeconfig (the message names the file and where it came
            from) or, without one, not inside a pod (:data:`NO_CONFIGURATION`).
    """
    from dra_driver.infra.kubeconfig import KubeconfigError, load_kubeconfig

    cfg = k8s.Configuration()
    if source.path is None:
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)
        except ConfigException as exc:
            raise KubeconfigError(NO_CONFIGURATION) from exc
    elif os.pathsep in source.path:  # KUBECONFIG's list: merged by the client, as kubectl does
        try:
            k8s_config.load_kube_config(config_file=source.path, client_configuration=cfg)
        except (ConfigException, OSError, ValueError) as exc:
            raise KubeconfigError(f"{source.label}: {' '.join(str(exc).split())}") from exc
    else:
        try:
            load_kubeconfig(Path(source.path), cfg)
        except KubeconfigError as exc:
            label = "" if source.label.startswith("--") else f" (from {source.label})"
            raise KubeconfigError(f"{exc}{label}") from exc
    cfg.retries = 1
    return k8s.ApiClient(cfg)


def list_all(call: Callable[..., Any], **kwargs: Any) -> list[Json]:
    """Every item of a list call, page by page, as API JSON.

    Raises:
        ApiException: the API server refused (e.g. 403 without list permission).
        urllib3.exceptions.HTTPError, OSError: the API server is unreachable.
    """
    items: list[Json] = []
    token: str | None = None
    while True:
        page = {"limit": PAGE, "_continue": token} if token else {"limit": PAGE}
        resp = call(_preload_content=False, _request_timeout=TIMEOUT_S, **kwargs, **page)
        body = json.loads(resp.data)
        items += body.get("items") or []
        token = (body.get("metadata") or {}).get("continue")
        if not token:
            return items


def read_cluster(api: k8s.ApiClient, driver: str) -> Cluster:
    """The objects the occupancy report is decided from (see :func:`list_all` for errors)."""
    res, core = k8s.ResourceV1Api(api), k8s.CoreV1Api(api)
    return Cluster(
        slices=list_all(res.list_resource_slice, field_selector=f"spec.driver={driver}"),
        claims=list_all(res.list_resource_claim_for_all_namespaces),
        templates=list_all(res.list_resource_claim_template_for_all_namespaces),
        pods=list_all(core.list_pod_for_all_namespaces, field_selector="status.phase=Pending"),
        quotas=list_all(core.list_resource_quota_for_all_namespaces),
        classes=list_all(res.list_device_class),
        nodes=list_all(core.list_node),
    )


def read_usage(
    api: k8s.ApiClient, nodes: Iterable[str] | None, selector: str = PLUGIN_SELECTOR
) -> tuple[dict[tuple[str, str], ClaimUse], dict[str, str]]:
    """Read the plugins of ``nodes`` (None: every node) through the pod proxy.

    Returns:
        the usage of every claim the plugins reported, and node -> why its plugin could not
        be read (no Running plugin pod, metrics off, the proxy refused or timed out).

    Raises:
        kubernetes.client.exceptions.ApiException: the plugin pods cannot be listed.
    """
    core = k8s.CoreV1Api(api)
    wanted = None if nodes is None else set(nodes)
    by_node: dict[str, Json] = {}
    for pod in list_all(core.list_pod_for_all_namespaces, label_selector=selector):
        node = (pod.get("spec") or {}).get("nodeName")
        running = (pod.get("status") or {}).get("phase") == "Running"
        if node and running and (wanted is None or node in wanted):
            by_node[node] = pod
    problems = {n: "no Running kubelet plugin pod" for n in (wanted or set()) - by_node.keys()}
    usage: dict[tuple[str, str], ClaimUse] = {}
    with ThreadPoolExecutor(max_workers=READERS) as pool:
        results = pool.map(lambda pod: _read_one(core, pod), by_node.values())
        for node, (got, problem) in zip(by_node, results, strict=True):
            usage.update(got)
            if problem:
                problems[node] = problem
    return usage, problems


def _read_one(
    core: k8s.CoreV1Api, pod: Json
) -> tuple[Mapping[tuple[str, str], ClaimUse], str | None]:
    meta = pod["metadata"]
    port = metrics_port(pod)
    if port is None:
        return {}, f"plugin pod {meta['namespace']}/{meta['name']} serves no metrics port"
    try:
        resp = core.connect_get_namespaced_pod_proxy_with_path(
            f"{meta['name']}:{port}",
            meta["namespace"],
            "metrics",
            _preload_content=False,
            _request_timeout=PROXY_TIMEOUT_S,
        )
        text: bytes = resp.data  # type: ignore[attr-defined]  # _preload_content=False
        return parse_metrics(text.decode()), None
    except k8s.exceptions.ApiException as exc:
        why = f"{exc.status} {exc.reason}"
    except Exception as exc:  # timeouts, resets, not the Prometheus text format
        why = " ".join(str(exc).split())[:200]
    return {}, f"metrics of {meta['namespace']}/{meta['name']} through the pod proxy: {why}"
