"""``dra-driver occupancy``'s one trip to the API server: read the cluster, build the report,
and with a plugin selector add each claim's memory use from the plugins' metrics; every way the
API can fail becomes one :class:`OccupancyError` line that says what to do."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from urllib3.exceptions import HTTPError

from dra_driver.cluster.occupancy import Report
from dra_driver.cluster.occupancyread import api_client, config_source, read_cluster, read_usage
from dra_driver.cluster.occupancyusage import ClaimUse
from dra_driver.cluster.occupancywait import build_report
from dra_driver.infra.rawapi import ApiException
from dra_driver.model.errors import StartupError

LIST_RIGHTS = (
    "occupancy needs list on resourceslices, resourceclaims, resourceclaimtemplates, "
    "deviceclasses, pods, resourcequotas and nodes"
)


class OccupancyError(StartupError):
    """The cluster cannot be read: no usable configuration, a refused list, no answer."""


def occupancy_report(
    kubeconfig: str | None, driver: str, node: str | None, plugin_selector: str | None = None
) -> Report:
    """The occupancy report of ``driver``'s GPUs (of ``node`` only, when given). With
    ``plugin_selector``, the claims' usage is read from those plugin pods' metrics (a plugin
    that cannot be read is named in the report, it fails nothing).

    Raises:
        OccupancyError: an unusable kubeconfig (or none, outside a pod), a refused list call
            (which rights are needed), or an API server that does not answer.
    """
    from dra_driver.infra.kubeconfig import KubeconfigError

    try:
        source = config_source(kubeconfig, os.environ, Path.home())
        server = "the API server"
        with api_client(source) as api:
            server = f"the API server {api.configuration.host} (from {source.label})"
            report = build_report(read_cluster(api, driver), driver, node)
            usage: dict[tuple[str, str], ClaimUse] | None = None
            problems: dict[str, str] = {}
            held = sorted({g.node for g in report.gpus if g.holders})
            if plugin_selector is not None and held:
                try:
                    usage, problems = read_usage(api, held, plugin_selector)
                except ApiException as exc:
                    why = f"cannot list the plugin pods: {exc.status} {exc.reason}"
                    usage, problems = {}, {n: why for n in held}
    except KubeconfigError as exc:
        raise OccupancyError(" ".join(str(exc).split())) from exc
    except ApiException as exc:
        raise OccupancyError(
            f"{server} refused a list call: {exc.status} {exc.reason}; {LIST_RIGHTS}"
        ) from exc
    except (HTTPError, OSError) as exc:
        message = " ".join(str(exc).split())
        raise OccupancyError(
            f"cannot read {server}: {message}; check that this is the cluster you mean and "
            "that its API server runs"
        ) from exc
    return replace(report, usage=usage, usage_problems=problems)
