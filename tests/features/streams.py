"""Random event streams with out-of-order, late and future events, shared by the skew tests."""

from __future__ import annotations

import random
from typing import Any

from redline.features import (
    Aggregation,
    Entity,
    EventSource,
    FeatureDefinitions,
    FeatureView,
    agg_max,
    agg_min,
    agg_sum,
    count,
    distinct,
    last,
    mean,
    request_transform,
    stddev,
)

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def definitions() -> FeatureDefinitions:
    card = Entity("card", "card_id")
    tx = EventSource("tx", card, {"card_id": str, "amount": float, "merchant": str, "n": int},
                     allowed_lateness="2m", max_clock_skew="1s")
    view = FeatureView("card_tx", tx, [
        count("1m"), count("5m"),
        agg_sum("amount", "1m"), mean("amount", "5m"), agg_min("amount", "5m"),
        agg_max("amount", "1m"), last("amount", "5m"), stddev("amount", "5m"),
        distinct("merchant", "5m"), agg_sum("n", "5m"),
        Aggregation("mean", "amount", "2m", name="amount_mean_2m_30s", tile="30s", default=-1.0),
    ])

    @request_transform(request=["amount"], features=["card_tx:amount_mean_5m"], default=0.0)
    def amount_ratio(amount, avg):  # type: ignore[no-untyped-def]
        return amount / avg

    return FeatureDefinitions.of([view, amount_ratio])


def event_stream(seed: int, n: int = 1500, cards: int = 6) -> list[dict[str, Any]]:
    """Events in arrival order; ``_arrival_ms`` is when ingest sees them (monotone)."""
    rng = random.Random(seed)
    t = float(T0)
    out = []
    for _ in range(n):
        t += rng.expovariate(1 / 250)
        arrival = int(t)
        u = rng.random()
        if u < 0.70:
            ts = arrival - rng.randint(0, 50)
        elif u < 0.88:
            ts = arrival - rng.randint(1_000, 60_000)  # out of order, within lateness
        elif u < 0.95:
            ts = arrival - rng.randint(120_001, 400_000)  # later than allowed lateness
        else:
            ts = arrival + rng.randint(0, 3_000)  # clock skew: some beyond the 1 s allowed
        amount = round(rng.uniform(-50, 500), rng.choice([0, 2, 6]))
        out.append({"card_id": f"c{rng.randrange(cards)}", "amount": amount,
                    "merchant": f"m{rng.randrange(40)}", "n": rng.randrange(5), "ts": ts,
                    "_arrival_ms": arrival})
    return out


def replay_and_query(store: Any, defs: FeatureDefinitions, events: list[dict[str, Any]],
                     seed: int, queries_per_chunk: int = 2) -> list[tuple[str, int, Any]]:
    """Ingest in arrival order, in random chunks; between chunks read random cards at random
    times before the next arrival. Returns (card, time, float64 row) for every read."""
    from redline.features import EventDecoder

    rng = random.Random(seed + 1)
    decoder = EventDecoder(defs)
    reader = store.reader([defs.view("card_tx")])
    cards = sorted({e["card_id"] for e in events}) + ["never-seen"]
    reads = []
    i = 0
    while i < len(events):
        j = min(len(events), i + rng.randint(1, 60))
        while j < len(events) and events[j]["_arrival_ms"] == events[j - 1]["_arrival_ms"]:
            j += 1  # an arrival millisecond is visible as a whole
        chunk = events[i:j]
        raws = [{k: v for k, v in e.items() if k != "_arrival_ms"} for e in chunk]
        store.write(decoder.decode(raws, [e["_arrival_ms"] for e in chunk]))
        nxt = events[j]["_arrival_ms"] if j < len(events) else chunk[-1]["_arrival_ms"] + 400_000
        for _ in range(queries_per_chunk):
            now = rng.randint(chunk[-1]["_arrival_ms"], max(chunk[-1]["_arrival_ms"], nxt - 1))
            picked = rng.sample(cards, 3)
            values, _missing = reader.read(picked, now, dtype=float)
            for card, row in zip(picked, values, strict=True):
                reads.append((card, now, row))
        i = j
    return reads
