"""Minimal, cheap clients: the load tool must cost far less than the server it measures.

REST is a keep-alive HTTP/1.1 connection on an ``asyncio.Protocol`` (one request in flight per
connection, ``Content-Length`` responses), sending a pre-built request. gRPC sends pre-serialised
``ModelInferRequest`` bytes on one grpc.aio channel, with no per-call message building.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import orjson

from redline.models.datatypes import array_to_wire


class RequestFailed(Exception):
    """A response that was not a success; ``kind`` groups errors in the report."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


def rest_body(
    inputs: dict[str, tuple[str, np.ndarray]], binary: bool, extra_headers: dict[str, str]
) -> tuple[bytes, dict[str, str]]:
    """A V2 infer body (JSON, or binary extension) for ``name -> (datatype, array)``."""
    headers = dict(extra_headers)
    doc: dict[str, Any]
    if not binary:
        doc = {"inputs": [{"name": n, "datatype": dt, "shape": list(a.shape),
                           "data": a.ravel().tolist()} for n, (dt, a) in inputs.items()]}
        headers["Content-Type"] = "application/json"
        return orjson.dumps(doc), headers
    chunks = [array_to_wire(a) for _, a in inputs.values()]
    doc = {
        "inputs": [{"name": n, "datatype": dt, "shape": list(a.shape),
                    "parameters": {"binary_data_size": len(c)}}
                   for (n, (dt, a)), c in zip(inputs.items(), chunks, strict=True)],
        "parameters": {"binary_data_output": True},
    }
    head = orjson.dumps(doc)
    headers["Inference-Header-Content-Length"] = str(len(head))
    headers["Content-Type"] = "application/octet-stream"
    return head + b"".join(chunks), headers


def grpc_request_bytes(model: str, inputs: dict[str, tuple[str, np.ndarray]]) -> bytes:
    from redline.proto import grpc_service_pb2 as pb

    req = pb.ModelInferRequest(model_name=model)
    for name, (datatype, array) in inputs.items():
        req.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        req.raw_input_contents.append(array_to_wire(array))
    return req.SerializeToString()


class _HttpProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.lost = False
        self.answered = 0  # responses read on this connection

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(RequestFailed("connection_closed", str(exc or "")))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.waiter is None or self.waiter.done():
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end])
        length = None
        chunked = False
        closing = False
        for line in head.split(b"\r\n")[1:]:
            name = line[:18].lower()
            if name.startswith(b"content-length:"):
                length = int(line[15:])
            elif name == b"transfer-encoding:" and b"chunked" in line.lower():
                chunked = True  # (a peer's proxy streams its answers: Ray Serve's)
            elif name.startswith(b"connection:") and b"close" in line.lower():
                closing = True  # the server closes it after this answer: not reused
        if chunked:
            found = _chunks(self.buffer, end + 4)
            if found is None:
                return  # not all of it yet
            body, used = found
        elif length is None:
            self.waiter.set_exception(RequestFailed("bad_response", "no Content-Length"))
            return
        else:
            if len(self.buffer) < end + 4 + length:
                return
            body, used = bytes(self.buffer[end + 4 : end + 4 + length]), end + 4 + length
        del self.buffer[:used]
        self.answered += 1
        if closing and self.transport is not None:
            self.lost = True
            self.transport.close()
        self.waiter.set_result((int(head[9:12]), body))


def _chunks(buffer: bytearray, at: int) -> tuple[bytes, int] | None:
    """A chunked body from ``at``: (the body, where the message ends), or None while the last
    chunk has not arrived (trailer fields are skipped)."""
    parts: list[bytes] = []
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None
        size = int(bytes(buffer[at:line_end]).split(b";", 1)[0], 16)
        at = line_end + 2
        if size == 0:
            trailer_end = buffer.find(b"\r\n\r\n", at - 2)
            if trailer_end < 0:
                return None
            return b"".join(parts), trailer_end + 4
        if len(buffer) < at + size + 2:
            return None
        parts.append(bytes(buffer[at:at + size]))
        at += size + 2


def post_request(host: str, port: int, path: str, body: bytes,
                 headers: dict[str, str]) -> bytes:
    """An HTTP/1.1 ``POST`` of ``body``, as its bytes on the wire."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class RestConnection:
    """One keep-alive connection: ``send`` any request on it, or ``call`` to send its own
    ``request`` (``post_request``'s bytes) over and over."""

    def __init__(self, host: str, port: int, request: bytes = b"") -> None:
        self.host, self.port = host, port
        self.request = request
        self.protocol: _HttpProtocol | None = None

    async def open(self) -> RestConnection:
        loop = asyncio.get_running_loop()
        try:
            _, self.protocol = await loop.create_connection(_HttpProtocol, self.host, self.port)
        except OSError as exc:
            raise RequestFailed("connect", str(exc)) from None
        return self

    async def call(self) -> bytes:
        return await self.send(self.request)

    async def send(self, request: bytes) -> bytes:
        """Send ``request`` (``post_request``'s bytes) on this connection, reopened if the
        server closed it; the answer's body, or ``RequestFailed``."""
        if self.protocol is None or self.protocol.lost:
            await self.open()
        protocol = self.protocol
        try:
            status, body = await self._exchange(request)
        except RequestFailed as exc:
            assert protocol is not None
            if exc.kind != "connection_closed" or not protocol.answered or protocol.buffer:
                raise
            # A kept-alive connection the server closed as this request went out (idle, or
            # at its own limit): nothing of it was read, so it goes again on a new one.
            await self.open()
            status, body = await self._exchange(request)
        if status != 200:
            raise RequestFailed(f"http_{status}", body[:200].decode("utf-8", "replace"))
        return body

    async def _exchange(self, request: bytes) -> tuple[int, bytes]:
        protocol = self.protocol
        assert protocol is not None and protocol.transport is not None
        protocol.waiter = asyncio.get_running_loop().create_future()
        protocol.transport.write(request)
        return await protocol.waiter

    def close(self) -> None:
        if self.protocol is not None and self.protocol.transport is not None:
            self.protocol.transport.close()


class RestPool:
    """Keep-alive connections to one server, up to ``limit``, one request in flight on each: a
    request takes the most recently freed one, opens one while under the limit, else waits."""

    def __init__(self, host: str, port: int, limit: int) -> None:
        self.host, self.port, self.limit = host, port, limit
        self._free: asyncio.LifoQueue[RestConnection] = asyncio.LifoQueue()
        self._opened: list[RestConnection] = []

    async def send(self, request: bytes) -> bytes:
        """``RestConnection.send`` on a connection of the pool."""
        if self._free.empty() and len(self._opened) < self.limit:
            conn = RestConnection(self.host, self.port)
            self._opened.append(conn)
        else:
            conn = await self._free.get()
        try:
            return await conn.send(request)
        finally:
            self._free.put_nowait(conn)

    def close(self) -> None:
        for conn in self._opened:
            conn.close()


class GrpcCaller:
    """Sends pre-serialised ModelInfer requests on one channel."""

    def __init__(self, target: str, request: bytes, timeout_s: float = 30.0,
                 method: str = "/inference.GRPCInferenceService/ModelInfer") -> None:
        import grpc

        self._grpc = grpc
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = self.channel.unary_unary(method)
        self.request = request
        self.timeout_s = timeout_s

    async def call(self) -> bytes:
        try:
            result: bytes = await self.stub(self.request, timeout=self.timeout_s)
        except self._grpc.aio.AioRpcError as exc:
            raise RequestFailed(f"grpc_{exc.code().name}", exc.details() or "") from None
        return result

    async def close(self) -> None:
        await self.channel.close()
