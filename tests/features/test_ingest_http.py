"""HTTP push ingest (POST /v1/events) on a real uvicorn server, and file replay."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pandas as pd
import pytest
import redis
import uvicorn

from redline.features import MemoryStore, load_definitions
from redline.features.ingest import Ingestor, events_asgi_app, replay_file
from redline.features.online.redis import RedisStore
from tests.conftest import free_port

DEFS = Path(__file__).with_name("defs_tx.py")


def _serve(app) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)


@pytest.fixture
def memory_app() -> Iterator[tuple[str, Ingestor]]:
    ing = Ingestor(load_definitions(DEFS), MemoryStore())
    for url in _serve(events_asgi_app(ing, max_body_bytes=64 * 1024)):
        yield url, ing


def test_post_batches_and_bad_events(memory_app) -> None:
    url, ing = memory_app
    now = int(time.time() * 1000)
    good = [{"card_id": f"c{i % 3}", "amount": 2.5, "merchant": f"m{i}", "ts": now}
            for i in range(30)]
    batch = [*good, {"card_id": "c1", "ts": now}, {"card_id": "c1", "amount": "x",
                                                    "merchant": "m", "ts": now}]
    r = httpx.post(f"{url}/v1/events", content=orjson.dumps(batch))
    assert r.status_code == 200
    body = r.json()
    assert body["accepted"] == 30 and body["rejected"] == 2
    assert [e["index"] for e in body["errors"]] == [30, 31]
    assert body["errors"][0]["reason"] == "missing field 'amount'"
    # JSON lines and a single object are accepted too
    lines = b"\n".join(orjson.dumps(e) for e in good[:3])
    assert httpx.post(f"{url}/v1/events", content=lines).json()["accepted"] == 3
    assert httpx.post(f"{url}/v1/events", content=orjson.dumps(good[0])).json()["accepted"] == 1
    reader = ing.store.reader([ing.defs.view("card_stats")], ["card_stats:count_1h"])
    values, _ = reader.read(["c0", "c1", "c2"])
    assert values.sum() == 34
    stats = httpx.get(f"{url}/v1/ingest/stats").json()
    assert stats["accepted"] == 34 and stats["dead_by_reason"] == {"missing": 1, "field": 1}
    assert stats["freshness"]["count"] == 34 and stats["freshness"]["p99_ms"] >= 0


def test_bad_bodies_are_4xx_not_500(memory_app) -> None:
    url, _ = memory_app
    r = httpx.post(f"{url}/v1/events", content=b"[{broken")
    assert r.status_code == 400 and r.json()["code"] == "invalid_input"
    assert "not valid JSON" in r.json()["error"]
    r = httpx.post(f"{url}/v1/events", content=b"")
    assert r.status_code == 400 and "empty body" in r.json()["error"]
    r = httpx.post(f"{url}/v1/events", content=b"[" + b"1," * 40_000 + b"1]")
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
    assert httpx.get(f"{url}/v1/events").status_code == 405
    assert httpx.get(f"{url}/nope").status_code == 404


def test_store_outage_is_503_and_dead_letters_reach_redis(redis_server) -> None:
    store = RedisStore(redis_server.url, timeout_ms=200)
    ing = Ingestor(load_definitions(DEFS), store, dead_stream="ev:dead")
    now = int(time.time() * 1000)
    for url in _serve(events_asgi_app(ing)):
        r = httpx.post(f"{url}/v1/events", content=orjson.dumps(
            [{"card_id": "c1", "amount": 1.0, "merchant": "m", "ts": now}, {"oops": 1}]))
        assert r.status_code == 200
        client = redis.Redis.from_url(redis_server.url)
        (entry,) = client.xrange("ev:dead")
        assert entry[1][b"reason"].startswith(b"missing field 'ts'")
        redis_server.kill()
        r = httpx.post(f"{url}/v1/events", content=orjson.dumps(
            [{"card_id": "c1", "amount": 1.0, "merchant": "m", "ts": now}]))
        assert r.status_code == 503 and r.json()["code"] == "store_unavailable"


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_file_replay(tmp_path: Path, fmt: str) -> None:
    t0 = 1_767_225_600_000
    rows = [{"card_id": f"c{i % 2}", "amount": float(i), "merchant": f"m{i % 4}", "ts": t0 + i}
            for i in range(100)]
    path = tmp_path / f"events.{fmt}"
    if fmt == "jsonl":
        path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n{bad\n")
    elif fmt == "csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    else:
        pd.DataFrame(rows).to_parquet(path)
    ing = Ingestor(load_definitions(DEFS), MemoryStore())
    res = replay_file(ing, path, batch=30)
    assert res.accepted == 100
    assert len(res.rejected) == (1 if fmt == "jsonl" else 0)
    reader = ing.store.reader([ing.defs.view("card_stats")],
                              ["card_stats:count_1h", "card_stats:amount_sum_1h"])
    values, _ = reader.read(["c0", "c1"], t0 + 100, dtype=float)
    assert values.tolist() == [[50, sum(range(0, 100, 2))], [50, sum(range(1, 100, 2))]]


def test_body_shapes() -> None:
    from redline.errors import InvalidInput
    from redline.features.ingest import parse_body

    assert parse_body(b'{\n  "card_id": "c1",\n  "ts": 1\n}') == [{"card_id": "c1", "ts": 1}]
    assert len(parse_body(b'{"a": 1}\n{"a": 2}\n{oops\n')) == 3  # the bad line is dead-lettered
    assert parse_body(b"[1]") == [b"1"]
    with pytest.raises(InvalidInput, match="not valid JSON"):
        parse_body(b"{oops")


async def test_pushes_apply_in_arrival_order_and_a_long_queue_is_refused() -> None:
    """``EventPush`` off the loop: one thread applies pushes in the order they came; a push
    that finds ``max_waiting`` others waiting behind the one being written is refused at once
    with a 503-kind error, and nothing of it is applied."""
    import asyncio

    from redline.errors import StoreUnavailable
    from redline.features.ingest import EventPush

    applied: list[str] = []
    gate = threading.Event()

    class SlowIngestor:
        def ingest(self, raws):
            gate.wait(5)
            applied.extend(raws)
            return raws

    push = EventPush(lambda: SlowIngestor(), on_loop=False, max_waiting=2)
    try:
        first = [asyncio.create_task(push.apply([f"e{i}"])) for i in range(3)]
        await asyncio.sleep(0.05)  # all three queued: the first runs, two wait
        with pytest.raises(StoreUnavailable, match="nothing of this one was applied"):
            await push.apply(["refused"])
        gate.set()
        assert await asyncio.gather(*first) == [["e0"], ["e1"], ["e2"]]
        assert await push.apply(["e3"]) == ["e3"]  # the queue emptied: taken again
    finally:
        push.close()
    assert applied == ["e0", "e1", "e2", "e3"]
