"""A TCP proxy that makes a replica a straggler: a share of its answers arrive late.

It forwards bytes both ways. The first chunk of each answer (the first bytes back after a
request went up; over HTTP/1.1 keep-alive that is one response) is held ``service_s`` (a model's
service time, 0 by default), or ``delay_s`` instead with probability ``share``. So "1% of calls
on this replica take 50x the median" is ``StragglerProxy(upstream, 0.01, 50 * p50)``.
Loopback only; used by the hedging test and ``benchmarks/scaling/hedging.py``, which runs each
proxy in a process of its own (:func:`spawn`) so the proxies never share the client's GIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import random
import threading
from typing import Any


class StragglerProxy:
    def __init__(self, upstream_port: int, share: float, delay_s: float, seed: int = 1,
                 listen: tuple[str, int] = ("127.0.0.1", 0), service_s: float = 0.0) -> None:
        self.upstream_port = upstream_port
        self.listen = listen
        self.share = share
        self.delay_s = delay_s
        self.service_s = service_s
        self.delayed = 0
        self.answers = 0
        self.abandoned = 0  # clients that hung up while their answer was still to come
        self.port = 0
        self._random = random.Random(seed)
        self._handlers: set[asyncio.Task[Any]] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def start(self) -> StragglerProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._client, *self.listen))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        # Cancel the pumps, not the connection handlers: a handler's gather then ends on its
        # own, where a cancelled handler makes asyncio's stream callback log an error.
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks - self._handlers:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1",
                                                                     self.upstream_port)
            except OSError:
                writer.close()
                return
            asked = [False]  # a request went up and its answer has not started coming back yet
            await asyncio.gather(self._pump(reader, up_writer, asked, answers=False),
                                 self._pump(up_reader, writer, asked, answers=True),
                                 return_exceptions=True)
        finally:
            self._handlers.discard(handler)

    def _hold_s(self) -> float:
        self.answers += 1
        if self.share and self._random.random() < self.share:
            self.delayed += 1
            return self.delay_s
        return self.service_s

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    asked: list[bool], answers: bool) -> None:
        try:
            while chunk := await src.read(65536):
                if not answers:
                    asked[0] = True
                elif asked[0]:  # the first bytes of an answer: hold them, or not
                    hold = self._hold_s()
                    if hold > 0:
                        await asyncio.sleep(hold)
                    asked[0] = False
                dst.write(chunk)
                await dst.drain()
            if not answers and asked[0]:
                self.abandoned += 1
        except (ConnectionError, OSError):
            if not answers and asked[0]:
                self.abandoned += 1
        finally:
            with contextlib.suppress(Exception):
                dst.close()


def _run(upstream_port: int, share: float, delay_s: float, seed: int, service_s: float,
         port_out: Any, delayed: Any) -> None:
    import time

    proxy = StragglerProxy(upstream_port, share, delay_s, seed=seed, service_s=service_s).start()
    port_out.send(proxy.port)
    while True:
        time.sleep(0.2)
        delayed.value = proxy.delayed


class ProxyProcess:
    """A :class:`StragglerProxy` in a process of its own; ``delayed`` is read across processes."""

    def __init__(self, upstream_port: int, share: float, delay_s: float, seed: int = 1,
                 service_s: float = 0.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._delayed = ctx.Value("q", 0)
        ours, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_run, daemon=True, args=(
            upstream_port, share, delay_s, seed, service_s, theirs, self._delayed))
        self._proc.start()
        if not ours.poll(30):
            raise RuntimeError("straggler proxy did not start")
        self.port: int = ours.recv()

    @property
    def delayed(self) -> int:
        return int(self._delayed.value)

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.join(5)


def main() -> None:
    """``python -m benchmarks.scaling.straggler HOST:PORT UPSTREAM_PORT SHARE DELAY_S``: run one
    until killed (the zone tests run it inside a namespace as the far zone's link delay)."""
    import sys
    import time

    host, port = sys.argv[1].rsplit(":", 1)
    proxy = StragglerProxy(int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]),
                           listen=(host, int(port))).start()
    print(f"proxy on {host}:{proxy.port}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
