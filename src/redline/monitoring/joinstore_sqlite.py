"""The label join in one SQLite file (WAL): the workers of one host share it with no server.

``redline serve --workers N`` with no Redis puts the file in the pool's state directory (it
lives as long as the pool: a worker that crashes and restarts finds its predictions there);
``monitoring.quality_path`` names a file that outlives restarts. The tables hold what the Redis
backend holds (``joinstore_redis``) with the same bounds: pending predictions (at most
``capacity`` per version, none older than the TTL), the ids that left unlabelled (as many), and
the capped windows of joined pairs and recent scores. Each tick writes every version's new
predictions in one transaction; a POST of labels is one transaction, so two workers never
join one prediction twice.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from redline.errors import StoreUnavailable
from redline.monitoring.joinstore import DUPLICATE, JOINED, LATE, UNKNOWN, JoinSnapshot

SCHEMA = """
CREATE TABLE IF NOT EXISTS pending(mv TEXT, rid TEXT, t REAL, score REAL, PRIMARY KEY(mv, rid));
CREATE INDEX IF NOT EXISTS pending_t ON pending(mv, t);
CREATE TABLE IF NOT EXISTS gone(mv TEXT, rid TEXT, t REAL, PRIMARY KEY(mv, rid));
CREATE INDEX IF NOT EXISTS gone_t ON gone(mv, t);
CREATE TABLE IF NOT EXISTS done(mv TEXT, rid TEXT, t REAL, PRIMARY KEY(mv, rid));
CREATE INDEX IF NOT EXISTS done_t ON done(mv, t);
CREATE TABLE IF NOT EXISTS pairs(id INTEGER PRIMARY KEY AUTOINCREMENT, mv TEXT, score REAL,
                                 label REAL);
CREATE INDEX IF NOT EXISTS pairs_mv ON pairs(mv, id);
CREATE TABLE IF NOT EXISTS recent(id INTEGER PRIMARY KEY AUTOINCREMENT, mv TEXT, score REAL);
CREATE INDEX IF NOT EXISTS recent_mv ON recent(mv, id);
CREATE TABLE IF NOT EXISTS counts(mv TEXT, name TEXT, n INTEGER, PRIMARY KEY(mv, name));
CREATE TABLE IF NOT EXISTS lease(name TEXT PRIMARY KEY, owner TEXT, until REAL);
CREATE TABLE IF NOT EXISTS review_items(seq INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT);
CREATE TABLE IF NOT EXISTS review_labelled(seq INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT);
"""
_TRIM = ("DELETE FROM {table} WHERE mv = ?1 AND id <= (SELECT id FROM {table} WHERE mv = ?1 "
         "ORDER BY id DESC LIMIT 1 OFFSET ?2)")
_COUNT = ("INSERT INTO counts VALUES (?, ?, ?) ON CONFLICT(mv, name) "
          "DO UPDATE SET n = n + excluded.n")


class SqliteJoin:
    """One version's join in the shared file; predictions wait locally until ``flush``."""

    def __init__(self, backend: SqliteBackend, model: str, version: str, capacity: int,
                 ttl_s: float, window: int) -> None:
        self.backend = backend
        self.mv = f"{model}\x1f{version}"
        self.capacity, self.ttl_s, self.window = capacity, ttl_s, window
        self._ids: list[tuple[str, str, float, float]] = []
        self._scores: list[tuple[str, float]] = []
        self._dropped = 0  # predictions dropped from the local batch before they were written
        self._lock = threading.Lock()

    def predicted(self, request_ids: list[str], scores: np.ndarray) -> None:
        now = time.time()
        values = scores.tolist()
        with self._lock:
            self._ids += [(self.mv, rid, now, s) for rid, s in zip(request_ids, values,
                                                                   strict=False) if rid]
            self._scores += [(self.mv, s) for s in values[-self.window:]]
            # Bounded while it waits (the file is unusable for a while): the oldest go, counted
            # as evicted at the next write.
            over = len(self._ids) - (2 * self.capacity + self.window)
            if over > 0:
                del self._ids[:over]
                self._dropped += over
            del self._scores[: max(0, len(self._scores) - self.window)]

    def write(self, db: sqlite3.Connection, now: float) -> None:
        """This version's waiting predictions and its eviction, inside the caller's
        transaction."""
        with self._lock:
            ids, scores, dropped = self._ids, self._scores, self._dropped
            self._ids, self._scores, self._dropped = [], [], 0
        try:
            mv = self.mv
            db.executemany("INSERT OR REPLACE INTO pending VALUES (?, ?, ?, ?)", ids)
            db.executemany("INSERT INTO recent(mv, score) VALUES (?, ?)", scores)
            db.execute(_TRIM.format(table="recent"), (mv, self.window))
            cutoff = now - self.ttl_s
            db.execute("INSERT OR REPLACE INTO gone SELECT mv, rid, ? FROM pending "
                       "WHERE mv = ? AND t < ?", (now, mv, cutoff))
            evicted = db.execute("DELETE FROM pending WHERE mv = ? AND t < ?",
                                 (mv, cutoff)).rowcount
            over = db.execute("SELECT count(*) FROM pending WHERE mv = ?",
                              (mv,)).fetchone()[0] - self.capacity
            if over > 0:
                oldest = "SELECT rowid FROM pending WHERE mv = ? ORDER BY t LIMIT ?"
                db.execute(f"INSERT OR REPLACE INTO gone SELECT mv, rid, ? FROM pending "
                           f"WHERE rowid IN ({oldest})", (now, mv, over))
                evicted += db.execute(f"DELETE FROM pending WHERE rowid IN ({oldest})",
                                      (mv, over)).rowcount
            gone_over = db.execute("SELECT count(*) FROM gone WHERE mv = ?",
                                   (mv,)).fetchone()[0] - self.capacity
            if gone_over > 0:
                db.execute("DELETE FROM gone WHERE rowid IN (SELECT rowid FROM gone WHERE "
                           "mv = ? ORDER BY t LIMIT ?)", (mv, gone_over))
            if evicted + dropped:
                db.execute(_COUNT, (mv, "evicted", evicted + dropped))
        except BaseException:
            with self._lock:  # not written: they wait for the next flush (still bounded)
                self._ids[:0], self._scores[:0] = ids, scores
                self._dropped += dropped
            raise

    def join(self, request_ids: list[str], labels: list[float]) -> list[int]:
        def run(db: sqlite3.Connection) -> list[int]:
            mv, out, pairs, now = self.mv, [], [], time.time()
            for rid, label in zip(request_ids, labels, strict=True):
                row = db.execute("DELETE FROM pending WHERE mv = ? AND rid = ? RETURNING score",
                                 (mv, rid)).fetchone()
                if row is not None:
                    pairs.append((mv, row[0], float(label)))
                    out.append(JOINED)
                    db.execute("INSERT OR REPLACE INTO done VALUES (?, ?, ?)", (mv, rid, now))
                elif db.execute("SELECT 1 FROM done WHERE mv = ? AND rid = ?",
                                (mv, rid)).fetchone():
                    out.append(DUPLICATE)
                elif db.execute("SELECT 1 FROM gone WHERE mv = ? AND rid = ?",
                                (mv, rid)).fetchone():
                    out.append(LATE)
                else:
                    out.append(UNKNOWN)
            if pairs:
                self._pairs(db, pairs)
                over = db.execute("SELECT count(*) FROM done WHERE mv = ?",
                                  (mv,)).fetchone()[0] - self.capacity
                if over > 0:
                    db.execute("DELETE FROM done WHERE rowid IN (SELECT rowid FROM done WHERE "
                               "mv = ? ORDER BY t LIMIT ?)", (mv, over))
            return out

        return self.backend.transaction(run)  # type: ignore[no-any-return]

    def _pairs(self, db: sqlite3.Connection, pairs: list[tuple[str, float, float]]) -> None:
        db.executemany("INSERT INTO pairs(mv, score, label) VALUES (?, ?, ?)", pairs)
        db.execute(_TRIM.format(table="pairs"), (self.mv, self.window))
        db.execute(_COUNT, (self.mv, "joined", len(pairs)))

    def count_late(self, n: int) -> None:
        self.backend.transaction(lambda db: db.execute(_COUNT, (self.mv, "late", n)))

    def label_score(self, score: float, label: float) -> None:
        self.backend.transaction(lambda db: self._pairs(db, [(self.mv, float(score),
                                                              float(label))]))

    def snapshot(self) -> JoinSnapshot:
        def run(db: sqlite3.Connection) -> JoinSnapshot:
            mv = self.mv
            pairs = db.execute("SELECT score, label FROM pairs WHERE mv = ? ORDER BY id",
                               (mv,)).fetchall()
            recent = db.execute("SELECT score FROM recent WHERE mv = ? ORDER BY id",
                                (mv,)).fetchall()
            pending = db.execute("SELECT count(*) FROM pending WHERE mv = ?",
                                 (mv,)).fetchone()[0]
            counts = dict(db.execute("SELECT name, n FROM counts WHERE mv = ?", (mv,)))
            return JoinSnapshot(np.asarray(pairs, dtype=np.float64).reshape(-1, 2),
                                np.asarray(recent, dtype=np.float64).reshape(-1),
                                int(pending), counts.get("evicted", 0), counts.get("joined", 0),
                                counts.get("late", 0))

        return self.backend.transaction(run, write=False)  # type: ignore[no-any-return]


class SqliteBackend:
    """One connection per process to the shared file; every state's writes go through it."""

    kind = "sqlite"
    shared = True

    def __init__(self, path: str, timeout_ms: float = 2000.0) -> None:
        self.path = path
        self.states: list[SqliteJoin] = []
        self._lock = threading.Lock()
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(path, timeout=timeout_ms / 1000.0, isolation_level=None,
                                      check_same_thread=False)
        except (sqlite3.Error, OSError) as exc:
            raise self._unavailable(exc) from exc
        self._setup()

    def _setup(self) -> None:
        """WAL and the tables. Workers start together: switching the journal mode takes the
        file alone and does not wait for a busy one, so a worker that finds it locked retries."""
        deadline = time.monotonic() + 10.0
        while True:
            try:
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
                self.db.executescript(SCHEMA)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise self._unavailable(exc) from exc
                time.sleep(0.05)
            except sqlite3.Error as exc:
                raise self._unavailable(exc) from exc

    def state(self, model: str, version: str, capacity: int, ttl_s: float,
              window: int) -> SqliteJoin:
        state = SqliteJoin(self, model, version, capacity, ttl_s, window)
        self.states.append(state)
        return state

    def flush(self) -> None:
        now = time.time()

        def run(db: sqlite3.Connection) -> None:
            for state in list(self.states):
                state.write(db, now)

        self.transaction(run)

    def count_unmatched(self, model: str | None, n: int) -> None:
        self.transaction(lambda db: db.execute(_COUNT, ("\x1funmatched", model or "", n)))

    def unmatched(self, model: str) -> int:
        rows = self.transaction(lambda db: db.execute(
            "SELECT sum(n) FROM counts WHERE mv = ? AND name IN (?, '')",
            ("\x1funmatched", model)).fetchone(), write=False)
        return int(rows[0] or 0)

    def leads(self, name: str, ttl_s: float) -> bool:
        """Whether this process holds (or now takes) the lease ``name``; with the file unusable,
        yes: an alert sent twice beats one not sent."""
        owner = f"{os.getpid()}:{id(self)}"

        def run(db: sqlite3.Connection) -> bool:
            now = time.time()
            row = db.execute("SELECT owner, until FROM lease WHERE name = ?", (name,)).fetchone()
            if row is None or row[0] == owner or row[1] < now:
                db.execute("INSERT OR REPLACE INTO lease VALUES (?, ?, ?)",
                           (name, owner, now + ttl_s))
                return True
            return False

        try:
            return bool(self.transaction(run))
        except StoreUnavailable:
            return True

    def transaction(self, fn: Any, write: bool = True) -> Any:
        """``fn(db)`` in one transaction (IMMEDIATE for writes: the write lock is taken at the
        start, so two workers' joins queue rather than deadlock)."""
        with self._lock:
            try:
                self.db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = fn(self.db)
                except BaseException:
                    self.db.execute("ROLLBACK")
                    raise
                self.db.execute("COMMIT")
                return result
            except sqlite3.Error as exc:
                raise self._unavailable(exc) from exc

    def _unavailable(self, exc: Exception) -> StoreUnavailable:
        return StoreUnavailable(
            f"the label join's file {self.path} cannot be used ({type(exc).__name__}: {exc}); "
            "check the disk and monitoring.quality_path, then post the labels again")
