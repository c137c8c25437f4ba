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
    read_reply,
)


def test_requests_and_replies_round_trip() -> None:
    for request in (Request(quit=True), Request(args=("server", "list", "--format=csv"))):
        assert decode_request(encode_request(request).rstrip(b"\n")) == request
    for done in (Completed(1, "a,b\n", "no ✓"), Completed(0), Completed(-3, "\n\n", "x\ny")):
        assert decode_reply(encode_reply(done)) == done


def test_a_reply_is_a_header_and_the_bytes_it_counts() -> None:
    assert encode_reply(Completed(2, "é\n", "no")) == b"2 3 2\n\xc3\xa9\nno"


@pytest.mark.parametrize(
    "line",
    [b"{not json", b"[1]", b'{"args": "server list"}', b'{"args": [1]}', b"{}", b"[" * 100000],
)
def test_malformed_requests_are_wire_errors(line: bytes) -> None:
    with pytest.raises(WireError):
        decode_request(line)


def test_malformed_replies_are_wire_errors() -> None:
    for data in (
        b"",
        b'{"rc": 0, "stdout": "", "stderr": ""}\n',
        b"0 1 1",
        b"0 1\nab",
        b"0 1 1\nabc",
        b"0 1 1\na",
        b"0 -1 2\nab",
        b"x 0 0\n",
    ):
        with pytest.raises(WireError):
            decode_reply(data)


def test_read_reply_reads_what_the_header_gives_bounded_and_timed() -> None:
    a, b = socket.socketpair()
    with a, b:
        # the bytes the header gives, then nothing more is read (a busy daemon resets after)
        a.sendall(b"3 2 1\nokx")
        assert read_reply(b, 1) == Completed(3, "ok", "x")
        a.sendall(b"0 0 0\n")
        assert read_reply(b, 1) == Completed(0)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"x" * 200)
        with pytest.raises(WireError, match="header longer than"):
            read_reply(b, 1)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"0 %d 0\n" % (9 << 20))
        with pytest.raises(WireError, match="reply longer than"):
            read_reply(b, 1)
    a, b = socket.socketpair()
    with a, b:
        with pytest.raises(WireError, match="no complete reply"):
            read_reply(b, 0.05)
        a.sendall(b"0 5 0\nab")
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(WireError, match="bytes after its header"):
            read_reply(b, 1)


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
