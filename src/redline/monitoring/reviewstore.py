"""Where the review queue's items and labelled rows live: this process, the SQLite file, Redis.

The same place as the label join (``joinstore.py``): a pool of workers or several replicas then
queue into one list, a reviewer's label is taken from it once whichever process answers, and the
Parquet export holds every process's labelled rows. Bounds as in memory: at most ``capacity``
waiting (the oldest go, counted as dropped), ``10 x capacity`` labelled rows. Items are JSON.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, Protocol


class ReviewStore(Protocol):
    def add(self, item: dict[str, Any]) -> str: ...

    def items(self) -> list[dict[str, Any]]: ...

    def get(self, item_id: str) -> dict[str, Any] | None: ...

    def pop(self, item_id: str) -> dict[str, Any] | None: ...

    def add_labelled(self, row: dict[str, Any]) -> None: ...

    def labelled(self) -> list[dict[str, Any]]: ...

    def counts(self) -> dict[str, int]: ...  # waiting, labelled, dropped


class MemoryReviewStore:
    """This process only (one worker)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._labelled: list[dict[str, Any]] = []
        self._seq = 0
        self.dropped = 0
        self._lock = threading.Lock()

    def add(self, item: dict[str, Any]) -> str:
        with self._lock:
            self._seq += 1
            item_id = f"r{self._seq}"
            self._items[item_id] = {"id": item_id, **item}
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
                self.dropped += 1
            return item_id

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._items.values())

    def get(self, item_id: str) -> dict[str, Any] | None:
        return self._items.get(item_id)

    def pop(self, item_id: str) -> dict[str, Any] | None:
        with self._lock:
            return self._items.pop(item_id, None)

    def add_labelled(self, row: dict[str, Any]) -> None:
        with self._lock:
            self._labelled.append(row)
            if len(self._labelled) > self.capacity * 10:
                del self._labelled[: len(self._labelled) - self.capacity * 10]

    def labelled(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._labelled)

    def counts(self) -> dict[str, int]:
        return {"waiting": len(self._items), "labelled": len(self._labelled),
                "dropped": self.dropped}


_ADD = """
local seq = redis.call('INCR', KEYS[3])
local id = 'r' .. seq
redis.call('HSET', KEYS[1], id, ARGV[1]); redis.call('ZADD', KEYS[2], seq, id)
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[2])
if over > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #popped, 2 do redis.call('HDEL', KEYS[1], popped[i]) end
  redis.call('INCRBY', KEYS[4], over)
end
return id
"""
_POP = """
local body = redis.call('HGET', KEYS[1], ARGV[1])
if body then redis.call('HDEL', KEYS[1], ARGV[1]); redis.call('ZREM', KEYS[2], ARGV[1]) end
return body
"""


class RedisReviewStore:
    """In the label join's Redis, under one hash tag (one cluster slot)."""

    def __init__(self, backend: Any, capacity: int) -> None:
        self.backend, self.capacity = backend, capacity
        client = backend.client
        tag = "redline:review:{queue}"
        self.keys = [f"{tag}:items", f"{tag}:order", f"{tag}:seq", f"{tag}:dropped",
                     f"{tag}:labelled"]
        self._add = client.register_script(_ADD)
        self._pop = client.register_script(_POP)

    def add(self, item: dict[str, Any]) -> str:
        body = json.dumps(item)
        return str(self.backend.guarded(lambda: self._add(
            keys=self.keys[:4], args=[body, self.capacity])).decode())

    def items(self) -> list[dict[str, Any]]:
        client = self.backend.client

        def read() -> list[tuple[bytes, bytes | None]]:
            ids = client.zrange(self.keys[1], 0, -1)
            return list(zip(ids, client.hmget(self.keys[0], ids), strict=True)) if ids else []

        return [{"id": i.decode(), **json.loads(b)} for i, b in self.backend.guarded(read)
                if b is not None]

    def get(self, item_id: str) -> dict[str, Any] | None:
        body = self.backend.guarded(lambda: self.backend.client.hget(self.keys[0], item_id))
        return None if body is None else {"id": item_id, **json.loads(body)}

    def pop(self, item_id: str) -> dict[str, Any] | None:
        body = self.backend.guarded(lambda: self._pop(keys=self.keys[:2], args=[item_id]))
        return None if body is None else {"id": item_id, **json.loads(body)}

    def add_labelled(self, row: dict[str, Any]) -> None:
        pipe = self.backend.client.pipeline(transaction=False)
        pipe.rpush(self.keys[4], json.dumps(row))
        pipe.ltrim(self.keys[4], -self.capacity * 10, -1)
        self.backend.guarded(pipe.execute)

    def labelled(self) -> list[dict[str, Any]]:
        rows = self.backend.guarded(lambda: self.backend.client.lrange(self.keys[4], 0, -1))
        return [json.loads(r) for r in rows]

    def counts(self) -> dict[str, int]:
        pipe = self.backend.client.pipeline(transaction=False)
        pipe.zcard(self.keys[1])
        pipe.llen(self.keys[4])
        pipe.get(self.keys[3])
        waiting, labelled, dropped = self.backend.guarded(pipe.execute)
        return {"waiting": int(waiting), "labelled": int(labelled), "dropped": int(dropped or 0)}


_DROPPED = ("\x1freview", "dropped")


class SqliteReviewStore:
    """In the label join's SQLite file (a pool of workers on one host; its tables are made
    with the join's)."""

    def __init__(self, backend: Any, capacity: int) -> None:
        self.backend, self.capacity = backend, capacity

    def add(self, item: dict[str, Any]) -> str:
        def run(db: Any) -> str:
            seq = db.execute("INSERT INTO review_items(body) VALUES (?)",
                             (json.dumps(item),)).lastrowid
            over = db.execute("SELECT count(*) FROM review_items").fetchone()[0] - self.capacity
            if over > 0:
                db.execute("DELETE FROM review_items WHERE seq IN (SELECT seq FROM review_items "
                           "ORDER BY seq LIMIT ?)", (over,))
                db.execute("INSERT INTO counts VALUES (?, ?, ?) ON CONFLICT(mv, name) DO UPDATE "
                           "SET n = n + excluded.n", (*_DROPPED, over))
            return f"r{seq}"

        return str(self.backend.transaction(run))

    def items(self) -> list[dict[str, Any]]:
        rows = self.backend.transaction(lambda db: db.execute(
            "SELECT seq, body FROM review_items ORDER BY seq").fetchall(), write=False)
        return [{"id": f"r{seq}", **json.loads(body)} for seq, body in rows]

    def get(self, item_id: str) -> dict[str, Any] | None:
        return self._one(item_id, delete=False)

    def pop(self, item_id: str) -> dict[str, Any] | None:
        return self._one(item_id, delete=True)

    def _one(self, item_id: str, delete: bool) -> dict[str, Any] | None:
        if not item_id.startswith("r") or not item_id[1:].isdigit():
            return None
        seq = int(item_id[1:])
        sql = ("DELETE FROM review_items WHERE seq = ? RETURNING body" if delete
               else "SELECT body FROM review_items WHERE seq = ?")
        row = self.backend.transaction(lambda db: db.execute(sql, (seq,)).fetchone(),
                                       write=delete)
        return None if row is None else {"id": item_id, **json.loads(row[0])}

    def add_labelled(self, row: dict[str, Any]) -> None:
        def run(db: Any) -> None:
            db.execute("INSERT INTO review_labelled(body) VALUES (?)", (json.dumps(row),))
            db.execute("DELETE FROM review_labelled WHERE seq <= (SELECT seq FROM "
                       "review_labelled ORDER BY seq DESC LIMIT 1 OFFSET ?)",
                       (self.capacity * 10,))

        self.backend.transaction(run)

    def labelled(self) -> list[dict[str, Any]]:
        rows = self.backend.transaction(lambda db: db.execute(
            "SELECT body FROM review_labelled ORDER BY seq").fetchall(), write=False)
        return [json.loads(r[0]) for r in rows]

    def counts(self) -> dict[str, int]:
        def run(db: Any) -> dict[str, int]:
            dropped = db.execute("SELECT n FROM counts WHERE mv = ? AND name = ?",
                                 _DROPPED).fetchone()
            return {"waiting": db.execute("SELECT count(*) FROM review_items").fetchone()[0],
                    "labelled": db.execute("SELECT count(*) FROM review_labelled").fetchone()[0],
                    "dropped": int(dropped[0]) if dropped else 0}

        return self.backend.transaction(run, write=False)  # type: ignore[no-any-return]


def review_store(join: Any, capacity: int) -> ReviewStore:
    """The review queue's store beside the label join ``join`` (a ``JoinBackend``)."""
    if join.kind == "redis":
        return RedisReviewStore(join, capacity)
    if join.kind == "sqlite":
        return SqliteReviewStore(join, capacity)
    return MemoryReviewStore(capacity)
