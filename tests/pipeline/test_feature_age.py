"""Feature age at read: the /v1 features stage observes ``redline_feature_age_seconds``
from the newest event time the store's read returns, on the memory store and on Redis."""

from __future__ import annotations

import re
import time

import httpx
import orjson
import pytest

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast


def _age(text: str) -> tuple[float, float]:
    count = re.search(r'^redline_feature_age_seconds_count\{model="cards"\} (\S+)$', text, re.M)
    total = re.search(r'^redline_feature_age_seconds_sum\{model="cards"\} (\S+)$', text, re.M)
    return (float(count.group(1)) if count else 0.0, float(total.group(1)) if total else 0.0)


def test_the_features_stage_observes_the_age_of_what_it_read(server) -> None:
    newest = int(time.time() * 1000) - 20_000  # the card's newest event is 20 s old
    body = b"\n".join(orjson.dumps({"card_id": "c1", "amount": 5.0, "ts": newest - i * 1000})
                      for i in range(3))
    with httpx.Client(base_url=server.http, timeout=10) as c:
        assert c.post("/v1/events", content=body).status_code == 200
        for _ in range(3):
            r = c.post("/v1/models/cards/predict",
                       json={"entities": {"card_id": "c1"}, "request": {"amount": 1.0}})
            assert r.status_code == 200, r.text
        unseen = c.post("/v1/models/cards/predict",
                        json={"entities": {"card_id": "never-seen"}, "request": {"amount": 1.0}})
        assert unseen.status_code == 200  # no data: no age observed for it
        n, total = _age(c.get("/metrics").text)
    assert n == 3
    assert 19.0 <= total / n < 60.0
