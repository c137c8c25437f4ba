"""The Node's UID for the slices' owner: read through the official client's connection (no
generated CoreV1Api), cached, read again after :meth:`NodeOwner.forget`; a missing or unreadable
Node is a PublishError naming what to do."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.publish.nodeowner import NodeOwner
from dra_driver.publish.publisher import PublishError
from tests.support.apiserver_stub import ApiStub, StubError


class NodeServer(ApiStub):
    """Serves ``GET /api/v1/nodes/<name>`` from ``uids``; counts the GETs."""

    def __init__(self) -> None:
        super().__init__()
        self.uids: dict[str, str] = {}
        self.gets = 0
        self.fail: StubError | None = None

    def handle(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        name = path.removeprefix("/api/v1/nodes/")
        if method != "GET" or name == path:
            raise StubError(405, "MethodNotAllowed")
        self.gets += 1
        if self.fail is not None:
            raise self.fail
        if name not in self.uids:
            raise StubError(404, "NotFound")
        return 200, {"kind": "Node", "metadata": {"name": name, "uid": self.uids[name]}}


def test_read_once_then_again_after_forget() -> None:
    with NodeServer() as server:
        server.uids["node-a"] = "uid-1"
        owner = NodeOwner(server.api_client(), "node-a")
        assert [owner.uid() for _ in range(5)] == ["uid-1"] * 5
        assert server.gets == 1
        server.uids["node-a"] = "uid-2"  # the Node re-registered
        owner.forget()
        assert owner.uid() == "uid-2" and server.gets == 2


def test_missing_or_unreadable_node_is_a_publish_error_read_again_next_time() -> None:
    with NodeServer() as server:
        owner = NodeOwner(server.api_client(), "node-a")
        with pytest.raises(PublishError, match="'node-a' does not exist.*--node-name"):
            owner.uid()
        server.fail = StubError(403, "Forbidden")
        with pytest.raises(PublishError, match=r"cannot be read \(403 Forbidden\).*get on nodes"):
            owner.uid()
        server.fail = None
        server.uids["node-a"] = "uid-1"
        assert owner.uid() == "uid-1" and server.gets == 3
