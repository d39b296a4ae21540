"""The HTTP protocol's inline lane (serving/http_protocol.py), through real sockets.

V2 infer requests with a small Content-Length body are answered from the parser's callback;
everything else takes uvicorn's ASGI path. These tests send the same requests both ways (a
query string sends a request down the ASGI path, which ignores it) and compare the bytes, and
drive the cases the lane must hand back or get right: pipelining behind a queued request,
keep-alive and ``Connection: close``, HTTP/1.0, ``Expect: 100-continue``, a body split across
segments, large and chunked bodies, a client that leaves mid-body.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest

from tests.serving.helpers import ServerThread

AFFINE = "/v2/models/affine/infer"


def request(path: str, body: bytes, *headers: str, version: str = "1.1") -> bytes:
    head = [f"POST {path} HTTP/{version}", "Host: x", "Content-Type: application/json",
            f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Conn:
    """One raw keep-alive connection that reads whole responses (Content-Length framed)."""

    def __init__(self, served: ServerThread) -> None:
        self.sock = socket.create_connection(("127.0.0.1", served.server.http_port), timeout=20)
        self.buf = b""

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        length = int(headers["content-length"])
        while len(self.buf) < length:
            self._more()
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, headers, body

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        self.buf += chunk

    def closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except OSError:
            return True

    def close(self) -> None:
        self.sock.close()


def call(served: ServerThread, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    conn = Conn(served)
    try:
        conn.sock.sendall(raw)
        return conn.response()
    finally:
        conn.close()


def affine_body(rows: int = 1, **extra: object) -> bytes:
    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    return orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 4],
                                     "data": x.ravel().tolist()}], **extra})


def binary_body() -> tuple[bytes, int]:
    x = np.ones((2, 4), np.float32)
    head = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4],
                                     "parameters": {"binary_data_size": x.nbytes}}]})
    return head + x.tobytes(), len(head)


BIN, BIN_LEN = binary_body()
CASES = {
    "fast path": (AFFINE, affine_body(), ()),
    "fast path with an id": (AFFINE, affine_body(3, id="r-1"), ()),
    "general path (parameters)": (AFFINE, affine_body(2, parameters={"a": 1}), ()),
    "version path": ("/v2/models/affine/versions/1/infer", affine_body(), ()),
    "binary extension": (AFFINE, BIN, (f"Inference-Header-Content-Length: {BIN_LEN}",)),
    "invalid JSON": (AFFINE, b"{not json", ()),
    "wrong input name": (AFFINE, orjson.dumps({"inputs": [{"name": "q", "datatype": "FP32",
                                                           "shape": [1, 4],
                                                           "data": [1, 2, 3, 4]}]}), ()),
    "unknown model": ("/v2/models/nope/infer", affine_body(), ()),
    "unknown version": ("/v2/models/affine/versions/9/infer", affine_body(), ()),
    "bad route": ("/v2/models/affine/x/y/infer", affine_body(), ()),
    "bad budget": (AFFINE, affine_body(), ("x-redline-budget-ms: -5",)),
    "bad priority": (AFFINE, affine_body(), ("x-redline-priority: urgent",)),
    "budget and priority": (AFFINE, affine_body(), ("x-redline-budget-ms: 500",
                                                    "x-redline-priority: high")),
    "slow model (queued)": ("/v2/models/slow/infer", orjson.dumps({"inputs": [{
        "name": "x", "datatype": "FP32", "shape": [1, 384], "data": [0.5] * 384}]}), ()),
}


@pytest.fixture
def lane_calls(served: ServerThread) -> Iterator[list[str]]:
    """Paths the inline lane was asked to answer (connections made from now on)."""
    app = served.server.app
    calls: list[str] = []
    inner = app.infer_inline

    def counted(path: str, *args: Any) -> Any:
        calls.append(path)
        return inner(path, *args)

    app.infer_inline = counted  # type: ignore[method-assign]
    yield calls
    del app.infer_inline


@pytest.mark.parametrize("case", list(CASES))
def test_inline_answers_what_the_asgi_path_answers(served: ServerThread, case: str,
                                                   lane_calls: list[str]) -> None:
    path, body, headers = CASES[case]
    inline = call(served, request(path, body, *headers))
    assert lane_calls == [path]
    asgi = call(served, request(path + "?via=asgi", body, *headers))
    assert lane_calls == [path]  # the query string kept it off the lane
    for answer in (inline, asgi):
        answer[1].pop("date", None)
    assert inline == asgi, case
    if case.startswith(("fast", "general", "version", "binary", "budget", "slow")):
        assert inline[0] == 200, inline
    else:
        assert 400 <= inline[0] < 500 and orjson.loads(inline[2])["error"], inline


def test_pipelined_requests_keep_their_order_behind_a_queued_one(served: ServerThread) -> None:
    """The slow model cannot run inline: its request queues (an ASGI cycle), and the inline
    requests pipelined behind it wait their turn and are answered after it, in order."""
    slow = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 384],
                                     "data": [0.25] * 384}]})
    conn = Conn(served)
    try:
        conn.sock.sendall(request(AFFINE, affine_body(1, id="a"))
                          + request("/v2/models/slow/infer", slow)
                          + request(AFFINE, affine_body(2, id="b"))
                          + request("/v2", b"")
                          + request(AFFINE, affine_body(3, id="c")))
        answers = [conn.response() for _ in range(5)]
    finally:
        conn.close()
    assert [a[0] for a in answers] == [200, 200, 200, 405, 200]
    assert orjson.loads(answers[0][2])["id"] == "a"
    assert orjson.loads(answers[1][2])["outputs"][0]["data"][0] == 0.25
    assert orjson.loads(answers[2][2])["id"] == "b"
    assert orjson.loads(answers[4][2])["id"] == "c"


def test_keep_alive_and_connection_close(served: ServerThread) -> None:
    conn = Conn(served)
    try:
        for i in range(50):
            conn.sock.sendall(request(AFFINE, affine_body(1, id=str(i))))
            status, headers, body = conn.response()
            assert status == 200 and orjson.loads(body)["id"] == str(i)
            assert "connection" not in headers
        conn.sock.sendall(request(AFFINE, affine_body(), "Connection: close"))
        status, headers, _ = conn.response()
        assert status == 200 and headers["connection"] == "close"
        assert conn.closed()
    finally:
        conn.close()


def test_http_1_0_closes_after_the_answer(served: ServerThread) -> None:
    conn = Conn(served)
    try:
        conn.sock.sendall(request(AFFINE, affine_body(), version="1.0"))
        status, headers, _ = conn.response()
        assert status == 200 and headers["connection"] == "close"
        assert conn.closed()
    finally:
        conn.close()


def test_expect_100_continue_takes_the_asgi_path(served: ServerThread) -> None:
    body = affine_body()
    conn = Conn(served)
    try:
        conn.sock.sendall(request(AFFINE, b"", "Expect: 100-continue").replace(
            b"Content-Length: 0", f"Content-Length: {len(body)}".encode()))
        while b"\r\n\r\n" not in conn.buf:
            conn._more()
        interim, _, conn.buf = conn.buf.partition(b"\r\n\r\n")
        assert interim.startswith(b"HTTP/1.1 100")
        conn.sock.sendall(body)
        status, _, answer = conn.response()
        assert status == 200 and orjson.loads(answer)["outputs"][0]["data"] == [0, 2, 4, 6]
    finally:
        conn.close()


def test_a_body_split_across_segments(served: ServerThread) -> None:
    raw = request(AFFINE, affine_body(2, id="split"))
    cut = raw.index(b"\r\n\r\n") + 10
    conn = Conn(served)
    try:
        for piece in (raw[:20], raw[20:cut], raw[cut:]):
            conn.sock.sendall(piece)
            time.sleep(0.05)
        status, _, body = conn.response()
        assert status == 200 and orjson.loads(body)["id"] == "split"
    finally:
        conn.close()


def test_large_and_chunked_bodies_take_the_asgi_path(served: ServerThread,
                                                     lane_calls: list[str]) -> None:
    big = affine_body(3000, id="big")  # over the inline lane's 64 KiB
    assert len(big) > 65536
    status, _, body = call(served, request(AFFINE, big))
    assert status == 200 and orjson.loads(body)["outputs"][0]["shape"] == [3000, 4]
    small = affine_body(1, id="chunked")
    raw = (f"POST {AFFINE} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
           f"{len(small):x}\r\n").encode() + small + b"\r\n0\r\n\r\n"
    status, _, body = call(served, raw)
    assert status == 200 and orjson.loads(body)["id"] == "chunked"
    assert lane_calls == []


def test_a_client_leaving_mid_body_leaves_the_server_serving(served: ServerThread) -> None:
    raw = request(AFFINE, affine_body(50))
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", served.server.http_port), timeout=10)
        sock.sendall(raw[: len(raw) - 40])
        sock.close()
    status, _, _ = call(served, request(AFFINE, affine_body()))
    assert status == 200
