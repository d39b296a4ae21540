"""Session item events through ingest: events of source ``session`` on the event stream (a real
``redline ingest redis-stream`` process), in ``POST /v1/events`` or a replayed file go through
the writer ``POST /v1/sessions/{id}/events`` uses, so the next request on any replica sees them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis

from redline.features import load_definitions
from redline.features.ingest import Ingestor
from redline.features.online import MemoryStore
from redline.models import ModelRepository
from redline.serving.predict.session_events import SessionEventWriter
from redline.serving.predict.sessions import MemorySessionStore, SessionItem
from tests.conftest import ingest_redis_stream
from tests.pipeline.conftest import ServerThread, make_settings
from tests.pipeline.graphs import make_graph

ROOT = Path(__file__).resolve().parents[2]


def _session_ids(srv: Any, sid: str) -> list[str]:
    r = httpx.get(f"{srv.http}/v1/sessions/{sid}", timeout=10)
    assert r.status_code == 200, r.text
    return [i["item_id"] for i in r.json()["items"]]


@pytest.mark.slow
def test_a_click_through_the_event_stream_changes_the_next_answer_on_a_server(
        tmp_path: Path, defs_path: Path, redis_server: Any) -> None:
    repo = ModelRepository(tmp_path / "models")
    repo.add_graph("rec", make_graph(tmp_path / "g"))
    srv = ServerThread(make_settings(tmp_path / "models", defs_path, store="redis",
                                     redis_url=redis_server.url)).start()
    try:
        sid = f"stream-{time.monotonic_ns()}"
        before = httpx.post(f"{srv.http}/v1/models/rec/predict", timeout=10,
                            json={"session_id": sid, "request": {}}).json()
        client = redis.Redis.from_url(redis_server.url)
        now = int(time.time() * 1000)
        # a JSON event, a flat one (the stream entry's own fields, no ts_ms: its arrival), a
        # bad one, and a feature event: one stream, one consumer
        client.xadd("ev", {"d": orjson.dumps({"source": "session", "session_id": sid,
                                               "item_id": "i150", "type": "click",
                                               "ts_ms": now})})
        client.xadd("ev", {"source": "session", "session_id": sid, "item_id": "i151",
                           "type": "add_to_cart"})
        client.xadd("ev", {"d": orjson.dumps({"source": "session", "session_id": sid,
                                               "type": "click"})})
        client.xadd("ev", {"d": orjson.dumps({"card_id": "c-stream", "amount": 3.0,
                                               "ts": now})})
        stdout = ingest_redis_stream(defs_path, redis_server.url, "ev", 4, tmp_path)
        stats = json.loads(stdout.strip().splitlines()[-1])
        # two session events and the feature event accepted, the bad one dead
        assert (stats["accepted"], stats["dead"]) == (3, 1), stats
        dead = client.xrange("ev:dead")
        assert len(dead) == 1
        assert dead[0][1][b"reason"].startswith(b"session: event 2: item_id must be")
        # read by the server: newest first, the flat event's time its arrival
        assert _session_ids(srv, sid) == ["i151", "i150"]
        got = httpx.get(f"{srv.http}/v1/sessions/{sid}", timeout=10).json()["items"]
        assert got[0]["type"] == "add_to_cart" and abs(got[0]["ts_ms"] - now) < 60_000
        after = httpx.post(f"{srv.http}/v1/models/rec/predict", timeout=10,
                           json={"session_id": sid, "request": {}}).json()
        ids = [i["item_id"] for i in after["items"]]
        assert ids != [i["item_id"] for i in before["items"]]
        assert "i150" not in ids and "i151" not in ids
        assert all(abs(int(i[1:]) - 150) <= 15 for i in ids), ids
    finally:
        srv.stop()


@pytest.mark.slow
def test_session_events_pushed_to_one_server_are_read_on_another(
        tmp_path: Path, defs_path: Path, redis_server: Any) -> None:
    repo = ModelRepository(tmp_path / "models")
    repo.add_graph("rec", make_graph(tmp_path / "g"))
    a, b = (ServerThread(make_settings(tmp_path / "models", defs_path, store="redis",
                                       redis_url=redis_server.url)).start() for _ in range(2))
    try:
        sid = f"push-{time.monotonic_ns()}"
        lines = b"\n".join(orjson.dumps({"source": "session", "session_id": sid,
                                         "item_id": f"i{k}", "type": "click", "ts_ms": k})
                           for k in (7, 8))
        r = httpx.post(f"{a.http}/v1/events", content=lines, timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["accepted"] == 2 and r.json()["rejected"] == 0
        assert _session_ids(b, sid) == ["i8", "i7"]
        bad = orjson.dumps({"source": "session", "session_id": "x" * 200, "item_id": "i1",
                            "type": "click"})
        r = httpx.post(f"{a.http}/v1/events", content=bad, timeout=10)
        assert r.status_code == 200 and r.json()["rejected"] == 1
        assert "session_id must be a non-empty string" in r.json()["errors"][0]["reason"]
    finally:
        a.stop()
        b.stop()


def test_stream_events_are_checked_like_posted_ones(defs_path: Path) -> None:
    from redline.features.events import EventDecoder

    store = MemorySessionStore(60.0, 20, 10)
    writer = SessionEventWriter(store, catalogue=frozenset({"i1", "i2"}))
    raws = [
        {b"source": b"session", b"session_id": b"s1", b"item_id": b"i1", b"type": b"click",
         b"ts_ms": b"5"},
        orjson.dumps({"source": "session", "session_id": "s1", "item_id": "i9",
                      "type": "click"}),
        orjson.dumps({"source": "session", "session_id": "s1", "item_id": "i2",
                      "type": "click", "colour": "red"}),
        orjson.dumps({"source": "session", "session_id": "s2", "item_id": "i2",
                      "type": "add to cart"}),
        orjson.dumps({"source": "session", "session_id": "s1", "item_id": "i2",
                      "type": "click"}),
    ]
    ing = Ingestor(load_definitions(str(defs_path)), MemoryStore(), sessions=writer)
    res = ing.ingest(raws, arrival_ms=[100] * len(raws))
    assert res.accepted == 2
    reasons = {r.tag: r.reason for r in res.rejected}
    assert reasons[1].startswith("session: event 1: unknown item_id 'i9'")
    assert reasons[2].startswith("session: event 2 has unknown fields ['colour']")
    assert reasons[3].startswith("session: event 3: type must be a word")
    assert store.items("s1") == [SessionItem("i2", "click", 100), SessionItem("i1", "click", 5)]
    assert store.items("s2") == []
    assert ing.stats()["dead_by_reason"] == {"session": 3}
    # the offline builder's decoder leaves session events alone: they are not feature events
    batch = EventDecoder(load_definitions(str(defs_path))).decode(raws[:1], 100)
    assert batch.rejected == [] and batch.ops == [] and len(batch.sessions) == 1


def test_without_a_session_store_session_events_are_dead_letters(defs_path: Path) -> None:
    ing = Ingestor(load_definitions(str(defs_path)), MemoryStore())
    res = ing.ingest([orjson.dumps({"source": "session", "session_id": "s1", "item_id": "i1",
                                    "type": "click"})])
    assert res.accepted == 0 and len(res.rejected) == 1
    assert "no session store" in res.rejected[0].reason


@pytest.mark.slow
def test_a_recommender_without_feature_views_ingests_session_events(
        tmp_path: Path, redis_server: Any) -> None:
    """No definitions anywhere: ingest takes the session events and dead-letters the rest with
    the reason, instead of refusing to start."""
    client = redis.Redis.from_url(redis_server.url)
    sid = f"nodefs-{time.monotonic_ns()}"
    client.xadd("ev", {"source": "session", "session_id": sid, "item_id": "i7",
                       "type": "click", "ts_ms": "1000"})
    client.xadd("ev", {"d": orjson.dumps({"card_id": "c1", "amount": 3.0, "ts": 1000})})
    stdout = ingest_redis_stream(None, redis_server.url, "ev", 2, tmp_path)
    stats = json.loads(stdout.strip().splitlines()[-1])
    assert (stats["accepted"], stats["dead"]) == (1, 1), stats
    reason = client.xrange("ev:dead")[0][1][b"reason"]
    assert b"no feature definitions" in reason, reason
    from redline.serving.predict.sessions import RedisSessionStore

    store = RedisSessionStore(client, redis_server.url)
    assert [i.item_id for i in store.items(sid)] == ["i7"]


@pytest.mark.parametrize("bulk", [True, False])
def test_session_events_in_a_replayed_file_reach_the_session_store(
        tmp_path: Path, defs_path: Path, bulk: bool) -> None:
    """A replayed file's session events go to the writer, next to its feature events, on the
    memory store's bulk path and on the event-by-event one; a bad one is the file's dead letter."""
    from redline.features.ingest import replay_file

    bad = orjson.dumps({"source": "session", "session_id": "s1", "type": "click"})
    lines = [
        orjson.dumps({"source": "session", "session_id": "s1", "item_id": "i1", "type": "click",
                      "ts_ms": 5}),
        orjson.dumps({"card_id": "c1", "amount": 3.0, "ts": 1_767_225_600_000}),
        bad,
        orjson.dumps({"source": "session", "session_id": "s1", "item_id": "i2",
                      "type": "add_to_cart", "ts_ms": 6}),
    ]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    sessions = MemorySessionStore(60.0, 20, 10)
    store = MemoryStore()
    ing = Ingestor(load_definitions(str(defs_path)), store, sessions=SessionEventWriter(sessions))
    res = replay_file(ing, path, bulk=bulk)
    assert res.accepted == 3
    assert [(r.tag, r.raw) for r in res.rejected] == [(2, bad)]
    assert res.rejected[0].reason.startswith("session: event 2: item_id must be")
    assert sessions.items("s1") == [SessionItem("i2", "add_to_cart", 6),
                                    SessionItem("i1", "click", 5)]
    assert any("c1" in key for key in store.data)  # the feature event's tiles
