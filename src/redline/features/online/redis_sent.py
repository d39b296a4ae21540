"""Commands sent on a connection of their own and their replies read later, so that a source
decodes its next batch while Redis runs the last one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import redis
from redis.commands.core import Script

from redline.features.online.redis_client import CONNECTION_ERRORS, guarded
from redline.features.online.redis_failover import check_replicas
from redline.features.online.redis_lua import WRITE_SCRIPT


class SendingStore(Protocol):
    """What a sent command needs of its store (:class:`~redline.features.online.redis.RedisStore`):
    its URL, client, write script, and the replicas a write waits for (``WAIT``; None: none)."""

    url: str
    client: Any  # a redis-py client
    writer: Script
    wait: tuple[int, float] | None


class SentCommand:
    """A command sent on a connection of its own, its reply read later (:meth:`result`);
    ``then``: commands sent right behind it on the same connection (``WAIT``), their replies
    read by :meth:`result` too (``self.then_replies``)."""

    def __init__(self, store: SendingStore, *args: Any,
                 then: Sequence[Sequence[Any]] = ()) -> None:
        self.store = store
        self.pool = store.client.connection_pool
        self.then = len(then)
        self.then_replies: list[Any] = []
        self.conn: Any = self.pool.get_connection()
        try:
            if then:
                self.conn.send_packed_command(self.conn.pack_commands([args, *then]))
            else:
                self.conn.send_command(*args)
        except BaseException:
            self._release(broken=True)
            raise

    def _release(self, broken: bool = False) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            if broken:
                conn.disconnect()
            self.pool.release(conn)

    def ready(self) -> bool:
        """Whether the reply has arrived (reading it would not wait); a broken connection
        counts as ready, so that :meth:`result` raises."""
        if self.conn is None:
            return True
        try:
            return bool(self.conn.can_read(0))
        except CONNECTION_ERRORS:
            return True

    def close(self) -> None:
        """Give the connection back without reading the reply (it is dropped with the socket)."""
        self._release(broken=True)

    def result(self) -> Any:
        """The raw reply (waits for it)."""
        if self.conn is None:
            raise RuntimeError("the reply of this command was read already")
        try:
            reply = guarded(self.store.url, self.conn.read_response)
            self.then_replies = [guarded(self.store.url, self.conn.read_response)
                                 for _ in range(self.then)]
        except BaseException:
            self._release(broken=True)
            raise
        self._release()
        return reply


class SentWrite(SentCommand):
    """A write-script call sent on a connection of its own, its reply read later.

    Sources send a batch's write and decode the next batch while Redis runs it. Sending from the
    decoding thread itself matters: a writer thread had to win the GIL from the decoder before it
    could even send (Python's 5 ms switch interval), and Redis sat idle meanwhile (measured: the
    5-view drain took the sum of decode and Lua time instead of the larger of the two)."""

    def __init__(self, store: SendingStore, keys: list[str], args: list[Any]) -> None:
        self.keys, self.args = keys, args
        wait = store.wait
        super().__init__(store, "EVALSHA", store.writer.sha, len(keys), *keys, *args,
                         then=[("WAIT", wait[0], int(wait[1]))] if wait else ())

    def result(self) -> Any:
        """The script's reply; a lost script (Redis restarted) is loaded and the call made again
        — nothing ran, the reply was the NOSCRIPT error. With ``features.redis_wait_replicas``
        too few replicas acknowledging it raises ``StoreUnavailable`` (see ``redis_failover``)."""
        try:
            reply = super().result()
        except redis.exceptions.NoScriptError:
            guarded(self.store.url, lambda: self.store.client.script_load(WRITE_SCRIPT))
            return SentWrite(self.store, self.keys, self.args).result()
        if self.store.wait:
            check_replicas(self.then_replies[0], self.store.wait, self.store.url)
        return reply

    def counts(self) -> tuple[int, int, int]:
        """:meth:`result` of a stream write: (entries acked, events accepted, dead-lettered)."""
        res = self.result()
        return int(res[0]), int(res[1]), int(res[2])
