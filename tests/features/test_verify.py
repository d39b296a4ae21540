"""`features verify` on any definitions: the fraud example's (whose schemas omit the join key),
run twice against one Redis without false skew (fresh entity ids per run)."""

from __future__ import annotations

from pathlib import Path

from redline.features import load_definitions
from redline.features.online.redis import RedisStore
from redline.features.verify import verify_store

FRAUD = Path(__file__).resolve().parents[2] / "examples" / "fraud" / "features.py"


def test_verify_fraud_definitions_twice_on_one_redis(redis_server) -> None:
    defs = load_definitions(FRAUD)
    store = RedisStore(redis_server.url)
    for run in range(2):
        reports = verify_store(store, defs, events_per_view=400, seed=0)
        assert set(reports) == set(defs.views)
        for name, rep in reports.items():
            assert rep.values > 100, name
            assert rep.ok, (run, name, rep.mismatches, rep.examples[:2])
