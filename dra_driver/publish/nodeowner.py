"""The Node that owns this plugin's ResourceSlices: its UID, read once and again only when the
slices may have lost their owner (:class:`NodeOwner`)."""

from __future__ import annotations

import threading

from urllib3.exceptions import HTTPError

from dra_driver.infra.rawapi import ApiClient, ApiException, json_request
from dra_driver.publish.publisher import PublishError


def node_owner_uid(api: ApiClient, node_name: str) -> str:
    """The Node's UID: every slice gets it as owner, so the slices go away with the Node.

    Raises:
        PublishError: the Node does not exist or cannot be read; nothing is published until
            it can be (a slice without an owner would outlive a mistyped ``--node-name`` and
            show a node that does not exist).
    """
    try:
        node = json_request(api, "GET", f"/api/v1/nodes/{node_name}", timeout=10)
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
    uid = (node.get("metadata") or {}).get("uid") if isinstance(node, dict) else None
    if not uid:
        raise PublishError(f"Node {node_name!r} has no UID: not publishing ResourceSlices")
    return str(uid)


class NodeOwner:
    """The Node's UID for the slices' owner reference, read at the first round and cached.

    A re-registered Node (deleted and created again) has a new UID; the garbage collector then
    deletes the slices owned by the old one, which the slice watch sees as someone else's
    DELETED: :meth:`forget` is called then, so the next round reads
    the Node again and writes the slices with the new owner. An idle node reads its Node once.

    Args:
        api: the API client.
        node_name: the Node's name.
    """

    def __init__(self, api: ApiClient, node_name: str) -> None:
        self._api = api
        self._node = node_name
        self._uid: str | None = None
        self._lock = threading.Lock()

    def uid(self) -> str:
        """The Node's UID (cached; read when not known).

        Raises:
            PublishError: as :func:`node_owner_uid`.
        """
        with self._lock:
            if self._uid is None:
                self._uid = node_owner_uid(self._api, self._node)
            return self._uid

    def forget(self) -> None:
        """Read the UID again at the next :meth:`uid`."""
        with self._lock:
            self._uid = None
