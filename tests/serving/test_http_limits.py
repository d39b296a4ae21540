"""Limits on what one client may hold of the HTTP edge, and of gRPC, through real sockets.

A hostile client sends a huge header, many headers, its bytes one at a time, or more
connections than the server allows; it gets a JSON error that names the setting (431, 408,
503) and its connection closes, while an honest client on its own connection keeps getting
answers. gRPC refuses an oversized message or metadata with RESOURCE_EXHAUSTED and serves on.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import orjson
import pytest

from redline.config import Settings
from redline.models import ModelRepository
from redline.proto import grpc_service_pb2 as pb
from redline.proto import grpc_service_pb2_grpc as pbg
from tests.conftest import free_port
from tests.serving.helpers import ServerThread, affine_model

AFFINE = "/v2/models/affine/infer"
BODY = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                 "data": [1, 2, 3, 4]}]})
TIMEOUT_S = 1.0  # header_timeout_s and body_timeout_s of the server under test
MAX_CONNECTIONS = 64
MAX_BODY = 256 * 1024
METADATA = 4096


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    repo = ModelRepository(tmp_path_factory.mktemp("repo"))
    repo.add_onnx("affine", affine_model())
    settings = Settings()
    server = settings.server
    server.watch_repository = False
    server.max_body_bytes = MAX_BODY
    server.header_timeout_s = TIMEOUT_S
    server.body_timeout_s = TIMEOUT_S
    server.max_connections = MAX_CONNECTIONS
    server.grpc_max_metadata_bytes = METADATA
    settings.runtime.warmup_batch_sizes = [1]
    settings.runtime.warmup_runs = 1
    served = ServerThread(settings, repo).start()
    yield served
    served.stop()


def head(path: str = AFFINE, *extra: str, length: int = len(BODY)) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json",
             f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def connect(served: ServerThread, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", served.server.http_port), timeout=timeout)


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One whole answer (Content-Length framed), then whether the server closed after it."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before an answer: {buf!r}")
        buf += chunk
    top, _, body = buf.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except OSError:
        return True


def refused(answer: tuple[int, dict[str, str], bytes], status: int, setting: str) -> str:
    code, headers, body = answer
    assert code == status, answer
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    doc = orjson.loads(body)
    assert setting in doc["error"], doc
    return str(doc["code"])


class Honest:
    """One keep-alive client asking for inferences in a loop on its own thread."""

    def __init__(self, served: ServerThread) -> None:
        self.client = httpx.Client(base_url=served.http, timeout=30)
        assert self.client.post(AFFINE, content=BODY).status_code == 200  # connected now
        self.statuses: list[int] = []
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Honest:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.perf_counter()
            self.statuses.append(self.client.post(AFFINE, content=BODY).status_code)
            self.latencies.append(time.perf_counter() - start)
            time.sleep(0.005)

    def check(self) -> None:
        assert self.statuses and set(self.statuses) == {200}, set(self.statuses)
        print(f"honest client: {len(self.statuses)} answers, worst "
              f"{max(self.latencies) * 1000:.1f} ms")


def test_a_64_mib_header_is_cut_off_while_others_are_served(limited: ServerThread) -> None:
    """The header is refused after its first 64 KiB, not parsed whole on the event loop."""
    sock = connect(limited)
    sent = 0
    with Honest(limited) as honest:
        sock.sendall(head().rstrip(b"\r\n") + b"\r\nX-Big: ")
        chunk = b"a" * (1 << 20)
        try:
            for _ in range(64):
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # the server stopped reading, then closed: the rest never left
        time.sleep(0.2)
    sock.close()
    honest.check()
    assert sent < 32 << 20, f"the server read {sent} bytes of one header"


def test_a_head_over_max_header_bytes_is_431(limited: ServerThread) -> None:
    sock = connect(limited)
    sock.sendall(head(AFFINE, "X-Big: " + "a" * (70 * 1024)) + BODY)
    answer = read_answer(sock)
    assert refused(answer, 431, "server.max_header_bytes") == "header_too_large"
    assert closed_by_server(sock)
    # just under the limit is served
    ok = httpx.post(limited.http + AFFINE, content=BODY,
                    headers={"x-big": "a" * (60 * 1024)}, timeout=10)
    assert ok.status_code == 200, ok.text


def test_more_header_fields_than_max_headers_is_431(limited: ServerThread) -> None:
    with Honest(limited) as honest:
        sock = connect(limited)
        many = [f"X-H{i}: v" for i in range(100_000)]
        try:
            sock.sendall(head(AFFINE, *many) + BODY)
        except OSError:
            pass  # refused and closed while the rest was still being sent
        try:
            answer = read_answer(sock)
        except (ConnectionError, OSError):
            answer = None
        sock.close()
        # 101 fields (Host, Content-Type, Content-Length and 98 more) is one too many
        sock = connect(limited)
        sock.sendall(head(AFFINE, *many[:98]) + BODY)
        assert refused(read_answer(sock), 431, "server.max_headers") == "header_too_large"
        sock.close()
    honest.check()
    if answer is not None:  # (a reset may overtake the answer while the client still sends)
        refused(answer, 431, "server.max_headers")
    sock = connect(limited)  # 100 fields are served
    sock.sendall(head(AFFINE, *many[:97]) + BODY)
    status, _, body = read_answer(sock)
    assert status == 200, body
    sock.close()


def trickle(sock: socket.socket, data: bytes, every_s: float, stop: threading.Event) -> None:
    """Send ``data`` a byte at a time until the server closes (or ``stop``)."""
    for i in range(len(data)):
        if stop.wait(every_s):
            return
        try:
            sock.send(data[i:i + 1])
        except OSError:
            return


@pytest.mark.parametrize("case", ["head", "inline body", "large body"])
def test_a_client_sending_a_byte_at_a_time_is_timed_out(limited: ServerThread,
                                                          case: str) -> None:
    """408 naming the timeout once the head (or the body) is late, and the connection
    closed; the inline lane's small body and uvicorn's path for a large one alike."""
    sock = connect(limited)
    stop = threading.Event()
    if case == "head":
        rest, setting = head() + BODY, "server.header_timeout_s"
    else:
        length = len(BODY) if case == "inline body" else 100 * 1024
        sock.sendall(head(length=length))
        rest, setting = b"x" * length, "server.body_timeout_s"
    started = time.monotonic()
    sender = threading.Thread(target=trickle, args=(sock, rest, 0.05, stop), daemon=True)
    with Honest(limited) as honest:
        sender.start()
        try:
            answer = read_answer(sock)
        finally:
            stop.set()
        waited = time.monotonic() - started
        assert closed_by_server(sock)
    sender.join(5)
    sock.close()
    honest.check()
    assert refused(answer, 408, setting) == "request_timeout"
    assert TIMEOUT_S * 0.9 <= waited < TIMEOUT_S + 5, waited


def test_a_connection_that_sends_nothing_is_closed(limited: ServerThread) -> None:
    sock = connect(limited)
    answer = read_answer(sock)
    assert refused(answer, 408, "server.header_timeout_s") == "request_timeout"
    assert closed_by_server(sock)


@pytest.mark.parametrize("request_head", ["inline infer", "uvicorn's path"])
def test_a_kept_alive_connection_idle_past_its_timeout_is_closed(
        tmp_path: Path, request_head: str) -> None:
    """``server.keep_alive_timeout_s`` after its last answer, an idle connection is closed
    (the sweeper's deadline, no timer per request); requests that come sooner each restart
    the clock, on the inline lane and on uvicorn's path alike."""
    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("affine", affine_model())
    settings = Settings()
    settings.server.watch_repository = False
    settings.server.keep_alive_timeout_s = 0.5
    settings.runtime.warmup_batch_sizes = [1]
    settings.runtime.warmup_runs = 1
    served = ServerThread(settings, repo).start()
    request = (head() + BODY if request_head == "inline infer"
               else b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        sock = connect(served)
        for _ in range(6):  # 1.5 s of requests 0.25 s apart: never idle for 0.5 s
            sock.sendall(request)
            assert read_answer(sock)[0] == 200
            time.sleep(0.25)
        idle_from = time.monotonic()
        assert closed_by_server(sock)
        waited = time.monotonic() - idle_from + 0.25
        assert 0.45 <= waited < 2.0, waited
        sock.close()
    finally:
        served.stop()


def test_two_hundred_slow_clients_are_capped_and_closed(limited: ServerThread) -> None:
    """200 sockets at a byte every 0.3 s: those beyond max_connections are answered 503 at
    once, the rest 408 after the header timeout; every one is closed, the honest client (whose
    connection was open before) is served throughout, and new connections are served after."""
    stop = threading.Event()
    socks: list[socket.socket] = []
    with Honest(limited) as honest:
        for _ in range(200):
            socks.append(connect(limited))
        senders = [threading.Thread(target=trickle, args=(s, head(), 0.3, stop), daemon=True)
                   for s in socks[:8]]  # a few trickle; the others wait with part of a head
        for s in socks[8:]:
            s.sendall(b"POST /v2/mo")
        for t in senders:
            t.start()
        codes: dict[str, int] = {}
        deadline = time.monotonic() + TIMEOUT_S + 10
        for s in socks:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            code = _answer_code(s)
            codes[code] = codes.get(code, 0) + 1
            assert closed_by_server(s)
        stop.set()
    for s in socks:
        s.close()
    honest.check()
    # the honest client's connection is one of the cap's
    assert codes.get("overloaded", 0) >= 200 - MAX_CONNECTIONS, codes
    assert codes.get("request_timeout", 0) >= MAX_CONNECTIONS - 8, codes
    assert sum(codes.values()) == 200, codes
    assert httpx.post(limited.http + AFFINE, content=BODY, timeout=10).status_code == 200


def _answer_code(sock: socket.socket) -> str:
    status, headers, body = read_answer(sock)
    doc = orjson.loads(body)
    setting = {503: "server.max_connections", 408: "server.header_timeout_s"}[status]
    assert setting in doc["error"], doc
    return str(doc["code"])


def _infer_request(rows: int) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="affine")
    req.inputs.add(name="x", datatype="FP32", shape=[rows, 4])
    req.raw_input_contents.append(np.ones((rows, 4), np.float32).tobytes())
    return req


def test_grpc_refuses_an_oversized_message_and_metadata_and_serves_on(
        limited: ServerThread) -> None:
    with grpc.insecure_channel(limited.grpc) as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as big:
            stub.ModelInfer(_infer_request(MAX_BODY // 16 + 1), timeout=10)
        assert big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, big.value
        with pytest.raises(grpc.RpcError) as meta:
            stub.ModelInfer(_infer_request(1), timeout=10,
                            metadata=[("x-big", "a" * (METADATA + 1000))])
        assert meta.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, meta.value
        assert "metadata" in (meta.value.details() or ""), meta.value.details()
        # the same channel, and metadata under the limit, are served
        resp = stub.ModelInfer(_infer_request(1), timeout=10,
                               metadata=[("x-small", "a" * (METADATA // 2))])
        out = np.frombuffer(resp.raw_output_contents[0], np.float32)
        assert out.tolist() == [2.0, 2.0, 2.0, 2.0]


def test_ingest_http_has_the_same_limits(tmp_path: Path) -> None:
    """``redline ingest http`` serves through the same protocol, with the server.* limits."""
    port = free_port()
    config = tmp_path / "redline.yaml"
    config.write_text("server:\n  max_headers: 10\n  header_timeout_s: 0.5\n")
    log = (tmp_path / "ingest.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "redline.cli", "ingest", "http", "--config", str(config),
         "--store", "memory", "--http-port", str(port)],
        cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "ingest.log").read_text()
            time.sleep(0.1)
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(head("/v1/events", *[f"X-H{i}: v" for i in range(20)], length=2) + b"[]")
        assert refused(read_answer(sock), 431, "server.max_headers") == "header_too_large"
        sock.close()
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"POST /v1/ev")
        assert refused(read_answer(sock), 408, "server.header_timeout_s") == "request_timeout"
        assert closed_by_server(sock)
        sock.close()
        events = [{"source": "session", "entity": {"session_id": "s1"}, "item_id": "a"}]
        r = httpx.post(f"{url}/v1/events", json=events, timeout=10)
        assert r.status_code == 200, r.text
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
