"""The recommender comparison's load tool: both loops count what a real server answered (its
answers framed by length or chunked), and while they run the heap held before is out of the
collector's full passes (and back after)."""

from __future__ import annotations

import asyncio
import gc

from aiohttp import web

from benchmarks.recommend.load import closed_loop, frozen_heap, open_loop, open_loop_answers


def test_loops_count_answers_with_the_heap_frozen_meanwhile() -> None:
    frozen_while_sending: list[int] = []

    def body(n: int) -> bytes:
        frozen_while_sending.append(gc.get_freeze_count())
        return b'{"n": %d}' % n

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True}, status=200 if request.path == "/ok" else 500)

    async def streamed(request: web.Request) -> web.StreamResponse:
        await request.read()  # in pieces, chunked, as Ray Serve's proxy answers
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b'{"ok": ')
        await response.write(b"true}")
        await response.write_eof()
        return response

    async def chunked_answers(url: str) -> list:  # type: ignore[type-arg]
        with frozen_heap():  # (as the loops run)
            return await open_loop_answers(url, body, 100, 0.2, warmup_s=0.0)

    async def go() -> tuple:
        app = web.Application()
        app.router.add_post("/ok", answer)
        app.router.add_post("/bad", answer)
        app.router.add_post("/chunked", streamed)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            base = f"http://127.0.0.1:{port}"
            return (await closed_loop(f"{base}/ok", body, 2, 0.3, warmup_s=0.1),
                    await open_loop(f"{base}/ok", body, 200, 0.3, warmup_s=0.1),
                    await open_loop(f"{base}/bad", body, 100, 0.2, warmup_s=0.0),
                    await chunked_answers(f"{base}/chunked"))
        finally:
            await runner.cleanup()

    held = [object() for _ in range(1000)]  # what a benchmark holds before it measures
    closed, opened, failing, chunked = asyncio.run(go())
    assert closed.requests >= 1 and closed.errors == 0 and closed.p99_ms > 0
    assert opened.requests == 60 and opened.errors == 0  # every one due in 0.3 s at 200/s
    assert failing.requests == 0 and failing.errors == 20 and failing.p99_ms == float("inf")
    assert [body for _, body in chunked] == [b'{"ok": true}'] * 20
    assert min(frozen_while_sending) >= len(held)
    assert gc.get_freeze_count() == 0


def test_a_connection_the_server_closes_costs_no_request() -> None:
    """Servers close kept-alive connections: one says so (``Connection: close``), another just
    closes after its answer (an idle timeout, a proxy's limit). Neither is an error of the
    server's: the next request goes on a new connection, or again on one when the close met
    it on its way out (nothing of it was read)."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            says = b"Connection: close\r\n" if b"/says" in head else b""
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + says + b"\r\n{}")
            await writer.drain()
            await asyncio.sleep(0.002 if says else 0.0005)  # then closes, whatever it said
        except (asyncio.CancelledError, asyncio.IncompleteReadError, ConnectionError):
            pass  # the run ended, or the client left first
        finally:
            writer.close()

    async def go() -> tuple:  # type: ignore[type-arg]
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            base = f"http://127.0.0.1:{port}"
            return (await closed_loop(f"{base}/says", lambda n: b"{}", 2, 0.3, warmup_s=0.0),
                    await closed_loop(f"{base}/silent", lambda n: b"{}", 2, 0.3, warmup_s=0.0))
        finally:
            server.close()

    says, silent = asyncio.run(go())
    assert says.requests > 20 and says.errors == 0
    assert silent.requests > 20 and silent.errors == 0
