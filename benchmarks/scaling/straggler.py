"""A TCP proxy that makes a replica a straggler: a share of its answers arrive late.

It forwards bytes both ways; each chunk coming back from the server is, with probability
``share``, held for ``delay_s`` first. Over HTTP/1.1 keep-alive one chunk is one response, so
"1% of calls on this replica are 50x slower" is ``StragglerProxy(upstream, 0.01, 50 * p50)``.
Loopback only; used by the hedging test and ``benchmarks/scaling/hedging.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading


class StragglerProxy:
    def __init__(self, upstream_port: int, share: float, delay_s: float, seed: int = 1,
                 listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.upstream_port = upstream_port
        self.listen = listen
        self.share = share
        self.delay_s = delay_s
        self.delayed = 0
        self.port = 0
        self._random = random.Random(seed)
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
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_writer, delay=False),
                             self._pump(up_reader, writer, delay=True),
                             return_exceptions=True)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    delay: bool) -> None:
        try:
            while chunk := await src.read(65536):
                if delay and self._random.random() < self.share:
                    self.delayed += 1
                    await asyncio.sleep(self.delay_s)
                dst.write(chunk)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.close()


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
