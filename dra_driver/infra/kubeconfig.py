"""Kubernetes API clients from a kubeconfig file or the pod's service account, with errors
that name the file and say what to do."""

from __future__ import annotations

import copy
from importlib import metadata
from pathlib import Path

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config import ConfigException

from dra_driver.model.errors import StartupError

KUBECONFIG_HINT = (
    "pass --kubeconfig (or KUBECONFIG) a valid kubeconfig file, or neither inside a pod to use "
    "its service account"
)


def kubeconfig_problem(path: Path, exc: Exception) -> str:
    """What is wrong with the kubeconfig file ``path`` that failed to load with ``exc``, in
    one line (the client's own messages do not always name the file)."""
    if not path.exists():
        return "no such file"
    if path.is_file() and path.stat().st_size == 0:
        return "the file is empty"
    if isinstance(exc, yaml.YAMLError):
        return f"not YAML ({str(exc).splitlines()[0]})"
    if isinstance(exc, TypeError | AttributeError):
        return "not a kubeconfig (expected a mapping with clusters, contexts and users)"
    return " ".join(str(exc).split())


class KubeconfigError(StartupError):
    """No usable API configuration: the message names the file (or the pod's service account),
    the problem and what to do, in one line."""


def load_kubeconfig(path: Path, cfg: k8s.Configuration) -> None:
    """Load the kubeconfig file ``path`` into ``cfg``.

    Raises:
        KubeconfigError: the file is missing, unreadable, empty, not YAML or not a usable
            kubeconfig; one line naming ``path``, the problem and what to do.
    """
    try:
        k8s_config.load_kube_config(config_file=str(path), client_configuration=cfg)
    except (ConfigException, yaml.YAMLError, TypeError, AttributeError, OSError) as exc:
        problem = kubeconfig_problem(path, exc)
        raise KubeconfigError(f"kubeconfig {path}: {problem}; {KUBECONFIG_HINT}") from exc


def user_agent(component: str) -> str:
    """``dra-driver/<version> (<component>)``: the User-Agent of the driver's API requests, so
    that an API server's audit log and request metrics tell them apart (the official client
    would send ``OpenAPI-Generator/<client version>/python``)."""
    try:
        version = metadata.version("dra-driver")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return f"dra-driver/{version} ({component})"


def api_client(kubeconfig: str | None, connections: int, component: str) -> k8s.ApiClient:
    """An API client from ``kubeconfig``, or in-cluster config when None, whose connection
    pool holds ``connections`` connections (the plugin: one per claim-reader thread,
    :data:`dra_driver.prepare.reads.CLAIM_READERS`; with urllib3's default of 10, every
    batch of reads opened and discarded the rest) and whose requests carry
    :func:`user_agent` of ``component``.

    Raises:
        KubeconfigError: ``kubeconfig`` is unusable or, without one, this is not a pod.
    """
    cfg = k8s.Configuration()
    if kubeconfig:
        load_kubeconfig(Path(kubeconfig), cfg)
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)
        except ConfigException as exc:
            raise KubeconfigError(f"no in-cluster configuration: {exc}; {KUBECONFIG_HINT}") from exc
    cfg.connection_pool_maxsize = connections
    client = k8s.ApiClient(cfg)
    client.user_agent = user_agent(component)
    return client


def single_try(api: k8s.ApiClient) -> k8s.ApiClient:
    """A client with ``api``'s configuration (its own copy) whose calls are tried once: urllib3
    retries off, for callers that bound their time and retry themselves; same User-Agent."""
    config = copy.deepcopy(api.configuration)
    config.retries = False
    config.client_go_retries = False
    client = k8s.ApiClient(config)
    client.user_agent = api.user_agent
    return client
