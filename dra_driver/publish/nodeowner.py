"""The Node that owns this plugin's ResourceSlices: its UID, read before every publishing round
(a re-registered Node has a new UID, and slices owned by the old one would be garbage-collected
as soon as they are written)."""

from __future__ import annotations

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from dra_driver.publish.publisher import PublishError


def node_owner_uid(api: k8s.ApiClient, node_name: str) -> str:
    """The Node's UID: every slice gets it as owner, so the slices go away with the Node.

    Raises:
        PublishError: the Node does not exist or cannot be read; nothing is published until
            it can be (a slice without an owner would outlive a mistyped ``--node-name`` and
            show a node that does not exist).
    """
    try:
        node = k8s.CoreV1Api(api).read_node(node_name, _request_timeout=10)
    except ApiException as exc:
        if exc.status == 404:
            raise PublishError(
                f"Node {node_name!r} does not exist: not publishing ResourceSlices until it "
                "does; is --node-name (NODE_NAME) the name this node's kubelet registered?"
            ) from exc
        raise PublishError(
            f"Node {node_name!r} cannot be read ({exc.status} {exc.reason}): not publishing "
            "ResourceSlices until it can (they need the Node as their owner; the plugin's "
            "ClusterRole grants get on nodes)"
        ) from exc
    except (HTTPError, OSError) as exc:
        raise PublishError(
            f"Node {node_name!r} cannot be read ({' '.join(str(exc).split())}): not publishing "
            "ResourceSlices until it can"
        ) from exc
    uid = node.metadata.uid if node.metadata else None
    if not uid:
        raise PublishError(f"Node {node_name!r} has no UID: not publishing ResourceSlices")
    return str(uid)
