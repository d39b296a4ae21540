"""A store that restarts empty is a visible condition: log, health body, metric; and it clears
by itself once ingest refills the store."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import orjson
import pytest

from redline.serving.entity_loss import EntityLossDetector
from tests.pipeline.conftest import make_settings

CARDS = [f"k{i}" for i in range(20)]


def events(ts: int) -> bytes:
    return b"\n".join(orjson.dumps({"card_id": c, "amount": 30.0, "ts": ts}) for c in CARDS)


@pytest.mark.slow
async def test_redis_restarted_empty_is_reported_and_clears(serve, repo_path, defs_path,
                                                          redis_server, caplog) -> None:
    settings = make_settings(repo_path, defs_path, store="redis", redis_url=redis_server.url)
    settings.features.entity_loss_window_s = 2.0
    settings.features.entity_loss_min_rows = 20
    srv = serve(settings)
    answers: list[dict] = []  # type: ignore[type-arg]
    stop = asyncio.Event()

    async def client(c: httpx.AsyncClient) -> None:
        i = 0
        while not stop.is_set():
            # One request in ten asks for a card nobody has seen: the usual missing share.
            card = CARDS[i % len(CARDS)] if i % 10 else f"new{i}"
            r = await c.post("/v1/models/cards/predict", json={
                "entities": {"card_id": card}, "request": {"amount": 30.0}, "budget_ms": 1000})
            assert r.status_code == 200, r.text
            answers.append(r.json())
            i += 1
            await asyncio.sleep(0.01)

    async def lost(c: httpx.AsyncClient) -> bool:
        body = (await c.get("/v2/health/ready")).json()
        return bool(body["online_store"]["entities_lost"])

    async def wait_lost(c: httpx.AsyncClient, want: bool, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while await lost(c) != want:
            assert time.monotonic() < deadline, f"entities_lost never became {want}"
            await asyncio.sleep(0.05)

    with caplog.at_level(logging.WARNING, logger="redline.serving"):
        async with httpx.AsyncClient(base_url=srv.http, timeout=10) as c:
            assert (await c.post("/v1/events", content=events(int(time.time() * 1000)))
                    ).json()["accepted"] == len(CARDS)
            task = asyncio.create_task(client(c))
            # A baseline (~10% missing) over enough rows to judge a jump against: the rows of
            # the seconds that left the detector's window.
            detector = srv.server.pipeline.entity_loss
            deadline = time.monotonic() + 30
            while detector.baseline is None or (
                    detector._baseline_rows < detector.min_rows):  # noqa: SLF001
                assert time.monotonic() < deadline, detector.as_dict()
                await asyncio.sleep(0.1)
            assert not await lost(c)
            before = len(answers)
            await asyncio.to_thread(redis_server.restart)  # SIGKILL, then up again, empty
            await wait_lost(c, True)
            assert len(answers) > before
            mark = len(answers)
            await asyncio.sleep(0.5)
            after = answers[mark:]
            # What a client sees: every answer missing its entity, none degraded.
            assert after and all(a["entity_missing"] and not a["degraded"] for a in after)
            metrics = (await c.get("/metrics")).text
            assert "redline_online_store_entities_lost 1.0" in metrics
            assert 'redline_entity_rows_total{outcome="missing"}' in metrics
            # Ingest refills the store: the condition clears by itself.
            assert (await c.post("/v1/events", content=events(int(time.time() * 1000)))
                    ).json()["accepted"] == len(CARDS)
            await wait_lost(c, False)
            assert "redline_online_store_entities_lost 0.0" in (await c.get("/metrics")).text
            stop.set()
            await task
    said = [r.getMessage() for r in caplog.records if "online store" in r.getMessage()]
    assert any("lost its data" in m for m in said), said
    assert any("entities found again" in m for m in said), said


def test_the_detector_tells_a_jump_from_a_steady_share() -> None:
    d = EntityLossDetector(window_s=5, min_rows=50, jump=0.3, baseline_half_life_s=60)
    t = 0.0

    def second(rows: int, missing: int) -> bool:
        nonlocal t
        t += 1.0
        d.count(rows, missing)
        return d.update(t)

    # A steady 40% missing (many new entities) is the baseline, not a loss.
    assert not any(second(100, 40) for _ in range(30))
    assert d.baseline is not None and abs(d.baseline - 0.4) < 1e-9
    # Everything missing: a loss once the window holds it...
    assert any(second(100, 100) for _ in range(3))
    assert all(second(100, 100) for _ in range(60))  # ...for as long as it lasts
    # ...and none once the share is back.
    for _ in range(6):
        second(100, 40)
    assert not d.lost
    # Too few rows decide nothing; a store empty from the start has no jump to show.
    fresh = EntityLossDetector(window_s=5, min_rows=50, jump=0.3)
    fresh.count(10, 10)
    assert not fresh.update(1.0)
    for s in range(2, 40):
        fresh.count(100, 100)
        assert not fresh.update(float(s))
