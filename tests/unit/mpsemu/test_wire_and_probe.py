"""The emulator's control-socket lines and the tenant probe's line format (no processes)."""

from __future__ import annotations

import socket

import pytest

from dra_driver.model.commands import Completed
from dra_driver.mpsemu import probe
from dra_driver.mpsemu.wire import (
    Request,
    WireError,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
    read_line,
)


def test_requests_and_replies_round_trip() -> None:
    for request in (Request(quit=True), Request(args=("server", "list", "--format=csv"))):
        assert decode_request(encode_request(request).rstrip(b"\n")) == request
    done = Completed(1, "a,b\n", "no ✓")
    assert decode_reply(encode_reply(done).rstrip(b"\n")) == done


@pytest.mark.parametrize(
    "line",
    [b"{not json", b"[1]", b'{"args": "server list"}', b'{"args": [1]}', b"{}", b"[" * 100000],
)
def test_malformed_requests_are_wire_errors(line: bytes) -> None:
    with pytest.raises(WireError):
        decode_request(line)


def test_malformed_replies_are_wire_errors() -> None:
    for line in (b"", b'{"rc": "0"}', b'{"rc": 0, "stdout": 5}'):
        with pytest.raises(WireError):
            decode_reply(line)


def test_read_line_is_bounded_and_timed() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"hello\nrest")
        assert read_line(b, 100, 1) == b"hello"
        a.sendall(b"x" * 200)
        with pytest.raises(WireError, match="longer than 100"):
            read_line(b, 100, 1)
    a, b = socket.socketpair()
    with a, b:
        with pytest.raises(WireError, match="no complete line"):
            read_line(b, 100, 0.05)
        a.sendall(b"cut")
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(WireError, match="closed"):
            read_line(b, 100, 1)


def test_probe_lines_parse_back(capsys: pytest.CaptureFixture[str]) -> None:
    probe.report("terminated", server="gpu_0", server_pid="12", reason="client 7 terminated")
    line = capsys.readouterr().out
    assert line.startswith("tenant-probe: t=") and line.rstrip().endswith("state=terminated")
    fields = probe.parse_line(line)
    assert fields["reason"] == "client 7 terminated" and fields["server_pid"] == "12"
    assert probe.parse_line("something else") == {}
