"""kubelet: the kubelet-facing gRPC services (registration, DRA v1/v1beta1, resource
health) over unix sockets.
May import: model, infra, prepare, and the generated _proto."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dra_driver.faces import lazy_face

if TYPE_CHECKING:
    from dra_driver.kubelet.server import PluginServer, SocketPaths

__all__ = [
    "PluginServer",
    "SocketPaths",
]

__getattr__ = lazy_face(__name__, __file__)
