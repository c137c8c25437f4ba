"""Requests that do not decode: refused with ``INVALID_ARGUMENT``, without leaking the call.

grpcio's synchronous server (measured with 1.85.1) leaks every call whose request its
deserializer rejects, about 19 KiB each: ``_server._receive_message`` answers ``INTERNAL``
("Exception deserializing request!") and sends the status, then the thread waiting in
``_unary_request`` sees the client's half-close without a request and aborts the call a second
time ("requires exactly one request message"). That second status batch is refused by the
core and never completes, so its token stays due and the call state is never released. Server
options do not help (``grpc.max_receive_message_length``, ``grpc.max_connection_age_ms`` and
``maximum_concurrent_rpcs`` leave it as it is; ``grpc.max_concurrent_streams`` only makes the
connection refuse new calls once the leaked ones fill it). ``benchmarks/bench_garbage_memory.py``
measures it against a plain grpcio server.

:class:`DecodeInHandler` avoids that path: every unary-request method gets a deserializer that
never fails (it hands an :class:`Undecodable` to the handler instead) and a handler that
refuses that value with ``INVALID_ARGUMENT`` naming the expected message, through grpcio's
ordinary abort, which completes and frees the call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

_Deserializer = Callable[[bytes], Any]
_Behavior = Callable[[Any, grpc.ServicerContext], Any]
ERROR_CHARS = 200
"""Characters of the decoder's error kept in the status message."""

if TYPE_CHECKING:
    _Interceptor = grpc.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.ServerInterceptor


@dataclass(frozen=True)
class Undecodable:
    """A request body that does not decode as the method's message."""

    method: str
    error: str


def _safe(method: str, deserialize: _Deserializer) -> _Deserializer:
    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # whatever the message class raises for bad bytes
            return Undecodable(method, str(exc))

    return decode


def _refusing(behavior: _Behavior) -> _Behavior:
    def handle(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{request.method}: the request does not decode: {request.error[:ERROR_CHARS]}",
            )
        return behavior(request, context)

    return handle


class DecodeInHandler(_Interceptor):
    """Server interceptor: undecodable unary requests reach our handler as
    :class:`Undecodable` and are refused there (see the module docstring for why)."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """The method's handler, wrapped when it takes one request message."""
        handler = continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary
        if behavior is None:
            return handler
        make = (
            grpc.unary_stream_rpc_method_handler
            if handler.response_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        return make(
            _refusing(behavior),
            request_deserializer=_safe(handler_call_details.method, handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )
