"""Random event streams with out-of-order, late and future events, shared by the skew tests."""

from __future__ import annotations

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


def event_stream(seed: int, n: int = 1500) -> list[dict[str, Any]]:
    """Events in arrival order with out-of-order, late and future ones (``_arrival_ms``)."""
    from redline.features.verify import random_events

    return random_events(definitions().sources["tx"], n, seed, T0, entities=6)


def replay_and_query(store: Any, defs: FeatureDefinitions, events: list[dict[str, Any]],
                     seed: int) -> list[tuple[str, int, Any]]:
    from redline.features.verify import replay_and_read

    return replay_and_read(store, defs, defs.view("card_tx"), events, seed)
