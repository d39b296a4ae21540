"""The client's HTTP/1.1 pool against real servers: keep-alive reuse, the connection cap, a
server that closes, a refused port and a cancelled request."""

from __future__ import annotations

import asyncio
import http.server
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from benchmarks.scaling.straggler import StragglerProxy
from redline.scaling.http1 import ConnectError, ConnectionPool
from tests.conftest import free_port
from tests.scaling.procs import Serve

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

BODY = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                 "data": [1, 2, 3, 4]}]})
PATH = "/v2/models/affine/infer"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    s = Serve(tmp_path_factory.mktemp("http1"), "--workers", "1").wait_ready()
    try:
        yield s
    finally:
        s.kill()


def test_keep_alive_reuses_one_connection_and_the_cap_holds(server: Serve) -> None:
    async def go() -> tuple[int, int, list[int]]:
        pool = ConnectionPool.for_address(server.url)
        for _ in range(100):
            status, body = await pool.request(PATH, BODY)
            assert status == 200 and orjson.loads(body)["outputs"][1]["data"] == [10.0]
        sequential = pool.opened
        capped = ConnectionPool.for_address(server.url, max_connections=3)
        answers = await asyncio.gather(*(capped.request(PATH, BODY) for _ in range(60)))
        await pool.close()
        await capped.close()
        return sequential, capped.opened, [status for status, _ in answers]

    sequential, opened, statuses = asyncio.run(go())
    assert sequential == 1
    assert opened <= 3 and statuses == [200] * 60


class _CloseHandler(http.server.BaseHTTPRequestHandler):
    """HTTP/1.0: the server closes every connection after its answer."""

    def do_POST(self) -> None:  # noqa: N802 - the http.server naming
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


def test_a_connection_the_server_closes_is_not_reused() -> None:
    closing = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CloseHandler)
    threading.Thread(target=closing.serve_forever, daemon=True).start()

    async def go() -> int:
        pool = ConnectionPool("127.0.0.1", closing.server_address[1])
        for _ in range(5):
            assert await pool.request("/", b"{}") == (200, b"{}")
            await asyncio.sleep(0.01)
        await pool.close()
        return pool.opened

    try:
        assert asyncio.run(go()) == 5
    finally:
        closing.shutdown()
        closing.server_close()


def test_refused_is_a_connect_error_and_a_cancel_closes_the_connection(server: Serve) -> None:
    async def go() -> int:
        with pytest.raises(ConnectError):
            await ConnectionPool("127.0.0.1", free_port()).request(PATH, BODY)
        pool = ConnectionPool.for_address(server.url)
        await pool.request(PATH, BODY)
        request = asyncio.ensure_future(pool.request(PATH, BODY))
        await asyncio.sleep(0)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        status, _ = await pool.request(PATH, BODY)  # a new connection, not the half-read one
        assert status == 200
        await pool.close()
        return pool.opened

    assert asyncio.run(go()) == 2


def test_https_with_a_verified_certificate(tmp_path: Path) -> None:
    """An https:// endpoint speaks TLS and checks the server's certificate: trusted, it
    answers; untrusted, the request never left (a connect error, so it may go elsewhere)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CloseHandler)
    side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    side.load_cert_chain(cert, key)
    server.socket = side.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"https://127.0.0.1:{server.server_address[1]}"

    async def go() -> None:
        trusted = ssl.create_default_context(cafile=str(cert))
        pool = ConnectionPool.for_address(address, tls=trusted)
        assert (pool.host, pool.tls) == ("127.0.0.1", trusted)
        assert await pool.request("/", b"{}") == (200, b"{}")
        with pytest.raises(ConnectError):  # the system's trust store does not know it
            await ConnectionPool.for_address(address).request("/", b"{}")

    try:
        asyncio.run(go())
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ValueError, match="http:// or https://"):
        ConnectionPool.for_address("ftp://example:21")


def test_a_closed_pool_serves_on_with_new_connections(server: Serve) -> None:
    """close() frees the idle connections' places under the cap: a client closed and used
    again (as ``AsyncClient`` may be) opens new ones instead of waiting forever."""
    async def go() -> int:
        pool = ConnectionPool.for_address(server.url, max_connections=1)
        for _ in range(3):
            assert (await pool.request(PATH, BODY))[0] == 200
            await pool.close()
        return pool.opened

    assert asyncio.run(asyncio.wait_for(go(), 20)) == 3


def test_a_timed_out_request_leaves_its_connection_to_the_late_answer(
        server: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every answer comes 300 ms late: a request with 50 ms fails with TimeoutError at once,
    its connection reads the late answer and serves the next request (no reconnect). A
    server that never answers has such a connection closed after LATE_ANSWER_WAIT_S."""
    import socket

    from redline.scaling import http1

    monkeypatch.setattr(http1, "LATE_ANSWER_WAIT_S", 0.3)
    slow = StragglerProxy(server.http_port, share=1.0, delay_s=0.3).start()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)

    async def go() -> tuple[int, int]:
        pool = ConnectionPool("127.0.0.1", slow.port)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            await pool.request(PATH, BODY, timeout_s=0.05)
        assert loop.time() - start < 0.25
        await asyncio.sleep(0.5)  # the late answer arrives and is dropped
        status, _ = await pool.request(PATH, BODY, timeout_s=2.0)
        assert status == 200
        mute = ConnectionPool("127.0.0.1", silent.getsockname()[1], max_connections=1)
        with pytest.raises(TimeoutError):
            await mute.request(PATH, BODY, timeout_s=0.05)
        await asyncio.sleep(0.5)  # given up on: its place under the cap is free again
        with pytest.raises(TimeoutError):
            await mute.request(PATH, BODY, timeout_s=0.05)
        await pool.close()  # before the proxy stops: it would cancel a connection still open
        await mute.close()
        await asyncio.sleep(0.1)
        return pool.opened, mute.opened

    try:
        assert asyncio.run(go()) == (1, 2)
    finally:
        slow.stop()
        silent.close()
