"""A fair share of the pool's HTTP connections for each worker.

Why: every worker of ``redline serve --workers N`` accepts from one shared listening socket.
Left to the event loop, the worker that wakes first takes every connection waiting (libuv
accepts until the queue is empty), so a client's eight keep-alive connections, opened together,
often all went to one worker (one or the other worker's CPU time ~0 in 4 of 11 runs of the
recommender's c=8 load), which then did all the work for as long as they stayed open while the
others idled. Envoy (its exact connection balancer) and Node's cluster module each fix this
their own way; here the workers share what they hold.

How: each worker keeps its open connections in its slot of the pool's board
(:class:`~redline.scaling.loadmeter.LoadBoard`). When the listening socket is readable, a
worker holding more connections than the fewest any other live worker holds steps aside: it
stops watching the socket and looks again ``LOOK_AGAIN_S`` later, while the others, woken by the
same readiness, take the connection. After ``STEP_ASIDE_S`` of stepping aside it accepts anyway,
so a connection never waits long on a worker that is stuck. A worker accepts one connection
per readiness, so workers woken together take turns. No request pays anything: the work is per
connection.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from redline.scaling.loadmeter import LoadBoard

log = logging.getLogger("redline.scaling")

LOOK_AGAIN_S = 0.001  # a worker stepping aside looks at the socket again this often
STEP_ASIDE_S = 0.010  # and accepts anyway once it has stepped aside this long for a connection
PAUSE_S = 0.1  # after an accept the system refused (out of descriptors): this long unwatched
WARN_EVERY_S = 60.0  # one warning line a minute while accepts are refused


class FairAccept:
    """One worker's listener on the pool's shared socket, in uvicorn's list of servers
    (``close``, ``wait_closed``). Each connection's protocol is ``protocol_class`` made with
    ``protocol_kwargs`` (uvicorn's ``config``, ``server_state``, ``app_state``), counted out of
    this worker's share when it closes."""

    def __init__(self, sock: socket.socket, board: LoadBoard, slot: int,
                 protocol_class: type[asyncio.Protocol], protocol_kwargs: dict[str, Any],
                 connections: set[Any]) -> None:
        sock.setblocking(False)  # (every worker's loop reads it so; another may take a connection)
        self._sock = sock
        self._fd = sock.fileno()
        self._board = board
        self._slot = slot
        self._connections = connections  # uvicorn's open connections of this worker
        self._opening = 0  # accepted, their transport not made yet
        self._aside_since = self._aside_last = -1.0
        self._closed = False
        self._watching = False
        self._timer: asyncio.TimerHandle | None = None
        self._warned = -WARN_EVERY_S
        self._loop = asyncio.get_running_loop()
        acceptor = self

        class Counted(protocol_class):  # type: ignore[valid-type,misc]
            def connection_lost(self, exc: Exception | None) -> None:
                super().connection_lost(exc)
                acceptor.publish()

        def make() -> asyncio.Protocol:
            return Counted(**protocol_kwargs, _loop=self._loop)

        self._make = make
        self.publish()
        self._watch()

    @classmethod
    def on(cls, board: LoadBoard, slot: int) -> Callable[..., FairAccept]:
        """What a worker's server listens with (``RedlineServer.listen_with``)."""
        def listen(sock: socket.socket, protocol_class: type[asyncio.Protocol],
                   protocol_kwargs: dict[str, Any], connections: set[Any]) -> FairAccept:
            return cls(sock, board, slot, protocol_class, protocol_kwargs, connections)
        return listen

    def publish(self) -> None:
        """This worker's open connections, as the others read them."""
        if not self._closed:
            self._board.write_connections(self._slot, len(self._connections) + self._opening)

    # ------------------------------------------------------------------ accepting
    def _watch(self) -> None:
        self._timer = None
        if not self._closed and not self._watching:
            self._loop.add_reader(self._fd, self._readable)
            self._watching = True

    def _unwatch(self, for_s: float) -> None:
        self._loop.remove_reader(self._fd)
        self._watching = False
        self._timer = self._loop.call_later(for_s, self._watch)

    def _readable(self) -> None:
        held = len(self._connections) + self._opening
        fewest = self._board.fewest_connections(self._slot) if held else None
        if fewest is not None and held > fewest:
            now = time.monotonic()
            if now - self._aside_last > 5 * LOOK_AGAIN_S:  # a new connection is waiting
                self._aside_since = now
            self._aside_last = now
            if now - self._aside_since < STEP_ASIDE_S:
                self._unwatch(LOOK_AGAIN_S)  # another worker holds fewer: it takes this one
                return
        try:
            conn, _ = self._sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # another worker took it, or the client gave up
        except OSError as exc:  # out of file descriptors: stop looking for a moment
            if time.monotonic() - self._warned >= WARN_EVERY_S:
                self._warned = time.monotonic()
                log.warning("cannot accept a connection (%s): retrying every %.1f s; raise the "
                            "open-files limit (ulimit -n) or lower server.max_connections",
                            exc.strerror, PAUSE_S)
            self._unwatch(PAUSE_S)
            return
        self._aside_last = -1.0
        conn.setblocking(False)
        self._opening += 1
        self.publish()
        made = self._loop.create_task(self._loop.connect_accepted_socket(self._make, conn))
        made.add_done_callback(lambda task: self._made(task, conn))

    def _made(self, task: asyncio.Task[Any], conn: socket.socket) -> None:
        self._opening -= 1
        if task.cancelled() or task.exception() is not None:
            conn.close()  # the client left before its transport was made
        self.publish()

    # ------------------------------------------------------------------ uvicorn's server
    def close(self) -> None:
        """Stop accepting (draining): the other workers no longer count on this one."""
        if self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._board.write_connections(self._slot, -1)
        self._closed = True

    async def wait_closed(self) -> None:
        return None
