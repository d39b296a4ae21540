"""A session's items: stored newest first, shared by replicas over Redis and Redis Cluster,
nothing lost under concurrent events, expired after the TTL, bad events refused with a 400."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from redline.features.online.redis import connect
from redline.serving.predict.session_events import parse_session_events
from redline.serving.predict.sessions import (
    MemorySessionStore,
    RedisSessionStore,
    SessionItem,
    SessionStore,
)
from tests.pipeline.conftest import make_settings


def _items(n: int, kind: str = "click", start: int = 0) -> list[SessionItem]:
    return [SessionItem(f"i{start + k}", kind, 1_000 + start + k) for k in range(n)]


@pytest.fixture(params=["memory", "redis", "cluster"])
def store_of(request: pytest.FixtureRequest) -> Iterator[Any]:
    """``store_of(ttl_s, max_items)``: a session store of each kind, on a real Redis or Cluster."""
    clients: list[Any] = []

    def make(ttl_s: float = 60.0, max_items: int = 5) -> SessionStore:
        if request.param == "memory":
            return MemorySessionStore(ttl_s, 20, max_items)
        fixture = "redis_server_module" if request.param == "redis" else "redis_cluster"
        server = request.getfixturevalue(fixture)
        client = connect(server.url, cluster=request.param == "cluster", timeout_ms=2000)
        clients.append(client)
        return RedisSessionStore(client, server.url, ttl_s, 20, max_items)

    yield make
    for c in clients:
        c.close()


@pytest.mark.slow
def test_items_newest_first_bounded_and_counted(store_of):
    store = store_of(max_items=5)
    sid = f"s-{time.monotonic_ns()}"
    assert store.items(sid) == []  # unknown session: no items, no error
    store.add_items(sid, _items(3))
    state = store.add_items(sid, _items(4, "add_to_cart", start=3))
    assert state.items == 5
    assert state.counters == {"items": 7.0, "items_click": 3.0, "items_add_to_cart": 4.0}
    got = store.items(sid)
    assert [i.item_id for i in got] == ["i6", "i5", "i4", "i3", "i2"]
    assert got[0] == SessionItem("i6", "add_to_cart", 1_006)
    assert [i.item_id for i in store.items(sid, 2)] == ["i6", "i5"]
    assert store.items(sid, 0) == []
    # a predict request of the same session sees the item counters next to its own
    assert store.update(sid, {"requests": 1.0}).counters["items"] == 7.0
    # ids with braces keep every key of the session on one cluster slot
    odd = "}{a}" + sid
    store.add_items(odd, _items(1))
    assert [i.item_id for i in store.items(odd)] == ["i0"]


@pytest.mark.slow
def test_concurrent_events_lose_nothing(store_of):
    store = store_of(max_items=1000)
    sid = f"c-{time.monotonic_ns()}"
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.add_items(sid, _items(2, start=2 * k)), range(100)))
    assert store.update(sid, {}).counters["items"] == 200.0
    assert sorted(i.ts_ms for i in store.items(sid)) == list(range(1_000, 1_200))


@pytest.mark.slow
def test_items_expire_after_ttl(store_of):
    store = store_of(ttl_s=0.3)
    sid = f"t-{time.monotonic_ns()}"
    store.add_items(sid, _items(2))
    assert len(store.items(sid)) == 2
    time.sleep(0.45)
    assert store.items(sid) == []
    assert store.update(sid, {}).counters == {}


def test_parse_session_events_defaults_ts_to_now():
    one = parse_session_events({"item_id": "i1", "type": "click"}, now_ms=5)
    assert one == [SessionItem("i1", "click", 5)]
    many = parse_session_events([{"item_id": "a", "type": "view", "ts_ms": 1},
                                 {"item_id": "b", "type": "add_to_cart", "ts_ms": 2}])
    assert [i.item_id for i in many] == ["a", "b"]


# ---------------------------------------------------------------------- real servers

@pytest.fixture(scope="module")
def memory_server(tmp_path_factory, trained_repo, defs_path) -> Iterator[Any]:
    import shutil

    from tests.pipeline.conftest import ServerThread

    base = tmp_path_factory.mktemp("items")
    repo = base / "models"
    shutil.copytree(trained_repo, repo)
    catalogue = base / "items.txt"
    catalogue.write_text("i\n" + "".join(f"i{k}\n" for k in range(100)))
    settings = make_settings(repo, defs_path)
    settings.pipeline.session_catalogue = str(catalogue)
    srv = ServerThread(settings).start()
    yield srv
    srv.stop()


BAD_EVENTS = [
    (b'{"item_id": "i1", "type": "click"', "not valid JSON"),
    (b"[]", "no events"),
    (b'"click"', "must be a JSON object"),
    (b'{"item_id": "", "type": "click"}', "item_id must be"),
    (b'{"item_id": 7, "type": "click"}', "item_id must be"),
    (b'{"item_id": "i1"}', "type must be"),
    (b'{"item_id": "i1", "type": "a b"}', "type must be"),
    (b'{"item_id": "i1", "type": "click", "ts_ms": -1}', "ts_ms must be"),
    (b'{"item_id": "i1", "type": "click", "ts_ms": "now"}', "ts_ms must be"),
    (b'{"item_id": "i1", "type": "click", "price": 3}', "unknown fields"),
    (b'[{"item_id": "i1", "type": "click"}, {"item_id": "i2"}]', "event 1"),
    (b'[{"item_id": "i1", "type": "click"}, {"item_id": "x9", "type": "click"}]',
     "event 1: unknown item_id 'x9'"),
]


@pytest.mark.slow
def test_bad_events_are_refused_and_store_nothing(memory_server):
    with httpx.Client(base_url=memory_server.http, timeout=30) as c:
        for body, says in BAD_EVENTS:
            r = c.post("/v1/sessions/bad/events", content=body)
            assert r.status_code == 400, (body, r.text)
            assert says in r.text, (body, r.text)
        assert c.get("/v1/sessions/bad").json()["items"] == []  # the valid first event too
        many = [{"item_id": "i", "type": "click"}] * 1001
        assert c.post("/v1/sessions/bad/events", json=many).status_code == 413
        long_id = "x" * 129
        r = c.post(f"/v1/sessions/{long_id}/events", json={"item_id": "i", "type": "click"})
        assert r.status_code == 400 and "at most 128 characters" in r.text
        assert len(r.content) < 1000  # the answer does not echo the id back whole


def _raw_post(url: str, path_head: bytes, path_len: int, body: bytes) -> bytes:
    """Send a POST whose path is ``path_len`` bytes on a raw socket, in pieces; the server's
    answer (or ``b""`` if it closed the connection) as soon as it comes."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST " + path_head)
        sent = 0
        try:
            while sent < path_len:
                chunk = b"s" * min(65536, path_len - sent)
                sock.sendall(chunk)
                sent += len(chunk)
            sock.sendall(b"/events HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n" % len(body) + body)
        except OSError:
            pass  # refused mid-way: the server stopped reading
        answer = b""
        try:
            while not _complete(answer):
                got = sock.recv(65536)
                if not got:
                    break
                answer += got
        except OSError:
            pass
        return answer


def _complete(answer: bytes) -> bool:
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return len(body) >= length


@pytest.mark.slow
def test_ten_megabyte_session_id_is_refused_fast(memory_server):
    body = b'{"item_id": "i", "type": "click"}'
    answer = _raw_post(memory_server.http, b"/v1/sessions/", 2000, body)
    assert answer.startswith(b"HTTP/1.1 400") and b"at most 128 characters" in answer, answer
    t0 = time.monotonic()
    answer = _raw_post(memory_server.http, b"/v1/sessions/", 10 * 1024 * 1024, body)
    # refused while the request line still arrives (server.max_header_bytes bounds the line and
    # the headers together): the 10 MB are never held whole
    assert answer.startswith(b"HTTP/1.1 431") and b"server.max_header_bytes" in answer, answer
    assert time.monotonic() - t0 < 3
    with httpx.Client(base_url=memory_server.http, timeout=30) as c:
        huge = "s" * (10 * 1024 * 1024)
        doc = {"entities": {"card_id": "s"}, "request": {"amount": 1.0}, "session_id": huge}
        r = c.post("/v1/models/cards/predict", json=doc)
        assert r.status_code in (400, 413) and len(r.content) < 1000, r.text[:200]
        assert c.get("/v2/health/ready").status_code == 200  # the server still serves


@pytest.mark.slow
def test_accessor_reads_items_and_degrades_when_redis_is_down(serve, repo_path, defs_path,
                                                              redis_server):
    """``PredictPipeline.session_items``: newest first; with Redis gone, no items and a reason
    (the request answers degraded), and an event post is a 503 rather than a lost event."""
    settings = make_settings(repo_path, defs_path, store="redis", redis_url=redis_server.url)
    settings.pipeline.breaker_reset_ms = 10_000
    srv = serve(settings)
    pipeline = srv.server.pipeline
    with httpx.Client(base_url=srv.http, timeout=30) as c:
        events = [{"item_id": f"i{k}", "type": "click", "ts_ms": k} for k in range(3)]
        assert c.post("/v1/sessions/acc/events", json=events).status_code == 200
        reasons: list[str] = []
        got = pipeline.session_items("acc", 2, reasons)
        assert [(i.item_id, i.ts_ms) for i in got] == [("i2", 2), ("i1", 1)] and reasons == []
        assert pipeline.session_items("nobody", None, reasons) == [] and reasons == []
        redis_server.kill()
        assert pipeline.session_items("acc", None, reasons) == []
        assert len(reasons) == 1 and "session store unavailable" in reasons[0]
        r = c.post("/v1/sessions/acc/events", json=events[0])
        assert r.status_code == 503 and "unavailable" in r.text


@pytest.mark.slow
@pytest.mark.parametrize("store", ["memory", "redis"])
def test_session_features_online_equal_the_training_set(store, serve, repo_path, defs_path,
                                                        request):
    """Training = serving for sessions: a generated stream of item events is posted to a
    server and, between them, requests read their session; the offline builder, given the
    same events and the requests' times, gives every request the same counters and items."""
    import random

    import pandas as pd

    from redline.features.sessions import build_session_features

    url = request.getfixturevalue("redis_server_module").url if store == "redis" else ""
    settings = make_settings(repo_path, defs_path, store=store, redis_url=url)
    settings.pipeline.session_max_items = 5
    srv = serve(settings)
    rng = random.Random(7)
    run = time.monotonic_ns()
    sessions = [f"gen-{run}-{k}" for k in range(6)]
    t = 1_767_225_600_000
    posted: list[dict[str, Any]] = []
    online: list[dict[str, Any]] = []
    with httpx.Client(base_url=srv.http, timeout=30) as c:
        for _ in range(160):
            sid = rng.choice(sessions)
            batch = []
            for _ in range(rng.choice([1, 1, 1, 2, 3])):
                t += rng.choice([0, 0, 1, 250, 4000])  # ties on time included
                batch.append({"item_id": f"i{rng.randrange(40)}",
                              "type": rng.choice(["view", "view", "click", "add_to_cart"]),
                              "ts_ms": t})
            assert c.post(f"/v1/sessions/{sid}/events", json=batch).status_code == 200
            posted += [{"session_id": sid, **e} for e in batch]
            if rng.random() < 0.4:  # a request of some session, at the time of the last event
                asked = rng.choice(sessions)
                body = {"entities": {"card_id": "g"}, "request": {"amount": 1.0},
                        "session_id": asked}
                doc = c.post("/v1/models/cards/predict", json=body).json()
                items = c.get(f"/v1/sessions/{asked}").json()["items"]
                online.append({"session_id": asked, "ts_ms": t,
                               "counters": doc["session"]["counters"],
                               "items": [i["item_id"] for i in items]})
                t += 1  # the next event comes after the request
    labels = pd.DataFrame([{"session_id": o["session_id"], "ts_ms": o["ts_ms"]} for o in online])
    offline = build_session_features(pd.DataFrame(posted), labels, max_items=5)
    assert len(online) > 40
    for o, (_, row) in zip(online, offline.iterrows(), strict=True):
        for kind in ("view", "click", "add_to_cart"):
            assert row[f"session:items_{kind}"] == o["counters"].get(f"items_{kind}", 0.0)
        assert row["session:items"] == o["counters"].get("items", 0.0)
        assert row["session_items"] == o["items"]


def test_offline_session_features_expire_after_the_ttl_and_name_missing_columns():
    import pandas as pd

    from redline.errors import InvalidInput
    from redline.features.sessions import build_session_features

    events = pd.DataFrame([
        {"session_id": "s", "item_id": "a", "type": "click", "ts_ms": 0},
        {"session_id": "s", "item_id": "b", "type": "view", "ts_ms": 500},
        {"session_id": "s", "item_id": "c", "type": "click", "ts_ms": 5_000},  # after a gap
    ])
    labels = pd.DataFrame({"session_id": ["s", "s", "s", "s", "other"],
                           "ts_ms": [499, 500, 2_000, 5_000, 5_000]})
    got = build_session_features(events, labels, ttl_s=1.0)
    assert got["session_items"].tolist() == [["a"], ["b", "a"], [], ["c"], []]
    assert got["session:items_click"].tolist() == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert got["session:items"].tolist() == [1.0, 2.0, 0.0, 1.0, 0.0]
    with pytest.raises(InvalidInput, match="item_id"):
        build_session_features(events.drop(columns=["item_id"]), labels)


def test_catalogue_files_load_or_say_what_is_wrong(tmp_path):
    import pandas as pd

    from redline.errors import ConfigError
    from redline.serving.predict.session_events import load_catalogue

    (tmp_path / "ids.txt").write_text("a\n\nb\n")
    assert load_catalogue(str(tmp_path / "ids.txt")) == {"a", "b"}
    pd.DataFrame({"item_id": [1, 2], "price": [3.0, 4.0]}).to_csv(tmp_path / "t.csv",
                                                                  index=False)
    assert load_catalogue(str(tmp_path / "t.csv")) == {"1", "2"}
    pd.DataFrame({"id": [1]}).to_parquet(tmp_path / "bad.parquet")
    (tmp_path / "empty.txt").write_text("\n")
    for name, says in (("bad.parquet", "no item_id column"), ("empty.txt", "holds no item ids"),
                       ("absent.txt", "cannot be read")):
        with pytest.raises(ConfigError, match=says):
            load_catalogue(str(tmp_path / name))
